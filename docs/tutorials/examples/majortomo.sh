# the broker, in place of majortomo's (heartbeats as majortomo's workers above: 2.5 s, 3 x 2.5 s)
domo broker --bind tcp://127.0.0.1:5555 --heartbeat-interval 2.5 --liveness 3
# majortomo's worker, as it was, and a domo worker beside it
python majortomo_worker.py tcp://127.0.0.1:5555
domo worker echo --connect tcp://127.0.0.1:5555
# majortomo's client asks both
python majortomo_client.py tcp://127.0.0.1:5555 shout hello    # prints HELLO!
python majortomo_client.py tcp://127.0.0.1:5555 echo hello     # prints hello
# and domo's client asks majortomo's worker
domo call shout hi --connect tcp://127.0.0.1:5555              # prints HI!
