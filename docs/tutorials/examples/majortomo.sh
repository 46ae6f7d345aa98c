# in place of majortomo's broker: majortomo's default interval, liveness 3
domo broker --bind tcp://127.0.0.1:5555 --heartbeat-interval 2.5 --liveness 3
# majortomo's worker as it was, and a domo worker beside it
python majortomo_worker.py tcp://127.0.0.1:5555
domo worker echo --connect tcp://127.0.0.1:5555
# majortomo's client asks both: prints HELLO!, then hello
python majortomo_client.py tcp://127.0.0.1:5555 shout hello
python majortomo_client.py tcp://127.0.0.1:5555 echo hello
# domo's client asks majortomo's worker: prints HI!
domo call shout hi --connect tcp://127.0.0.1:5555
