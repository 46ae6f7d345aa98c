"""The pieces the hostile-peer probes (``hostile.py``) are built from: a ``domo broker`` process,
hand-framed peers of every transport, RSS and log readings.

Nothing here imports domo: the broker is the ``domo broker`` command in a process of its own, and
every peer frames its messages by hand (MDP/0.2, DCP and eMQP on pyzmq DEALERs from their specs'
tables; memo01 on pynng req0 sockets with cbor2), so a probe sees what an outside peer sees.
Every process started here is killed by PID; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import zmq

DOMO = [sys.executable, "-m", "domo"]
HERE = Path(__file__).resolve()
ENDPOINT = re.compile(r"listening on (\S+)(.*)")
METRICS = re.compile(r"metrics on (http://\S+/metrics)")
Context = zmq.Context[zmq.Socket[bytes]]

# memo01 (specs/memo01.md, MEMO-01/02): a CBOR array, then the payload.
M_READY, M_JOB, M_RESULT, M_HEARTBEAT, M_DISCONNECT = 1, 2, 3, 4, 5


def memo(kind: int, ident: bytes, *rest: object, payload: bytes = b"") -> bytes:
    """One memo01 message, framed from the spec with cbor2."""
    import cbor2

    return bytes(cbor2.dumps(["memo01", kind, ident, *rest], canonical=True)) + payload


def memo_header(data: bytes) -> list[object]:
    import io

    import cbor2

    header = cbor2.CBORDecoder(io.BytesIO(data)).decode()
    assert isinstance(header, list), header
    return header


def rss_kib(pid: int) -> int:
    """A process's resident set size, KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for NNG endpoints: their ``:0`` is not reported
    reliably by every domo version)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load() -> str:
    """The machine's load average, for the report: the probes share two cores with others."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def p99_ms(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 1 else 0.0


@dataclass
class BrokerProcess:
    """A ``domo broker`` process; its endpoints as printed, its log, its RSS."""

    args: list[str]
    scratch: Path
    process: subprocess.Popen[bytes] | None = None
    endpoints: list[str] = field(default_factory=list)
    claims: dict[str, str] = field(default_factory=dict)  # endpoint -> what follows it
    metrics: str | None = None
    exit_code: int | None = None

    @property
    def log(self) -> Path:
        return self.scratch / "broker.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, time_limit: float = 20.0, *, expect_start: bool = True) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*DOMO, "broker", *self.args], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + time_limit
        wanted = sum(1 for a in self.args if a == "--bind")
        while True:
            text = self.text()
            found = ENDPOINT.findall(text)
            if found and len(found) >= max(1, wanted):
                self.endpoints = [endpoint for endpoint, _ in found]
                self.claims = {endpoint: rest.strip() for endpoint, rest in found}
                if (metrics := METRICS.search(text)) is not None:
                    self.metrics = metrics.group(1)
                return
            if (code := self.process.poll()) is not None:
                self.exit_code = code
                if expect_start:
                    raise RuntimeError(f"the broker exited {code}:\n{text}")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start:\n{text}")
            time.sleep(0.02)

    def endpoint(self, prefix: str) -> str:
        return next(e for e in self.endpoints if e.startswith(prefix))

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def rss(self) -> int:
        return rss_kib(self.pid)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def scrape(self) -> str:
        assert self.metrics is not None
        with urllib.request.urlopen(self.metrics, timeout=5) as response:
            return str(response.read().decode())

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.exit_code = self.process.returncode
        return self.exit_code


@contextlib.contextmanager
def broker(*args: str, expect_start: bool = True) -> Iterator[BrokerProcess]:
    """A ``domo broker`` with ``args`` for the block; stopped (SIGTERM, then SIGKILL) after."""
    with tempfile.TemporaryDirectory(prefix="domo-hostile-") as scratch:
        process = BrokerProcess(list(args), Path(scratch))
        try:
            process.start(expect_start=expect_start)
            yield process
        finally:
            process.stop()


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to put started processes in; each is killed by PID at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def mdp_worker(endpoint: str, service: str = "echo", *extra: str) -> subprocess.Popen[bytes]:
    """``domo worker SERVICE`` as a process: the built-in echo, or ``cat`` for another name."""
    handler = [] if service == "echo" else ["--exec", "cat"]
    return subprocess.Popen(
        [*DOMO, "worker", service, "--connect", endpoint, *handler, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def role(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """This package's ``hostile.py`` in one of its internal roles, as a process."""
    return subprocess.Popen(
        [sys.executable, str(HERE.with_name("hostile.py")), "--role", *args],
        stdout=stdout,
        stderr=subprocess.DEVNULL,
    )


