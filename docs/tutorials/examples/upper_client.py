"""A client: one request to "upper" through the broker; prints the reply's frames."""

import sys

import domo

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
reply = domo.call(endpoint, "upper", b"hello", b"world", timeout=2.5, retries=3)
for frame in reply:
    print(frame.decode())
