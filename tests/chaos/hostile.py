"""Hostile and careless peers against ``domo broker``, one probe per promise (issue 27).

Each probe starts a real ``domo broker`` process on loopback, does to it what a hostile or
careless peer would, and returns what it measured, with ``ok`` saying whether the promise in
``docs/reliability.md`` or ``docs/security.md`` held. ``--long`` is the form ``nox -s chaos``
runs (floods of a minute, more repetitions); without it, the short form CI's tests run
(``test_hostile.py``). ``python tests/chaos/hostile.py --help``.

Probes (the issue's findings in brackets):

- ``auth`` [1]: under CURVE, a memo01 (NNG) endpoint is refused unless it is TLS with an
  allow-list of client certificates; a keyless or unlisted peer is never served nor given a body;
  the startup line claims for each endpoint only what covers it.
- ``nng_size`` [2]: an NNG message over ``--max-message-bytes`` is not taken in.
- ``memo_refused`` [2]: distinct memo01 JOBs refused at a byte bound leave nothing behind.
- ``client_queue`` [3]: one client of each dialect that allows several requests (DCP, eMQP,
  MDP/0.1 on a DEALER) queues them for a service nobody serves: RSS, held bytes (``dcp_queue``:
  DCP alone, as the issue found it).
- ``ready_flood`` [3]: memo01 READYs of 256 names: the log's growth, an honest client's rate.
- ``memo_kill`` [4]: a busy memo01 worker SIGKILLed: how long until its job is served again.
- ``sighup`` [5]: SIGHUP with and without ``--curve-allow-file``: the broker lives and says so.
- ``fairness`` [6]: an honest client of each transport under each dialect's junk flood.
- ``labels`` [7]: 1,024 service names READYed by keyless peers, then a real worker's label.
- ``blame`` [8]: malformed memo01 input is logged as the peer's doing.
- ``drain`` [9]: ``--drain`` on SIGTERM finishes the request in flight, then exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``tests.chaos`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import zmq

from tests.chaos.hostile_peers import (
    M_JOB,
    M_READY,
    BrokerProcess,
    Context,
    MemoWorker,
    broker,
    flood_memo,
    flood_zmq,
    load,
    mdp_honest,
    mdp_worker,
    memo,
    memo_call,
    memo_honest,
    p99_ms,
    processes,
    role,
)

Result = dict[str, Any]
BEATS = ["--heartbeat-interval", "0.2", "--liveness", "3"]  # a lost peer shows in 0.6 s
TCP = ["--bind", "tcp://127.0.0.1:0"]


def nng(scheme: str = "tcp") -> list[str]:
    """``--bind`` for an NNG endpoint on a port the system picks (``scheme``: tcp or tls+tcp);
    the broker prints the port it got."""
    return ["--bind", f"nng+{scheme}://127.0.0.1:0"]


def _url(process: BrokerProcess) -> str:
    return process.endpoint("nng+").removeprefix("nng+")


def _until(condition: Callable[[], bool], limit: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def _mdp_request(
    endpoint: str, service: bytes, body: bytes, timeout: float, context: Context, **curve: bytes
) -> list[bytes] | None:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    for name, value in curve.items():
        setattr(socket, name, value)
    socket.connect(endpoint)
    try:
        socket.send_multipart([b"", b"MDPC02", b"\x01", service, body])
        if not socket.poll(int(timeout * 1000)):
            return None
        return socket.recv_multipart()
    finally:
        socket.close(linger=0)


def _has_option(option: str) -> bool:
    from tests.chaos.hostile_peers import DOMO

    done = subprocess.run([*DOMO, "broker", "--help"], capture_output=True, timeout=60)
    return option in done.stdout.decode()


# -- [1] authentication on every endpoint -----------------------------------------------------


def probe_auth(long: bool = False) -> Result:
    """Finding 1: CURVE on, memo01 peers without a key or certificate; see the module doc."""
    import tempfile

    import zmq.auth

    result: Result = {}
    with tempfile.TemporaryDirectory(prefix="domo-keys-") as keys_dir:
        keys = Path(keys_dir)
        zmq.auth.create_certificates(keys_dir, "broker")
        zmq.auth.create_certificates(keys_dir, "app")
        app_public, app_secret = zmq.auth.load_certificate(keys / "app.key_secret")
        broker_public, _ = zmq.auth.load_certificate(keys / "broker.key")
        (keys / "allowed").write_bytes(app_public + b"  # app\n")
        curve = [
            "--curve-secret-file",
            str(keys / "broker.key_secret"),
            "--curve-allow-file",
            str(keys / "allowed"),
        ]
        client_curve = {
            "curve_serverkey": broker_public,
            "curve_publickey": app_public,
            "curve_secretkey": app_secret or b"",
        }
        # A plain NNG endpoint under CURVE: refused at start, or its peers served keyless.
        with broker(*TCP, *nng(), *curve, *BEATS, expect_start=False) as process:
            if process.exit_code is not None:
                result["plain_nng_under_curve"] = "refused to start"
                result["refusal"] = process.text().strip().splitlines()[-1:]
                result["plain_refused"] = process.exit_code == 2
            else:
                result["plain_nng_under_curve"] = "started"
                result["plain_refused"] = False
                result["claims"] = process.claims
                result.update(_keyless_memo01(process, client_curve, "keyless"))
        if _has_option("--nng-tls-allow-file"):
            result.update(_tls_probe(keys, curve, client_curve))
        else:
            result["tls"] = "no --nng-tls-allow-file option"
    result["ok"] = (
        result.get("plain_refused", False)
        and result.get("tls_listed_served") is True
        and not result.get("tls_keyless_served", True)
        and not result.get("tls_unlisted_served", True)
        and not result.get("tls_keyless_worker_got_body", True)
        and result.get("tls_claims_ok") is True
        and result.get("tls_reload_admits_the_new") is True
        and result.get("tls_reload_shuts_the_old_out") is True
    )
    return result


def _keyless_memo01(
    process: BrokerProcess, client_curve: dict[str, bytes], label: str, **tls: Any
) -> Result:
    """A memo01 worker and client without credentials, and a CURVE client's body."""
    out: Result = {}
    url = _url(process)
    worker = MemoWorker(url, ["secret"], **tls)
    worker.start()
    context: Context = zmq.Context()
    try:
        _until(lambda: bool(worker.heard) or "serves 'secret'" in process.text(), 1.0)
        reply = _mdp_request(
            process.endpoint("tcp://"), b"secret", b"confidential", 1.5, context, **client_curve
        )
        out[f"{label}_worker_got_body"] = b"confidential" in worker.jobs
        out[f"{label}_curve_client_answered"] = reply is not None
        served = memo_call(url, "secret", b"from a keyless client", 1.0, **tls)
        out[f"{label}_served"] = served is not None
    finally:
        worker.close()
        context.destroy(linger=0)
    return out