# -- honest clients: sequential requests, every reply checked --------------------------------


def mdp_honest(
    endpoint: str, seconds: float, context: Context, service: bytes = b"echo"
) -> list[float]:
    """Sequential MDP/0.2 requests on one DEALER for ``seconds``; each one's latency."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    latencies: list[float] = []
    try:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            body = b"%d" % n
            n += 1
            sent = time.monotonic()
            socket.send_multipart([b"", b"MDPC02", b"\x01", service, body])
            if not socket.poll(10_000):
                raise RuntimeError("the honest MDP client got no reply within 10 s")
            reply = socket.recv_multipart()
            if reply != [b"", b"MDPC02", b"\x03", service, body]:
                raise RuntimeError(f"wrong reply {reply!r}")
            latencies.append(time.monotonic() - sent)
    finally:
        socket.close(linger=0)
    return latencies


def memo_honest(url: str, seconds: float, service: str = "echo") -> list[float]:
    """Sequential memo01 JOBs on one req0 socket for ``seconds``; each one's latency."""
    import pynng

    latencies: list[float] = []
    with pynng.Req0(dial=url, recv_timeout=10_000, send_timeout=10_000) as socket:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            body = b"%d" % n
            n += 1
            sent = time.monotonic()
            socket.send(memo(M_JOB, b"", service, 10_000, payload=body))
            reply = socket.recv()
            header = memo_header(reply)
            if header[:3] != ["memo01", M_RESULT, b""] or not reply.endswith(body):
                raise RuntimeError(f"wrong memo01 reply {reply!r}")
            latencies.append(time.monotonic() - sent)
    return latencies


def memo_call(
    url: str, service: str, payload: bytes, timeout: float, **tls: object
) -> bytes | None:
    """One memo01 JOB; its RESULT's payload, or None if nothing came within ``timeout``."""
    import pynng

    ms = int(timeout * 1000)
    with pynng.Req0(recv_timeout=ms, send_timeout=ms, **tls) as socket:
        socket.dial(url, block=False)
        try:
            socket.send(memo(M_JOB, b"", service, ms, payload=payload))
            reply = socket.recv()
        except pynng.NNGException:  # no reply in time, or the connection refused (TLS)
            return None
    header = memo_header(reply)
    return reply[len(memo(M_RESULT, b"")) :] if header[1] == M_RESULT else None


class MemoWorker(threading.Thread):
    """A memo01 worker on one req0 context, in a thread: READY, then echo every JOB's payload
    (recording it), answer HEARTBEATs; stops at ``stop``."""

    def __init__(self, url: str, services: list[str], **tls: object) -> None:
        super().__init__(daemon=True)
        import pynng

        self.services = sorted(services, key=lambda name: (len(name.encode()), name.encode()))
        self.socket = pynng.Req0(send_timeout=5000, resend_time=-1, **tls)
        self.socket.dial(url, block=False)
        self.jobs: list[bytes] = []
        self.heard: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        import pynng

        context = self.socket.new_context()
        request = memo(M_READY, b"", self.services)
        try:
            while not self.stopping.is_set():
                context.send(request)
                data = context.recv()  # until a message comes or ``close`` closes the socket
                header = memo_header(data)
                kind = header[1]
                self.heard.append(int(kind))  # type: ignore[call-overload]
                ident = header[2]
                assert isinstance(ident, bytes)
                if kind == M_JOB:
                    payload = data[len(memo(M_JOB, ident, *header[3:])) :]
                    self.jobs.append(payload)
                    request = memo(M_RESULT, ident, payload=payload)
                elif kind == M_HEARTBEAT:
                    request = memo(M_HEARTBEAT, ident)
                else:
                    request = memo(M_READY, b"", self.services)
        except pynng.NNGException:  # closed by ``close``, or refused by the broker (TLS)
            return
        finally:
            with contextlib.suppress(pynng.Closed):
                context.close()

    def close(self) -> None:
        self.stopping.set()
        self.socket.close()
        self.join(timeout=5)


