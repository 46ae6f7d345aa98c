domo broker --bind tcp://127.0.0.1:5555
# an MDP/0.1 worker for "lower", and a domo worker for "echo"
python mdp01_worker.py tcp://127.0.0.1:5555
domo worker echo --connect tcp://127.0.0.1:5555
# the MDP/0.1 client asks both: prints hello, world; then hello
python mdp01_client.py tcp://127.0.0.1:5555 echo hello world
python mdp01_client.py tcp://127.0.0.1:5555 lower HELLO
# domo's client asks the MDP/0.1 worker: prints shout
domo call lower SHOUT --connect tcp://127.0.0.1:5555
