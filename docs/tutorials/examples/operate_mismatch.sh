# a broker that expects a heartbeat every 0.2 s, and a worker that beats every 1 s
domo broker --bind tcp://127.0.0.1:5556 --heartbeat-interval 0.2 --liveness 3
domo worker echo --connect tcp://127.0.0.1:5556 --heartbeat-interval 1