# -- junk: what broken or hostile peers send, per dialect ------------------------------------

ZMQ_JUNK: dict[str, list[list[bytes]]] = {
    "mdp": [
        [b"", b"MDPC02"],  # no command
        [b"", b"MDPC02", b"\x09", b"echo"],  # unknown command
        [b"", b"MDPX99", b"\x01", b"echo", b"x"],  # unknown protocol header
        [b"", b"MDPW02", b"\x03", b"not-a-client"],  # a FINAL from a peer that never sent READY
        [b"garbage"],  # no empty delimiter
        [b"", b"MDPC02", b"\x01"],  # REQUEST with no service
        [b""],
    ],
    "dcp": [
        [b"", b"DGBX\x02", b"\x04", b"echo", b"", b"", b"x"],  # another version (DCP-01)
        [b"", b"DGBX", b"\x04"],  # a short header
        [b"", b"DGBX\x01", b"\x09"],  # an unknown type
        [b"", b"DGBX\x01", b"\x05", b"nobody", b"x"],  # a reply from a stranger
        [b"", b"DGBX\x01", b"\x04"],  # a request with no service
    ],
    "emqp": [
        [b"", b"eMQP/1.0", b"BOGUS", b"m1"],  # an unknown command
        [b"", b"eMQP/1.0", b"REQUEST"],  # a REQUEST without its parts
        [b"", b"eMQP/1.0", b"REPLY", b"m1", b"x", b"y"],  # a REPLY from a stranger
        [b"", b"eMQP/9.9", b"REQUEST", b"m1", b"q", b"", b"{}"],  # another version
        [b"", b"eMQP/1.0", b"READY", b"r1", b"extra", b"frames"],  # READY of the wrong shape
    ],
}
MEMO_JUNK: list[bytes] = [
    b"not cbor at all",
    b"\x83\x66memo01\x09\x40",  # an unknown type
    b"\x82\x66memo01\x02",  # an array too short
    b"\x84\x66memo02\x01\x40\x80",  # another version
    b"\x85\x66memo01\x02\x40\x64echo\x00",  # a JOB with a zero timeout (MEMO-04)
]


def flood_zmq(endpoint: str, dialect: str, seconds: float) -> int:
    """Send ``dialect``'s junk as fast as one DEALER takes it; the number sent."""
    context: Context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 1000)
    socket.connect(endpoint)
    sent = 0
    end = time.monotonic() + seconds
    junk = ZMQ_JUNK[dialect]
    try:
        while time.monotonic() < end:
            for frames in junk:
                try:
                    socket.send_multipart(frames, flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    socket.poll(10, zmq.POLLOUT)
            while socket.poll(0):  # drain what the broker answers
                socket.recv_multipart()
    finally:
        socket.close(linger=0)
        context.term()
    return sent


def flood_memo(url: str, seconds: float) -> int:
    """Send memo01 junk on fresh req0 contexts as fast as NNG takes it; the number sent."""
    import pynng

    sent = 0
    end = time.monotonic() + seconds
    with pynng.Req0(dial=url, send_timeout=1000, resend_time=-1) as socket:
        while time.monotonic() < end:
            for data in MEMO_JUNK:
                context = socket.new_context()
                try:
                    context.send(data)
                    sent += 1
                except pynng.NNGException:  # the broker closed the pipe, or is slow: go on
                    pass
                finally:
                    context.close()
    return sent
