"""Submit a durable request, then fetch its reply: the same steps from Python (domo.sync)."""

import sys

import domo.sync
from domo.titanic.sync import TitanicClient

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"

with domo.sync.Client(endpoint, timeout=2.5) as client:
    titanic = TitanicClient(client)
    request_id = titanic.submit("echo", b"stored first")  # on Titanic's disk when it returns
    print("stored as", request_id)

    # ... the program may stop here and come back later with the id ...

    fetched = titanic.wait(request_id, timeout=60)  # fetch, again while pending
    if fetched.done:
        print(fetched.reply()[0].decode())  # a worker's error would raise RemoteError here
        titanic.close(request_id)  # Titanic may forget it now
    else:
        print("gone:", fetched.text)  # unknown: expired, given up, or never stored
