"""A majortomo worker: unchanged when domo's broker replaces majortomo's.

``python majortomo_worker.py BROKER`` serves "shout" (each frame upper-cased, with "!").
"""

import signal
import sys

import majortomo
from majortomo.error import Disconnected

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
# majortomo counts the heartbeat timeout in seconds: the broker's --liveness x --heartbeat-interval
worker = majortomo.Worker(endpoint, b"shout", heartbeat_interval=2.5, heartbeat_timeout=7.5)
signal.signal(signal.SIGTERM, signal.default_int_handler)
worker.connect()
try:
    while True:
        try:
            client, body = worker.wait_for_request()
        except Disconnected:  # the broker said DISCONNECT (it is stopping): connect again
            worker.connect(reconnect=True)
            continue
        worker.send_reply_final(client, [frame.upper() + b"!" for frame in body])
except KeyboardInterrupt:
    pass
finally:
    worker.close()  # says DISCONNECT to the broker
