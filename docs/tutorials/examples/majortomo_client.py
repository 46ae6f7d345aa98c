"""A majortomo client: unchanged when domo's broker replaces majortomo's.

``python majortomo_client.py BROKER SERVICE FRAME...`` prints each frame of the reply.
"""

import sys

import majortomo

endpoint, service, *frames = sys.argv[1:]
with majortomo.Client(endpoint) as client:
    client.send(service.encode(), *(frame.encode() for frame in frames))
    for frame in client.recv_all_as_list(timeout=5.0):
        print(frame.decode())
