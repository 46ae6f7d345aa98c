"""A blocking web app (WSGI, as Flask or Django serve) that calls "upper" for each page.

One ``domo.sync.Client`` serves every request thread: up to ``concurrency`` requests are in
flight at once, each on its own socket. Run it with ``python web_app.py BROKER [PORT]`` and
open ``http://127.0.0.1:PORT/?text=hello``.
"""

import contextlib
import sys
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIServer, make_server

import domo
from domo.sync import Client, RemoteError, RequestTimeout

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
client = Client(endpoint, timeout=1.0, retries=1, concurrency=8)


def app(environ, start_response):  # type: ignore[no-untyped-def]
    text = parse_qs(environ.get("QUERY_STRING", "")).get("text", [""])[0]
    try:
        reply = client.request("upper", text.encode())
    except RequestTimeout:  # no worker answered in time, after the retries
        status, body = "504 Gateway Timeout", b"the upper service did not answer\n"
    except RemoteError as error:  # the worker's handler raised
        status, body = "502 Bad Gateway", f"upper failed: {error}\n".encode()
    except domo.DomoError as error:  # anything else domo raises on purpose
        status, body = "503 Service Unavailable", f"{error}\n".encode()
    else:
        status, body = "200 OK", reply[0] + b"\n"
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [body]


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


if __name__ == "__main__":
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
    with client, make_server("127.0.0.1", port, app, ThreadingServer) as server:
        print(f"serving on http://127.0.0.1:{server.server_port}/", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: close the client, then out
            server.serve_forever()
