"""Endpoint checks: one place that says what a bind or connect address may be, before ZeroMQ.

libzmq takes some wrong addresses without a word: ``tcp://127.0.0.1:99999`` binds port 34463
(the number wraps modulo 65536), ``:-5`` binds 65531, and connecting to an out-of-range port
waits for ever; a missing port is a bare "Invalid argument". ``check_endpoint`` refuses each of
those with a sentence that names the mistake. It reads text only (no I/O, no name lookup).

Accepted forms:

- ``tcp://HOST:PORT``: HOST a name, an IPv4 address or ``[IPv6]`` (``*`` when binding: every
  interface); PORT 1-65535, or, when binding only, ``0`` or ``*`` for a port the system picks.
- ``ipc://PATH``: a non-empty path.
- ``inproc://NAME``: a non-empty name (within one process only).

``EndpointRing`` is the failover order of a client or worker given several brokers (MDP-D-28).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BIND_SCHEMES", "CONNECT_SCHEMES", "EndpointError", "EndpointRing", "check_endpoint"]

BIND_SCHEMES = ("tcp", "ipc", "inproc")
CONNECT_SCHEMES = ("tcp", "ipc", "inproc")
EXAMPLE = "tcp://127.0.0.1:5555"


class EndpointError(ValueError):
    """An endpoint that ZeroMQ would refuse, or worse, take as some other address."""


def check_endpoint(text: str, *, bind: bool, schemes: Sequence[str] | None = None) -> str:
    """Return ``text`` if it is a usable endpoint to bind (``bind=True``) or connect to.

    ``schemes`` narrows the transports allowed (default: tcp, ipc and inproc). Raises
    ``EndpointError`` with a message that says what is wrong and shows a good example.
    """
    allowed = tuple(schemes) if schemes is not None else (BIND_SCHEMES if bind else CONNECT_SCHEMES)
    scheme, separator, address = text.partition("://")
    if not separator:
        raise EndpointError(f"not an endpoint (e.g. {EXAMPLE}): {text!r}")
    if scheme not in allowed:
        listed = ", ".join(f"{s}://" for s in allowed)
        hint = "; inproc:// works only inside one process" if scheme == "inproc" else ""
        raise EndpointError(f"{text!r}: use {listed}{hint}")
    if not address:
        raise EndpointError(f"{text!r}: nothing after {scheme}://")
    if scheme == "tcp":
        _check_tcp(text, address, bind)
    return text


def _check_tcp(text: str, address: str, bind: bool) -> None:
    host, port = _split_host_port(text, address)
    if not host:
        raise EndpointError(f"{text!r}: no host before the port (e.g. {EXAMPLE})")
    if host == "*" and not bind:
        raise EndpointError(f"{text!r}: '*' (every interface) is for binding; connect to a host")
    if port in ("*", "0"):
        if not bind:
            raise EndpointError(
                f"{text!r}: the port must be from 1 to 65535, got {port} "
                "(a port chosen by the system is for binding only)"
            )
        return
    if not port.isdigit():  # isdigit: no sign, no spaces, no '0x'
        raise EndpointError(f"{text!r}: the port must be a number from 1 to 65535, got {port!r}")
    number = int(port)
    if not 1 <= number <= 65535:
        least = "0 (any free port)" if bind else "1"
        raise EndpointError(f"{text!r}: the port must be from {least} to 65535, got {number}")


def _split_host_port(text: str, address: str) -> tuple[str, str]:
    """HOST and PORT of a tcp address; ``[v6]:port`` keeps its brackets out of HOST."""
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise EndpointError(f"{text!r}: an IPv6 address is written [ADDRESS]:PORT")
        return host, rest[1:]
    host, colon, port = address.rpartition(":")
    if not colon:
        raise EndpointError(f"{text!r}: no port (e.g. {EXAMPLE})")
    return host, port


class EndpointRing:
    """The brokers a client or worker may use, one at a time, in failover order (MDP-D-28).

    ``next()`` gives the endpoint for each new connection: the first, then the one after the
    endpoint last given, round the list. A runtime calls it every time its session gives a
    connection up (the broker lost, a DISCONNECT, a request timed out) and opens a new one, so a
    peer moves on from a broker that stopped answering. With one endpoint, it is always that one.
    """

    __slots__ = ("_next", "endpoints")

    def __init__(self, endpoints: str | Sequence[str]) -> None:
        self.endpoints: tuple[str, ...] = (
            (endpoints,) if isinstance(endpoints, str) else tuple(endpoints)
        )
        if not self.endpoints:
            raise ValueError("at least one endpoint is needed")
        self._next = 0

    def next(self) -> str:
        """The endpoint for the next connection."""
        endpoint = self.endpoints[self._next]
        self._next = (self._next + 1) % len(self.endpoints)
        return endpoint

    def __repr__(self) -> str:
        return f"EndpointRing({list(self.endpoints)!r})"