def make_certificate(directory: Path, name: str) -> tuple[str, str]:
    """A self-signed certificate for ``name`` and its key (PEM), written as NAME.crt, NAME.key
    and NAME.pem (both, what ``--nng-tls-cert`` takes)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    (directory / f"{name}.crt").write_text(cert_pem)
    (directory / f"{name}.key").write_text(key_pem)
    (directory / f"{name}.pem").write_text(cert_pem + key_pem)
    return cert_pem, key_pem


def tls_client(directory: Path, name: str | None) -> Any:
    """A pynng client TLS config that trusts the broker's certificate, with ``name``'s own."""
    import pynng

    options: dict[str, Any] = {
        "ca_string": (directory / "localhost.crt").read_text(),
        "server_name": "localhost",
    }
    if name is not None:
        options["own_cert_string"] = (directory / f"{name}.crt").read_text()
        options["own_key_string"] = (directory / f"{name}.key").read_text()
    return pynng.TLSConfig(pynng.TLSConfig.MODE_CLIENT, **options)


def _tls_probe(keys: Path, curve: list[str], client_curve: dict[str, bytes]) -> Result:
    out: Result = {}
    make_certificate(keys, "localhost")  # the broker's
    make_certificate(keys, "alice")  # a listed peer
    make_certificate(keys, "mallory")  # a peer with a certificate nobody listed
    (keys / "peers.crt").write_text((keys / "alice.crt").read_text())
    tls = [
        "--bind",
        "nng+tls+tcp://127.0.0.1:0",
        "--nng-tls-cert",
        str(keys / "localhost.pem"),
        "--nng-tls-allow-file",
        str(keys / "peers.crt"),
    ]
    with broker(*TCP, *tls, *curve, *BEATS) as process:
        out["tls_claims"] = process.claims
        out["tls_claims_ok"] = all(
            ("CURVE" in claim) == endpoint.startswith("tcp://")
            and ("TLS" in claim) == endpoint.startswith("nng+")
            for endpoint, claim in process.claims.items()
        )
        out.update(
            _keyless_memo01(process, client_curve, "tls_keyless", tls_config=tls_client(keys, None))
        )
        out.update(
            _keyless_memo01(
                process, client_curve, "tls_unlisted", tls_config=tls_client(keys, "mallory")
            )
        )
        url = _url(process)
        worker = MemoWorker(url, ["secret"], tls_config=tls_client(keys, "alice"))
        worker.start()
        try:
            _until(lambda: "serves 'secret'" in process.text(), 5.0)
            served = memo_call(url, "secret", b"listed", 5.0, tls_config=tls_client(keys, "alice"))
            out["tls_listed_served"] = served == b"listed"
        finally:
            worker.close()
        # SIGHUP re-reads the allow-list: mallory in, alice out, from the next connection on.
        (keys / "peers.crt").write_text((keys / "mallory.crt").read_text())
        process.signal(signal.SIGHUP)
        _until(lambda: "NNG TLS allow-list reloaded" in process.text(), 5.0)
        worker = MemoWorker(url, ["secret"], tls_config=tls_client(keys, "mallory"))
        worker.start()
        try:
            _until(lambda: process.text().count("serves 'secret'") >= 2, 5.0)
            served = memo_call(url, "secret", b"now", 5.0, tls_config=tls_client(keys, "mallory"))
            out["tls_reload_admits_the_new"] = served == b"now"
            gone = memo_call(url, "secret", b"gone", 1.0, tls_config=tls_client(keys, "alice"))
            out["tls_reload_shuts_the_old_out"] = gone is None
        finally:
            worker.close()
    return out


# -- [5] SIGHUP ----------------------------------------------------------------------------------


def probe_sighup(long: bool = False) -> Result:
    """Finding 5: SIGHUP to a broker with and without an allow-list."""
    import tempfile

    import zmq.auth

    result: Result = {}
    with broker(*TCP) as process:
        process.signal(signal.SIGHUP)
        time.sleep(1.0)
        result["plain_alive"] = process.alive()
        result["plain_exit"] = process.process.poll() if process.process else None
        result["plain_logged"] = "SIGHUP" in process.text()
    with tempfile.TemporaryDirectory(prefix="domo-keys-") as keys_dir:
        zmq.auth.create_certificates(keys_dir, "broker")
        allowed = Path(keys_dir) / "allowed"
        allowed.write_text("")
        curve = [
            "--curve-secret-file",
            f"{keys_dir}/broker.key_secret",
            "--curve-allow-file",
            str(allowed),
        ]
        with broker(*TCP, *curve) as process:
            process.signal(signal.SIGHUP)
            time.sleep(1.0)
            result["curve_alive"] = process.alive()
            result["curve_logged"] = "reloaded" in process.text()
    result["ok"] = all(
        result[k] for k in ("plain_alive", "plain_logged", "curve_alive", "curve_logged")
    )
    return result


# -- [8] blame ---------------------------------------------------------------------------------


def probe_blame(long: bool = False) -> Result:
    """Finding 8: memo01 garbage at the NNG endpoint; who the log blames."""
    with broker(*TCP, *nng()) as process:
        flood_memo(_url(process), 0.3)
        _until(lambda: "MEMO-" in process.text(), 3.0)
        text = process.text()
    lines = [line for line in text.splitlines() if "MEMO-" in line]
    blamed_broker = [line for line in lines if "the broker broke" in line]
    return {
        "lines": len(lines),
        "blaming_the_broker": len(blamed_broker),
        "example": (lines[:1] or [""])[0][-160:],
        "ok": bool(lines) and not blamed_broker,
    }


# -- [7] metric labels -------------------------------------------------------------------------


def probe_labels(long: bool = False) -> Result:
    """Finding 7: keyless memo01 READYs of 256 names each, then a real worker for 'payments'."""
    result: Result = {}
    with (
        broker(*TCP, *nng(), *BEATS, "--metrics", "127.0.0.1:0") as process,
        processes() as started,
    ):
        url = _url(process)
        squatters = []
        for batch in range(4):
            names = [f"squat-{batch}-{n:03d}" for n in range(256)]
            squatter = MemoWorker(url, names)
            squatter.start()
            squatters.append(squatter)
        try:
            _until(lambda: _squat_workers(process.scrape()) >= 1024, 10.0)
            started.append(mdp_worker(process.endpoint("tcp://"), "payments", *BEATS))
            _until(lambda: "serves 'payments'" in process.text(), 10.0)
            time.sleep(0.3)
            scraped = process.scrape()
            result["payments_labelled"] = 'service="payments"' in scraped
            result["squat_labels"] = len(set(re.findall(r'service="(squat-[^"]+)"', scraped)))
            result["series"] = sum(1 for line in scraped.splitlines() if line.startswith("domo_"))
        finally:
            for squatter in squatters:
                squatter.close()
        # Once the squatters are gone, nothing of theirs is counted as a worker any more.
        _until(lambda: _squat_workers(process.scrape()) == 0, 10.0)
        result["squat_workers_after_they_left"] = _squat_workers(process.scrape())
    result["ok"] = result["payments_labelled"] and result["squat_workers_after_they_left"] == 0
    return result


def _squat_workers(scraped: str) -> float:
    """The squatters' workers still counted: under their labels or ``(none)``."""
    pattern = r'^domo_workers\{service="(?:squat-[^"]+|\(none\))",state="\w+"\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, scraped, re.M))


