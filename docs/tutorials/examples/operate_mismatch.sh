# A second broker with a short heartbeat, and a worker that beats five times slower
domo broker --bind tcp://127.0.0.1:5556 --heartbeat-interval 0.2 --liveness 3
domo worker echo --connect tcp://127.0.0.1:5556 --heartbeat-interval 1
