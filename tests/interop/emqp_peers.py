"""EventMQ 0.3.13's real peers, run from its own virtualenv by tests/interop/test_eventmq.py.

- ``jobmanager ENDPOINT QUEUES_JSON SLOTS``: EventMQ's JobManager (its worker) with SLOTS job
  processes on the queues given as ``[[weight, name], ...]``, connected to ENDPOINT.
- ``client ENDPOINT QUEUE COUNT [--no-reply] [--timeout S]``: EventMQ's client helpers
  (``Sender`` and ``client.messages.defer_job``) submit COUNT ``emqp_jobs.add(i, i)`` jobs, then
  read what the broker sends back; one JSON line per REPLY on stdout, exit 0 once every job
  has a result (or, with ``--no-reply``, a receipt).
- ``job ENDPOINT QUEUE PATH.CALLABLE ARGS_JSON [TIMEOUT]``: one job with its result, as above
  (with ``timeout:TIMEOUT`` among its headers if TIMEOUT is above 0).

Plain Python for EventMQ's interpreter; it imports no domo code.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import zmq


def jobmanager(endpoint: str, queues: str, slots: str) -> None:
    from eventmq.jobmanager import JobManager

    manager = JobManager(queues=json.loads(queues), concurrent_jobs=int(slots))
    manager.jobmanager_main(broker_addr=endpoint)


def _collect(sender: Any, wanted: dict[str, int], timeout: float, size: int) -> int:
    """Read REPLYs until every msgid in ``wanted`` has one of ``size`` frames (5: a receipt,
    6: a result)."""
    poller = zmq.Poller()
    poller.register(sender.zsocket, zmq.POLLIN)
    while wanted:
        if not poller.poll(int(timeout * 1000)):
            print(json.dumps({"timeout": sorted(wanted)}), flush=True)
            return 1
        frames: list[str] = sender.recv_multipart()
        print(json.dumps(frames), flush=True)
        if frames[2] == "REPLY" and len(frames) == size:
            wanted.pop(frames[-1], None)
    return 0


def client(endpoint: str, queue: str, count: str, *options: str) -> int:
    from eventmq.client.messages import defer_job
    from eventmq.sender import Sender

    reply = "--no-reply" not in options
    timeout = float(options[options.index("--timeout") + 1]) if "--timeout" in options else 30
    sender = Sender()
    sender.connect(endpoint)
    wanted = {}
    for number in range(int(count)):
        msgid = defer_job(
            sender, "emqp_jobs.add", args=[number, number], reply_requested=reply, queue=queue
        )
        wanted[msgid] = number
    return _collect(sender, wanted, timeout, 6 if reply else 5)


def job(endpoint: str, queue: str, name: str, args: str, timeout: str = "0") -> int:
    from eventmq.client.messages import defer_job
    from eventmq.sender import Sender

    sender = Sender()
    sender.connect(endpoint)
    msgid = defer_job(
        sender,
        name,
        args=json.loads(args),
        reply_requested=True,
        queue=queue,
        timeout=int(timeout),  # sent as the header timeout:N when above 0
    )
    # A receipt and a result both end in the msgid: wait for the result (one frame more).
    poller = zmq.Poller()
    poller.register(sender.zsocket, zmq.POLLIN)
    while poller.poll(60 * 1000):
        frames: list[str] = sender.recv_multipart()
        print(json.dumps(frames), flush=True)
        if frames[2] == "REPLY" and frames[-1] == msgid and len(frames) == 6:
            return 0
    return 1


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    roles: dict[str, Any] = {"jobmanager": jobmanager, "client": client, "job": job}
    sys.exit(roles[role](*rest) or 0)