# -- [2] the NNG receive size and refused JOBs --------------------------------------------------


def probe_nng_size(long: bool = False) -> Result:
    """Finding 2: 64 MiB memo01 messages at a broker whose --max-message-bytes is 1 MiB."""
    import pynng

    count = 8 if long else 3
    with broker(*TCP, *nng(), "--max-message-bytes", "1M", "--max-peer-bytes", "4M") as process:
        start = process.rss()
        peak = start
        with pynng.Req0(send_timeout=5000, resend_time=-1) as socket:
            socket.dial(_url(process), block=False)
            for number in range(count):
                context = socket.new_context()
                with contextlib.suppress(pynng.NNGException):  # the broker closed the pipe
                    context.send(
                        memo(M_JOB, b"", "echo", 1000, payload=bytes([number]) * (64 << 20))
                    )
                context.close()
                time.sleep(0.3)
                peak = max(peak, process.rss())
        time.sleep(1.0)
        after = process.rss()
        alive = process.alive()
    return {
        "messages": count,
        "rss_start_mib": round(start / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "alive": alive,
        "ok": alive and peak - start < 16 * 1024,
    }


def probe_memo_refused(long: bool = False) -> Result:
    """Finding 2: distinct memo01 JOBs refused at --max-held-bytes (no worker for them)."""
    import pynng

    count = 100 if long else 30
    size = 3 << 20
    # One 3 MiB JOB fits the held bytes with its REQUEST_OVERHEAD (MDP-D-26), a second does not.
    args = ["--max-message-bytes", "4M", "--max-peer-bytes", "16M", "--max-held-bytes", "5M"]
    with broker(*TCP, *nng(), *args) as process:
        start = process.rss()
        with pynng.Req0(send_timeout=5000, resend_time=-1) as socket:
            socket.dial(_url(process), block=False)
            contexts = []
            for number in range(count):
                context = socket.new_context()
                context.send(
                    memo(
                        M_JOB,
                        b"",
                        "nobody",
                        60_000,
                        payload=bytes([number % 256]) * size + b"%d" % number,
                    )
                )
                contexts.append(context)
            _until(lambda: process.text().count("refused") >= count - 1, 20.0)
            time.sleep(1.0)
            peak = process.rss()
            for context in contexts:
                context.close()
        time.sleep(2.5)  # a malloc_trim round
        after = process.rss()
        refused = process.text().count("RequestRefused")
    grown = (after - start) / 1024
    return {
        "jobs": count,
        "job_mib": size >> 20,
        "refused_logged": refused,
        "rss_start_mib": round(start / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "ok": grown < 16 and peak - start < 32 * 1024,
    }


# -- [3] one well-formed peer ------------------------------------------------------------------


# One client's requests for a service nobody serves, as fast as a DEALER takes them, by dialect:
# each a request of its own to the broker (the dialects that allow several per client).
CLIENT_FLOODS: dict[str, Callable[[int], list[bytes]]] = {
    "dcp": lambda n: [b"", b"DGBX\x01", b"\x04", b"nobody", b"", b"r%d" % n, b"", b"x" * 16],
    "emqp": lambda n: [
        b"",
        b"eMQP/1.0",
        b"REQUEST",
        b"m%d" % n,
        b"nobody",
        b"reply-requested",
        b'["run", {"path": "jobs", "callable": "add", "args": [1, 2]}]',
    ],
    "mdp01": lambda n: [b"", b"MDPC01", b"nobody", b"x%d" % n],
}


def probe_client_queue(
    long: bool = False, dialects: tuple[str, ...] = ("dcp", "emqp", "mdp01")
) -> Result:
    """Finding 3: one client of each dialect that allows several requests queues them for a
    service nobody serves (60 s each in the long form): RSS, held bytes, log."""
    seconds = 60.0 if long else 5.0
    result: Result = {"seconds": seconds}
    ok = True
    for dialect in dialects:
        row = _client_queue(dialect, seconds)
        result[dialect] = row
        ok = ok and row["rss_peak_mib"] - row["rss_start_mib"] < 16
    result["ok"] = ok
    return result


def probe_dcp_queue(long: bool = False) -> Result:
    """Finding 3 as the issue found it: one DCP client (``client_queue`` does every dialect)."""
    return probe_client_queue(long, ("dcp",))


def _client_queue(dialect: str, seconds: float) -> Result:
    make = CLIENT_FLOODS[dialect]
    with broker(*TCP, "--metrics", "127.0.0.1:0") as process:
        start = process.rss()
        context: Context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 10_000)
        socket.connect(process.endpoint("tcp://"))
        sent = 0
        peak = start
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                for _ in range(1000):
                    try:
                        socket.send_multipart(make(sent), flags=zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        socket.poll(10, zmq.POLLOUT)
                while socket.poll(0):
                    socket.recv_multipart()
                peak = max(peak, process.rss())
            held = re.search(r"^domo_held_bytes (\S+)", process.scrape(), re.M)
            time.sleep(0.5)
            peak = max(peak, process.rss())
        finally:
            socket.close(linger=0)
            context.term()
        log_bytes = len(process.text())
    return {
        "requests_sent": sent,
        "rss_start_mib": round(start / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "held_bytes": float(held.group(1)) if held else None,
        "log_bytes": log_bytes,
    }


def probe_ready_flood(long: bool = False) -> Result:
    """Finding 3: memo01 READYs of 256 names as fast as they go, beside an honest client."""
    import pynng

    seconds = 10.0 if long else 2.0
    with broker(*TCP, *nng()) as process, processes() as started:
        started.append(mdp_worker(process.endpoint("tcp://"), "echo"))
        context: Context = zmq.Context()
        try:
            mdp_honest(process.endpoint("tcp://"), 0.5, context)
            alone = mdp_honest(process.endpoint("tcp://"), seconds, context)
            log_before = len(process.text())
            rss_start = process.rss()
            stop = threading.Event()
            readies = [0]

            def flood() -> None:
                with pynng.Req0(send_timeout=1000, resend_time=-1) as socket:
                    socket.dial(_url(process), block=False)
                    number = 0
                    while not stop.is_set():
                        names = [f"r{number}-{n:03d}" for n in range(256)]
                        number += 1
                        context_ = socket.new_context()
                        try:
                            context_.send(
                                memo(M_READY, b"", sorted(names, key=lambda s: (len(s), s)))
                            )
                            readies[0] += 1
                        except pynng.NNGException:
                            pass
                        with contextlib.suppress(pynng.NNGException):
                            context_.close()

            thread = threading.Thread(target=flood, daemon=True)
            thread.start()
            time.sleep(0.3)
            try:
                flooded = mdp_honest(process.endpoint("tcp://"), seconds, context)
                stalled = False
            except RuntimeError:  # no reply for 10 s: the flood starved it
                flooded, stalled = [], True
            rss_peak = process.rss()
            stop.set()
            thread.join(timeout=10)
            try:
                after = mdp_honest(process.endpoint("tcp://"), 1.0, context)  # once it ends
            except RuntimeError:
                after = []
            log_growth = len(process.text()) - log_before
            lines = process.text().count("\n")
        finally:
            context.destroy(linger=0)
    ratio = len(flooded) / len(alone) if alone else 0.0
    return {
        "seconds": seconds,
        "readies": readies[0],
        "log_bytes_during": log_growth,
        "log_lines": lines,
        "alone_rps": round(len(alone) / seconds, 1),
        "flooded_rps": round(len(flooded) / seconds, 1),
        "throughput_ratio": round(ratio, 3),
        "after_rps": len(after),
        "stalled_10s": stalled,
        "rss_mib": [round(rss_start / 1024, 1), round(rss_peak / 1024, 1)],
        "load": load(),
        "ok": log_growth < 2_000_000 and ratio >= 0.5,
    }


# -- [4] a busy memo01 worker killed -----------------------------------------------------------


KILL_WAIT = 20.0  # seconds a client waits for the job of a killed worker (its JOB's timeout)


def probe_memo_kill(long: bool = False) -> Result:
    """Finding 4: a memo01 worker process holds a job and is SIGKILLed; another worker waits."""
    rounds = 5 if long else 2
    with broker(*TCP, *nng(), *BEATS) as process, processes() as started:
        times = [_kill_busy_memo_worker(process, started) for _ in range(rounds)]
    span = 0.2 * 3
    return {"seconds_to_served": times, "liveness_span": span, "ok": max(times) <= span + 1.0}


def _kill_busy_memo_worker(process: BrokerProcess, started: list[subprocess.Popen[bytes]]) -> float:
    """One round: a job held by a memo01 worker process, the process SIGKILLed, a spare worker
    started; seconds from the kill to the job's RESULT at its client (inf: never)."""
    url = _url(process)
    registered = process.text().count("serves 'job'")
    slow = role("memo-worker", url, "job", "hold", stdout=subprocess.DEVNULL)
    started.append(slow)
    _until(lambda: process.text().count("serves 'job'") > registered, 10.0)
    outcome: list[float | None] = []

    def call() -> None:
        reply = memo_call(url, "job", b"payload", KILL_WAIT)
        outcome.append(time.monotonic() if reply == b"payload" else None)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(1.0)  # the job is with the slow worker, the only one
    slow.kill()
    killed = time.monotonic()
    spare = MemoWorker(url, ["job"])
    spare.start()
    caller.join(timeout=KILL_WAIT + 10)
    spare.close()
    served = outcome[0] if outcome else None
    return round(served - killed, 2) if served is not None else float("inf")


# -- [6] fairness across transports ------------------------------------------------------------


def probe_fairness(long: bool = False) -> Result:
    """Finding 6: honest MDP (ZeroMQ) and memo01 (NNG) clients under each dialect's flood.

    The machine is shared, so each flood is measured against the clients alone just before it
    (not one baseline for all), ``rounds`` times; the median ratio of the rounds is judged.
    """
    import statistics

    seconds, rounds = (10.0, 3) if long else (1.0, 1)
    floods = ["mdp", "dcp", "emqp", "memo01"]
    result: Result = {"seconds": seconds, "rounds": rounds, "load_before": load()}
    ok = True
    with broker(*TCP, *nng(), "--heartbeat-interval", "1") as process, processes() as started:
        tcp, url = process.endpoint("tcp://"), _url(process)
        started.append(mdp_worker(tcp, "echo", "--heartbeat-interval", "1"))
        context: Context = zmq.Context()

        def honest() -> dict[str, list[float]]:
            return {"zmq": mdp_honest(tcp, seconds, context), "nng": memo_honest(url, seconds)}

        try:
            mdp_honest(tcp, 0.5, context)
            memo_honest(url, 0.5)
            rss_start = process.rss()
            for flood in floods:
                ratios: dict[str, list[tuple[float, float]]] = {"zmq": [], "nng": []}
                row: Result = {"junk": 0}
                peak = after = rss_start
                for _ in range(rounds):
                    alone = honest()
                    target = url if flood == "memo01" else tcp
                    flooder = role("flood", flood, target, str(2 * seconds + 1))
                    started.append(flooder)
                    time.sleep(0.5)
                    under = honest()
                    peak = max(peak, process.rss())
                    out, _ = flooder.communicate(timeout=4 * seconds + 60)
                    row["junk"] += int(out or b"0")
                    for side in ("zmq", "nng"):
                        throughput = len(under[side]) / max(len(alone[side]), 1)
                        p99 = p99_ms(under[side]) / max(p99_ms(alone[side]), 1e-6)
                        ratios[side].append((throughput, p99))
                    row.setdefault("alone_rps", []).append(
                        [round(len(alone[side]) / seconds) for side in ("zmq", "nng")]
                    )
                if long or flood == floods[-1]:  # the short form: once, after all
                    time.sleep(2.5)  # a malloc_trim round
                after = process.rss()
                for side in ("zmq", "nng"):
                    throughput = statistics.median(t for t, _ in ratios[side])
                    p99 = statistics.median(p for _, p in ratios[side])
                    row[side] = {"throughput": round(throughput, 3), "p99": round(p99, 2)}
                    ok = ok and throughput >= 0.5 and p99 <= 10
                row["rss_mib"] = [round(x / 1024, 1) for x in (rss_start, peak, after)]
                ok = ok and after <= rss_start * 1.10
                result[flood] = row
        finally:
            context.destroy(linger=0)
    result["load_after"] = load()
    result["ok"] = ok
    return result


# -- [9] drain ---------------------------------------------------------------------------------


def probe_drain(long: bool = False) -> Result:
    """Finding 9: a request in flight when SIGTERM comes to a broker with --drain 10."""
    drain = ["--drain", "10"] if _has_option("--drain") else []
    result: Result = {"drain_option": bool(drain)}
    with broker(*TCP, *nng(), *BEATS, *drain) as process, processes() as started:
        url = _url(process)
        slow = role("memo-worker", url, "job", "1.5", stdout=subprocess.DEVNULL)
        started.append(slow)
        _until(lambda: "serves 'job'" in process.text(), 10.0)
        context: Context = zmq.Context()
        replies: list[list[bytes] | None] = []
        try:
            caller = threading.Thread(
                target=lambda: replies.append(
                    _mdp_request(process.endpoint("tcp://"), b"job", b"in flight", 15.0, context)
                ),
                daemon=True,
            )
            caller.start()
            _until(lambda: "RequestDispatched" in process.text(), 0.3)
            time.sleep(0.3)
            assert process.process is not None
            broker_process = process.process
            stopped = time.monotonic()
            exited: list[float] = []
            watcher = threading.Thread(
                target=lambda: exited.append(
                    broker_process.wait(timeout=30) * 0 + time.monotonic()
                ),
                daemon=True,
            )
            process.signal(signal.SIGTERM)
            watcher.start()
            time.sleep(0.3)
            late = _mdp_request(process.endpoint("tcp://"), b"job", b"too late", 1.0, context)
            caller.join(timeout=20)
            watcher.join(timeout=30)
            result["exit_seconds"] = round(exited[0] - stopped, 2) if exited else None
            result["exit_code"] = broker_process.returncode
        finally:
            context.destroy(linger=0)
    result["in_flight_answered"] = bool(replies and replies[0] and replies[0][-1] == b"in flight")
    result["late_request_answered"] = late is not None
    result["ok"] = (
        result["in_flight_answered"]
        and not result["late_request_answered"]
        and result["exit_code"] == 0
    )
    return result


PROBES: dict[str, Callable[[bool], Result]] = {
    "auth": probe_auth,
    "sighup": probe_sighup,
    "blame": probe_blame,
    "labels": probe_labels,
    "nng_size": probe_nng_size,
    "memo_refused": probe_memo_refused,
    "client_queue": probe_client_queue,
    "ready_flood": probe_ready_flood,
    "memo_kill": probe_memo_kill,
    "fairness": probe_fairness,
    "drain": probe_drain,
}


# -- internal roles (processes the probes start) ---------------------------------------------


def _memo_worker_role(url: str, service: str, delay: str) -> None:
    """A memo01 worker (domo.trio.memo01) that sleeps ``delay`` seconds a job ("hold": forever)."""
    import trio

    from domo.trio.memo01 import run_memo01_worker

    async def handler(_service: str, payload: bytes) -> bytes:
        if delay == "hold":
            await trio.sleep_forever()
        await trio.sleep(float(delay))
        return payload

    trio.run(run_memo01_worker, url, [service], handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("probes", nargs="*", help=f"which (default: all): {', '.join(PROBES)}")
    parser.add_argument("--long", action="store_true", help="the long forms (nox -s chaos)")
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.role:
        name, *rest = options.role
        if name == "flood":
            dialect, target, seconds = rest
            sent = (
                flood_memo(target, float(seconds))
                if dialect == "memo01"
                else flood_zmq(target, dialect, float(seconds))
            )
            print(sent)
        elif name == "memo-worker":
            _memo_worker_role(*rest)
        return 0
    failed = []
    for name in options.probes or list(PROBES):
        if name not in PROBES:
            parser.error(f"no probe {name!r}")
        began = time.monotonic()
        outcome = PROBES[name](options.long)
        outcome["probe_seconds"] = round(time.monotonic() - began, 1)
        outcome["load"] = load()
        print(json.dumps({name: outcome}), flush=True)
        if not outcome["ok"]:
            failed.append(name)
    if failed:
        print(f"promises broken: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
