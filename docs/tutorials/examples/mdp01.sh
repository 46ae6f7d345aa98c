# the broker: nothing to configure for MDP/0.1 peers
domo broker --bind tcp://127.0.0.1:5555
# an MDP/0.1 worker for "lower", and a domo worker for "echo", side by side
python mdp01_worker.py tcp://127.0.0.1:5555
domo worker echo --connect tcp://127.0.0.1:5555
# the MDP/0.1 client asks both
python mdp01_client.py tcp://127.0.0.1:5555 echo hello world    # prints hello, world
python mdp01_client.py tcp://127.0.0.1:5555 lower HELLO         # prints hello
# and domo's client asks the MDP/0.1 worker
domo call lower SHOUT --connect tcp://127.0.0.1:5555            # prints shout
