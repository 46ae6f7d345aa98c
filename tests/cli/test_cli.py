"""The ``domo`` command, driven as a user would: real processes on loopback sockets.

Brokers bind ``tcp://127.0.0.1:0`` and print the port they got; workers and brokers use short
heartbeats (0.2 s, liveness 3) where a test waits for a peer to be noticed as gone.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio

import domo as domo_package
from domo import cli
from domo.cli import (
    EXIT_CODES,
    EXIT_ENDPOINT,
    EXIT_FAILED_REQUESTS,
    EXIT_FINDINGS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REMOTE_ERROR,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from domo.protocol import WorkerConfig
from domo.trio import run_worker

from .conftest import DOMO, QUICK_BEATS, DomoProcess, StartDomo, run_domo

pytestmark = pytest.mark.io

PYTHON = shlex.quote(sys.executable)


async def start_broker(domo: StartDomo, *extra: str) -> tuple[DomoProcess, str]:
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS, *extra)
    return broker, await broker.endpoint()


async def start_worker(domo: StartDomo, broker: DomoProcess, service: str, *extra: str) -> None:
    """A ``domo worker`` for ``service``, returned once the broker logged its registration."""
    await domo("worker", service, *QUICK_BEATS, *extra)
    await broker.line("WorkerRegistered:", "stderr")


def python_command(code: str) -> str:
    """An --exec command line running ``code`` with this interpreter."""
    return f"{PYTHON} -c {shlex.quote(code)}"


# --- help, version, usage errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        ([], ["broker", "worker", "call", "demo", "--version"]),
        (["broker"], ["--bind", "--heartbeat-interval", "--liveness", "--request-expiry"]),
        (["worker"], ["SERVICE", "--connect", "--concurrency", "--exec", "DOMO_FRAME_SIZES"]),
        (["call"], ["SERVICE", "BODY", "--timeout", "--retries", "--raw", "mmi.service"]),
        (["demo"], ["--workers", "--clients", "--requests", "--duration"]),
        (["bench"], ["SERVICE", "--clients", "--requests", "--size"]),
        (["report"], ["TRACE_DIR", "--master", "--html", "--out", "--since", "--service"]),
        (["keygen"], ["NAME", "--dir", "0600", "--curve-allow-file"]),
    ],
    ids=["domo", "broker", "worker", "call", "demo", "bench", "report", "keygen"],
)
async def test_help_of_every_command(command: list[str], mentions: list[str]) -> None:
    """``--help`` exits 0 and documents the options and the command's own exit codes, only
    those: the table of another command would mislead."""
    done = await run_domo(*command, "--help")
    assert (done.code, done.stderr) == (EXIT_OK, "")
    assert done.stdout.startswith(f"usage: domo {' '.join(command)}".rstrip())
    for mention in [*mentions, "--log-level" if command else "COMMAND", "exit codes:"]:
        assert mention in done.stdout
    table = done.stdout.split("exit codes:\n", 1)[1]
    listed = [int(code) for code in re.findall(r"^  (\d+) ", table, re.MULTILINE)]
    assert listed == [code for code, _ in EXIT_CODES[command[0] if command else "domo"]]


async def test_bare_domo_prints_help_and_exits_0() -> None:
    """A newcomer's first try, `domo` alone, gets the help on stdout, not a usage error."""
    done = await run_domo()
    assert (done.code, done.stderr) == (EXIT_OK, "")
    assert done.stdout.startswith("usage: domo")
    assert "broker" in done.stdout
    assert "exit codes:" in done.stdout


def test_every_exit_code_means_one_thing_per_command() -> None:
    for command, table in EXIT_CODES.items():
        codes = [code for code, _ in table]
        assert len(codes) == len(set(codes)), command
    assert (EXIT_TIMEOUT, EXIT_REMOTE_ERROR, EXIT_ENDPOINT, EXIT_NOT_FOUND) == (3, 4, 5, 6)
    assert (EXIT_FINDINGS, EXIT_FAILED_REQUESTS, EXIT_UNREACHABLE) == (7, 8, 9)


def test_no_exit_code_has_two_meanings_across_commands() -> None:
    """1 is a bug and nothing else, 3 a call that timed out and nothing else: every exit code
    constant has its own value."""
    codes = {name: getattr(cli, name) for name in cli.__all__ if name.startswith("EXIT_")}
    assert len(set(codes.values())) == len(codes), codes
    assert codes["EXIT_ERROR"] == 1
    from domo import report  # its own codes (it is an extra's command): none reused either

    own = {
        name: getattr(report, name)
        for name in report.__all__
        if name.startswith("EXIT_")
        and name not in ("EXIT_OK", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_CODES")
    }
    assert not set(own.values()) & set(codes.values()), own


async def test_version_from_the_installed_console_script() -> None:
    """The ``domo`` console script (pyproject's [project.scripts]) is installed and runs."""
    script = shutil.which("domo", path=str(Path(sys.executable).parent))
    assert script is not None, "the domo console script is not installed next to python"
    with trio.fail_after(20):
        done = await trio.run_process([script, "--version"], capture_stdout=True)
    assert done.stdout.decode().startswith(f"domo {domo_package.__version__} (MDP/0.2; Python ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve"], "invalid choice: 'serve'"),
        (["call"], "the following arguments are required: SERVICE"),
        (["call", "echo", "--timeout", "0"], "argument --timeout: must be a positive number"),
        (["call", "echo", "--retries", "-1"], "argument --retries: must be at least 0"),
        (["call", "echo", "-", "-"], "'-' (stdin) may be given only once"),
        (["call", "caf\u00e9"], "a service name is 1-255 printable ASCII characters"),
        (["call", "echo", "--connect", "inproc://x"], "inproc:// works only inside one process"),
        (["broker", "--bind", "localhost:5555"], "argument --bind: not an endpoint"),
        # libzmq would wrap these ports (99999 binds 34463, -5 binds 65531): refused here
        (["broker", "--bind", "tcp://127.0.0.1:99999"], "port must be from 0 (any free port)"),
        (["broker", "--bind", "tcp://127.0.0.1:-5"], "port must be a number from 1 to 65535"),
        (["broker", "--bind", "tcp://127.0.0.1"], "no port (e.g. tcp://127.0.0.1:5555)"),
        (["call", "echo", "--connect", "tcp://127.0.0.1:70000"], "must be from 1 to 65535"),
        (["call", "echo", "--connect", "tcp://127.0.0.1:no-port"], "got 'no-port'"),
        (["call", "echo", "--connect", "tcp://127.0.0.1:0"], "must be from 1 to 65535, got 0"),
        (["call", "echo", "--connect", "tcp://*:5555"], "'*' (every interface) is for binding"),
        (["worker", "echo", "--connect", "tcp://localhost"], "no port"),
        (["bench", "--connect", "tcp://[::1]5555"], "an IPv6 address is written [ADDRESS]:PORT"),
        (["fuzz", "tcp://127.0.0.1:65536"], "must be from 0 (any free port) to 65535"),
        (["fuzz", "tcp://127.0.0.1:0"], "a port chosen by the system is for binding only"),
        (["broker", "--bind", "udp://127.0.0.1:1"], "use tcp://, ipc://, inproc://"),
        (["broker", "--bind", "ipc:///tmp/x", "--bind", "ipc:///tmp/x"], "is given twice"),
        (["broker", "--liveness", "0"], "argument --liveness: must be at least 1, got 0"),
        (["broker", "--heartbeat-interval", "nan"], "must be a positive number"),
        (["worker", "thing"], "no handler for 'thing': give --exec CMD"),
        (["worker", "thing", "--exec", "no-such-command-here"], "command not found"),
        (["worker", "thing", "--exec", "'unbalanced"], "--exec: No closing quotation"),
        (["worker", "mmi.service"], "'mmi.' belong to the broker"),
        (["worker", "echo", "--concurrency", "0"], "argument --concurrency: must be at least 1"),
        (["demo", "--requests", "10", "--duration", "1"], "not allowed with argument"),
    ],
)
async def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    """A usage error: exit 2, the usage and one error line on stderr, nothing on stdout."""
    done = await run_domo(*args)
    assert (done.code, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.startswith("usage: domo")
    assert message in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr


# --- broker, worker and call end to end -----------------------------------------------------------


async def test_broker_worker_and_call_end_to_end(domo: StartDomo, tmp_path: Path) -> None:
    """MDP-A-02: a broker on tcp and ipc at once; an echo worker on ipc serves a call on tcp;
    MDP-C-01: each BODY argument is one frame (an empty one too), '-' is stdin; MDP-M-01:
    ``mmi.service`` prints 200 or 404; replies print as text or as a bytes literal."""
    ipc = f"ipc://{tmp_path}/broker.ipc"
    broker = await domo(
        "broker", "--bind", "tcp://127.0.0.1:0", "--bind", ipc, "--log-level", "debug"
    )
    tcp = await broker.endpoint()
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", tcp)
    assert not tcp.endswith(":0")
    assert await broker.endpoint() == ipc
    worker = await domo("worker", "echo", "--connect", ipc)
    assert await worker.line("domo worker: serving") == (
        f"domo worker: serving 'echo' (built-in echo) at {ipc}, 1 at a time"
    )
    registered = await broker.line("WorkerRegistered:", "stderr")
    assert re.search(r"WorkerRegistered: worker (\d+/)?[0-9a-f]+ serves 'echo'$", registered)

    call = partial(run_domo, "call", "--connect", tcp)
    done = await call("echo", "hello", "", "wide world")
    assert (done.code, done.stdout, done.stderr) == (EXIT_OK, "hello\n\nwide world\n", "")
    done = await call("echo", "-", "text", stdin=b"\x00\x01binary\xff")
    assert (done.code, done.stdout) == (EXIT_OK, "b'\\x00\\x01binary\\xff'\ntext\n")
    done = await call("--raw", "echo", "-", "tail", stdin=b"\x00\x01\n")
    assert (done.code, done.stdout) == (EXIT_OK, "\x00\x01\ntail")
    done = await call("echo", "--", "-5", "--raw")  # '--': what follows is BODY
    assert (done.code, done.stdout) == (EXIT_OK, "-5\n--raw\n")
    done = await call("echo", "ends with a newline\n")
    assert done.stdout == "ends with a newline\n"  # not doubled
    done = await call("echo")
    assert (done.code, done.stdout) == (EXIT_OK, "\n")  # no BODY: one empty frame
    assert (await call("mmi.service", "echo")).stdout == "200\n"
    not_found = await call("mmi.service", "nobody")
    assert (not_found.code, not_found.stdout) == (EXIT_NOT_FOUND, "404\n")  # a script's $?
    assert not_found.stderr == "domo call: the broker answered 404 to mmi.service\n"
    assert "MmiReplied: client " in await broker.line("about 'nobody': 404", "stderr")


async def test_call_prints_each_partial_as_it_arrives(domo: StartDomo) -> None:
    """MDP-C-05, MDP-R-01: ``domo call`` prints every PARTIAL when it arrives, then the FINAL;
    the worker here is domo's library worker in this process, held between replies."""
    broker, endpoint = await start_broker(domo)
    release = trio.Event()

    async def count(body: list[bytes]) -> AsyncIterator[bytes]:
        yield b"part 1"
        yield b"part 2"  # part 1 goes out now
        await release.wait()
        yield b"the end"  # part 2 goes out now; the FINAL when the generator returns

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            work = partial(run_worker, config=WorkerConfig(heartbeat_interval=0.2))
            await nursery.start(work, endpoint, "count", count)
            await broker.line("WorkerRegistered:", "stderr")
            call = await domo("call", "count", "go", "--connect", endpoint, "--timeout", "10")
            assert await call.line("part 1") == "part 1"
            assert call.process.poll() is None  # the FINAL has not been sent yet
            release.set()
            assert await call.exit_code() == EXIT_OK
            assert call.lines() == ["part 1", "part 2", "the end"]
            nursery.cancel_scope.cancel()


async def test_call_repeat_sends_one_request_after_another(domo: StartDomo) -> None:
    """``--repeat N``: N requests in turn on one client, each reply printed; a failed one is
    reported, the next still sent, and the exit code is the last failure's."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "echo", "--connect", endpoint)
    done = await run_domo("call", "--connect", endpoint, "--repeat", "3", "echo", "again")
    assert (done.code, done.stdout, done.stderr) == (EXIT_OK, "again\n" * 3, "")
    done = await run_domo(
        "call", "--connect", endpoint, "--repeat", "2", "--timeout", "0.2", "--retries", "0",
        "nobody",
    )  # fmt: skip
    assert (done.code, done.stdout) == (EXIT_TIMEOUT, "")
    assert done.stderr.count("domo call: no reply from 'nobody'") == 2


async def test_bench_loads_a_running_broker_and_reports(domo: StartDomo) -> None:
    """``domo bench``: clients load a running broker and worker; every echo reply is checked and
    the figures printed; a service nobody serves gets exit 3 and a hint."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "echo", "--connect", endpoint)
    done = await run_domo("bench", "--connect", endpoint, "--requests", "300", "--clients", "4")
    assert (done.code, done.stderr) == (EXIT_OK, "")
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"domo bench: 4 clients -> 'echo' at {endpoint}, 16-byte bodies, 300 requests"
    )
    assert re.fullmatch(r"requests done: 300 in [\d.]+ s \(0 failed, 0 wrong replies\)", lines[1])
    assert re.fullmatch(r"throughput: \d+ requests/s", lines[2])
    assert re.fullmatch(r"latency: p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms", lines[3])
    assert "requests completed" not in done.stdout
    nobody = await run_domo(
        "bench", "nobody", "--connect", endpoint, "--requests", "2", "--timeout", "0.2",
        "--retries", "0",
    )  # fmt: skip
    assert nobody.code == EXIT_NOT_FOUND
    assert "requests done" not in nobody.stdout  # asked mmi.service first: no load at all
    assert nobody.stderr == (
        f"domo bench: no worker serves 'nobody' at {endpoint} (mmi.service answered 404); "
        f"start one first, e.g. `domo worker nobody --exec CMD --connect {endpoint}`\n"
    )
    nothing = f"tcp://127.0.0.1:{_free_port()}"
    no_broker = await run_domo("bench", "--connect", nothing, "--timeout", "0.3")
    assert no_broker.code == EXIT_UNREACHABLE
    assert f"no broker answered at {nothing} within 0.3 s" in no_broker.stderr


async def test_bench_stops_early_when_nothing_is_answered(domo: StartDomo) -> None:
    """A worker that registered but never answers in time: the load stops once no reply came
    for longer than every retry takes, instead of running its 100,000 requests; no '\r'
    progress lines when stderr is not a terminal."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "stuck", "--connect", endpoint, "--exec", "sleep 30")
    started = trio.current_time()
    done = await run_domo(
        "bench", "stuck", "--connect", endpoint, "--requests", "100000", "--clients", "2",
        "--timeout", "0.3", "--retries", "0", time_limit=30,
    )  # fmt: skip
    assert done.code == EXIT_UNREACHABLE  # nothing was answered
    assert trio.current_time() - started < 15
    assert "domo bench: no reply for 5 s (" in done.stderr
    assert "stopped early" in done.stderr
    assert "\r" not in done.stderr
    assert re.search(r"requests done: 0 in [\d.]+ s \(\d+ failed\)", done.stdout)


# --- --exec ---------------------------------------------------------------------------------------


async def test_exec_serves_a_service_with_a_command(domo: StartDomo) -> None:
    """``--exec CMD``: the request body on CMD's stdin (frames concatenated, their sizes in
    DOMO_FRAME_SIZES), CMD's stdout as the FINAL."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "upper", "--connect", endpoint, "--exec", "tr a-z A-Z")
    script = (
        "import os, sys; data = sys.stdin.buffer.read(); "
        "print(os.environ['DOMO_SERVICE'], os.environ['DOMO_FRAME_SIZES'], data.decode())"
    )
    await start_worker(
        domo, broker, "frames", "--connect", endpoint, "--exec", python_command(script)
    )

    call = partial(run_domo, "call", "--connect", endpoint)
    done = await call("upper", "hello, world")
    assert (done.code, done.stdout) == (EXIT_OK, "HELLO, WORLD\n")
    done = await call("upper", "-", stdin=b"from stdin\n")
    assert (done.code, done.stdout) == (EXIT_OK, "FROM STDIN\n")
    done = await call("frames", "abc", "", "de")
    assert (done.code, done.stdout) == (EXIT_OK, "frames 3,0,2 abcde\n")


async def test_failing_and_slow_commands_give_the_error_reply(domo: StartDomo) -> None:
    """MDP-D-23: a command that exits non-zero, or runs past --exec-timeout (it is killed),
    answers with domo's error reply: ``domo call`` exits 4 with the status and the stderr
    tail; the worker logs one warning line (no traceback) and stays registered."""
    broker, endpoint = await start_broker(domo)
    failing = python_command("import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    await start_worker(domo, broker, "fail", "--connect", endpoint, "--exec", failing)
    await domo(
        "worker",
        "slow",
        "--connect",
        endpoint,
        *QUICK_BEATS,
        "--exec",
        "sleep 30",
        "--exec-timeout",
        "0.3",
    )
    await broker.line("WorkerRegistered:", "stderr")

    call = partial(run_domo, "call", "--connect", endpoint, "--timeout", "10")
    for _ in range(2):  # the worker stays registered after a failure
        done = await call("fail", "x")
        assert (done.code, done.stdout) == (EXIT_REMOTE_ERROR, "")
        assert done.stderr == (
            "domo call: the worker for 'fail' failed: CommandFailed: command exited with "
            "status 3; stderr: boom\n"
        )
    done = await call("slow", "x")
    assert (done.code, done.stdout) == (EXIT_REMOTE_ERROR, "")
    assert "CommandFailed: command timed out after 0.3 s and was killed" in done.stderr
    assert done.elapsed < 5  # not the 30 s of the command
    assert (await call("mmi.service", "fail")).stdout == "200\n"
    assert not [line for line in broker.lines("stderr") if "WorkerDisconnected" in line]


async def test_exec_concurrency_runs_commands_side_by_side(domo: StartDomo, tmp_path: Path) -> None:
    """``--concurrency 2``: two sessions, two commands at once. Each command waits until both
    have started, so with one at a time both would time out."""
    broker, endpoint = await start_broker(domo)
    script = (
        "import pathlib, sys, time, os; d = pathlib.Path(sys.argv[1]); "
        "(d / str(os.getpid())).touch(); end = time.monotonic() + 10\n"
        "while len(list(d.iterdir())) < 2 and time.monotonic() < end: time.sleep(0.01)\n"
        "print(len(list(d.iterdir())))"
    )
    command = f"{python_command(script)} {shlex.quote(str(tmp_path / 'started'))}"
    (tmp_path / "started").mkdir()
    await domo(
        "worker",
        "pair",
        "--connect",
        endpoint,
        *QUICK_BEATS,
        "--concurrency",
        "2",
        "--exec",
        command,
        "--exec-timeout",
        "20",
    )
    await broker.line("WorkerRegistered:", "stderr")
    await broker.line("WorkerRegistered:", "stderr")
    results: list[str] = []

    async def ask(index: int) -> None:
        done = await run_domo("call", "pair", str(index), "--connect", endpoint, "--timeout", "20")
        results.append(f"{done.code} {done.stdout.strip()}")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 1)
            nursery.start_soon(ask, 2)
    assert results == ["0 2", "0 2"]


# --- timeouts and endpoints -----------------------------------------------------------------------


async def test_slow_work_is_named_as_such_and_its_repeats_too(
    domo: StartDomo, tmp_path: Path
) -> None:
    """A command slower than the client's --timeout: the call says the work takes longer than
    --timeout (a worker does serve it), that each resend may have run it again, and how to
    give it more time, not "is the broker up?"."""
    broker, endpoint = await start_broker(domo)
    runs = tmp_path / "runs"
    slow = f"sh -c 'echo run >> {shlex.quote(str(runs))}; sleep 1; echo done'"
    await start_worker(domo, broker, "slow", "--connect", endpoint, "--exec", slow)
    done = await run_domo(
        "call", "slow", "--connect", endpoint, "--timeout", "0.3", "--retries", "1"
    )
    assert (done.code, done.stdout) == (EXIT_TIMEOUT, "")
    message = done.stderr.strip()
    assert message.startswith(f"domo call: no reply from 'slow' at {endpoint} within 0.3 s")
    assert "a worker serves 'slow', yet no reply came: either the work takes longer" in message
    assert "--timeout 0.3 s" in message
    # Or the broker gave it up (MDP cannot say so to the client): the message names that too.
    assert "the broker gave the request up" in message
    assert "'redispatch-limit'" in message
    assert "e.g. --timeout 1.2" in message
    assert "each of the 2 attempts was sent again, so the work may have run 2 times" in message
    assert "is the broker up" not in message
    # The resend did run the command a second time, once the first run freed the worker (1 s):
    # that is why the message says so.
    await trio.sleep(2.5)
    assert runs.read_text().count("run") == 2


async def test_call_without_a_worker_or_broker_exits_3(domo: StartDomo) -> None:
    """MDP-C-08: no FINAL within the timeout, after every retry: exit 3 and a hint, whether
    the broker has no worker for the service or there is no broker at all."""
    _, endpoint = await start_broker(domo)
    done = await run_domo(
        "call", "nobody", "x", "--connect", endpoint, "--timeout", "0.2", "--retries", "1"
    )
    assert (done.code, done.stdout) == (EXIT_TIMEOUT, "")
    assert done.stderr.startswith(f"domo call: no reply from 'nobody' at {endpoint} within 0.2 s")
    assert "2 attempt(s)" in done.stderr
    assert "the broker says no worker serves 'nobody' (mmi.service: 404)" in done.stderr
    assert done.elapsed >= 0.4
    nowhere = "ipc:///nonexistent-dir/domo.ipc"
    done = await run_domo(
        "call", "echo", "--connect", nowhere, "--timeout", "0.2", "--retries", "0"
    )
    assert (done.code, done.stdout) == (EXIT_TIMEOUT, "")
    assert "1 attempt(s)" in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_waiting_call_stops_at_a_signal(domo: StartDomo, signum: signal.Signals) -> None:
    """SIGINT (Ctrl-C) or SIGTERM stop a call that waits for its reply at once, quietly, with
    exit code 128 + the signal's number (130 for SIGINT, the shell's convention)."""
    _, endpoint = await start_broker(domo)
    call = await domo(
        "call", "nobody", "--connect", endpoint, "--timeout", "20", "--log-level", "debug"
    )
    await call.line("RequestSent:", "stderr")  # the request is out, and the signals are watched
    stopping = trio.current_time()
    call.signal(signum)
    assert await call.exit_code() == 128 + signum
    assert trio.current_time() - stopping < 3.0
    assert call.lines() == []
    assert "Traceback" not in "\n".join(call.lines("stderr"))


async def test_address_in_use_exits_5_without_a_traceback(domo: StartDomo) -> None:
    """A second broker on a port in use says so in one line and exits 5."""
    _, endpoint = await start_broker(domo)
    done = await run_domo("broker", "--bind", endpoint)
    assert (done.code, done.stdout) == (EXIT_ENDPOINT, "")
    assert done.stderr.strip().splitlines()[-1] == (
        f"domo broker: endpoint error: Address already in use (addr='{endpoint}')"
    )
    assert "Traceback" not in done.stderr


async def test_an_endpoint_zeromq_rejects_exits_5() -> None:
    """An endpoint that passes the checks but that ZeroMQ refuses (no such interface to bind):
    one line, exit 5."""
    done = await run_domo("broker", "--bind", "tcp://no-such-interface:5555")
    assert done.code == EXIT_ENDPOINT
    assert done.stderr.splitlines()[-1] == (
        "domo broker: endpoint error: No such device (addr='tcp://no-such-interface:5555')"
    )
    assert "Traceback" not in done.stderr


# --- signals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_stopping_the_broker_disconnects_workers_who_come_back(
    domo: StartDomo, signum: signal.Signals
) -> None:
    """MDP-W-14: SIGINT/SIGTERM stop the broker gracefully: DISCONNECT to the worker, exit 0
    within a second or so, no traceback; MDP-W-17: the worker reconnects on a new socket and
    registers with a new broker on the same port, which then serves calls."""
    broker, endpoint = await start_broker(domo)
    worker = await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    await broker.line("WorkerRegistered:", "stderr")
    assert (await run_domo("call", "echo", "before", "--connect", endpoint)).stdout == "before\n"

    stopping = trio.current_time()
    broker.signal(signum)
    assert await broker.exit_code() == EXIT_OK
    assert trio.current_time() - stopping < 3.0
    assert broker.lines()[-1] == "domo broker: stopped; 1 requests completed"
    log = "\n".join(broker.lines("stderr"))
    assert f"{signum.name} received, stopping" in log
    assert " left: broker-shutdown; DISCONNECT sent" in log
    assert "Traceback" not in log
    await worker.line("ReconnectRequired: broker-disconnect", "stderr")

    again = await domo("broker", "--bind", endpoint, *QUICK_BEATS)
    assert await again.endpoint() == endpoint
    await again.line("WorkerRegistered:", "stderr", time_limit=15)
    assert (await run_domo("call", "echo", "after", "--connect", endpoint)).stdout == "after\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_stopping_a_worker_sends_disconnect(domo: StartDomo, signum: signal.Signals) -> None:
    """MDP-W-12, MDP-W-13: SIGINT/SIGTERM stop the worker: it sends DISCONNECT (the broker
    unregisters it at once, not by expiry) and exits 0 promptly, without a traceback."""
    broker, endpoint = await start_broker(domo)
    worker = await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    await broker.line("WorkerRegistered:", "stderr")
    await worker.line("domo worker: serving")

    stopping = trio.current_time()
    worker.signal(signum)
    assert await worker.exit_code() == EXIT_OK
    assert trio.current_time() - stopping < 3.0
    assert worker.lines()[-1] == "domo worker: stopped"
    assert "Traceback" not in "\n".join(worker.lines("stderr"))
    gone = await broker.line("WorkerDisconnected:", "stderr")
    assert gone.endswith(" left: worker-disconnect")  # and no DISCONNECT was sent to it
    gone_now = await run_domo("call", "mmi.service", "echo", "--connect", endpoint)
    assert (gone_now.code, gone_now.stdout) == (EXIT_NOT_FOUND, "404\n")


@pytest.mark.parametrize("command", ["broker", "worker"])
async def test_a_second_signal_does_not_cut_a_graceful_stop_short(
    domo: StartDomo, command: str
) -> None:
    """SIGINT then SIGTERM at once (Ctrl-C, then an impatient supervisor): the first stops the
    process gracefully; the second is logged and ignored, instead of being redelivered when the
    stop ends and killing the process before its last line (exit 143)."""
    broker, endpoint = await start_broker(domo)
    worker = await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    await broker.line("WorkerRegistered:", "stderr")
    target = broker if command == "broker" else worker
    target.signal(signal.SIGINT)
    target.signal(signal.SIGTERM)
    assert await target.exit_code() == EXIT_OK
    assert target.lines()[-1].startswith(f"domo {command}: stopped")
    log = "\n".join(target.lines("stderr"))
    assert "SIGINT received, stopping" in log
    assert "SIGTERM received while stopping; still stopping" in log


async def test_worker_stopped_while_busy_hands_the_request_back(domo: StartDomo) -> None:
    """MDP-D-22, MDP-D-08: a worker stopped by SIGTERM while its command runs kills the
    command, sends DISCONNECT and exits 0 at once; the broker re-dispatches the request to
    another worker, whose reply the waiting ``domo call`` prints."""
    broker, endpoint = await start_broker(domo, "--log-level", "debug")
    stuck = await domo("worker", "job", "--connect", endpoint, *QUICK_BEATS, "--exec", "sleep 30")
    await broker.line("WorkerRegistered:", "stderr")
    call = await domo("call", "job", "x", "--connect", endpoint, "--timeout", "20")
    await broker.line("RequestDispatched:", "stderr")  # to the stuck worker, the only one
    await start_worker(domo, broker, "job", "--connect", endpoint, "--exec", "echo done")
    stopping = trio.current_time()
    stuck.signal(signal.SIGTERM)
    assert await stuck.exit_code() == EXIT_OK
    assert trio.current_time() - stopping < 3.0
    assert await call.exit_code(time_limit=15) == EXIT_OK
    assert call.lines() == ["done"]
    assert "left: worker-disconnect" in await broker.line("WorkerDisconnected:", "stderr")


# --- demo -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra", [[], ["--endpoint", "tcp://127.0.0.1:0", "--clients", "2"]], ids=["inproc", "tcp"]
)
async def test_demo_prints_throughput_and_latency(extra: list[str]) -> None:
    """``domo demo`` runs a broker, echo workers and clients in one process, checks every reply
    and prints what happened: registrations, requests done per worker, a throughput figure and
    p50/p99 latency."""
    done = await run_domo("demo", "--requests", "400", "--workers", "3", *extra, time_limit=60)
    assert (done.code, done.stderr) == (EXIT_OK, "")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("domo demo: a broker on ")
    assert lines[0].endswith(
        " 3 echo workers, %s clients, 400 requests" % (extra[-1] if extra else 4)
    )
    assert re.fullmatch(r"workers registered: 3 of 3 in [\d.]+ ms", lines[1])
    done_line = re.fullmatch(
        r"requests done: 400 of 400 in [\d.]+ s \(0 failed, 0 wrong replies\); "
        r"FINALs per worker: (\d+), (\d+), (\d+)",
        lines[2],
    )
    assert done_line is not None
    assert sum(int(count) for count in done_line.groups()) == 400
    assert re.fullmatch(r"sample reply: 'demo request \d+' -> 'demo request \d+'", lines[3])
    throughput = re.fullmatch(r"throughput: (\d+) requests/s", lines[4])
    assert throughput is not None
    assert int(throughput[1]) > 0
    latency = re.fullmatch(r"latency: p50 ([\d.]+) ms, p99 ([\d.]+) ms", lines[5])
    assert latency is not None
    assert 0 < float(latency[1]) <= float(latency[2])
    assert len(lines) == 6


async def test_demo_for_a_duration() -> None:
    """``--duration`` sends requests for that long instead of a fixed number."""
    done = await run_domo("demo", "--duration", "0.5", "--workers", "1", "--clients", "1")
    assert done.code == EXIT_OK
    assert "requests for 0.5 s" in done.stdout.splitlines()[0]
    matched = re.search(r"requests done: (\d+) in 0\.5\d s \(0 failed", done.stdout)
    assert matched is not None
    assert int(matched[1]) > 0


# --- a newcomer's first minutes: nothing there, intervals that differ -----------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_worker_pointed_at_nothing_says_it_waits_and_why(domo: StartDomo) -> None:
    """No broker: the worker says it is waiting (not serving), and soon that nothing listens
    there, once; not the hint of silent connects, which would guess."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    worker = await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    assert await worker.line("domo worker:") == f"domo worker: waiting for the broker at {endpoint}"
    hint = await worker.line("cannot reach a broker at", "stderr", time_limit=15)
    assert hint.endswith(
        f"cannot reach a broker at {endpoint} (still trying: it serves once one answers there): "
        "nothing listens there (connection refused): is `domo broker` running, on that port?"
    )
    assert not [line for line in worker.lines() if "serving" in line]
    await trio.sleep(1.5)  # more silent connects: nothing more is said
    stderr = worker.lines("stderr")
    assert sum("cannot reach a broker at" in line for line in stderr) == 1
    assert not [line for line in stderr if "nothing heard from the broker" in line]


async def test_worker_with_a_shorter_interval_than_the_broker_is_told_so(domo: StartDomo) -> None:
    """Broker at 2.5 s, worker at 0.1 s: the worker gives the broker up before its first
    HEARTBEAT, every time; it never says serving, and it names the interval mismatch."""
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0")
    endpoint = await broker.endpoint()
    worker = await domo(
        "worker", "echo", "--connect", endpoint, "--heartbeat-interval", "0.1", "--liveness", "3"
    )
    hint = await worker.line("nothing heard from the broker", "stderr", time_limit=15)
    assert "heartbeat interval is longer than this worker's 0.1 s" in hint
    assert worker.lines() == [f"domo worker: waiting for the broker at {endpoint}"]


async def test_broker_names_a_worker_whose_interval_is_longer(domo: StartDomo) -> None:
    """Broker at 0.1 s, worker at 1 s: the worker expires between its heartbeats and speaks
    again; the broker's log says the intervals probably differ."""
    broker = await domo(
        "broker", "--bind", "tcp://127.0.0.1:0", "--heartbeat-interval", "0.1", "--liveness", "3"
    )
    endpoint = await broker.endpoint()
    await domo("worker", "echo", "--connect", endpoint, "--heartbeat-interval", "1")
    hint = await broker.line("spoke again after it expired", "stderr", time_limit=15)
    assert "heartbeat interval is probably longer than this broker's 0.1 s" in hint


async def test_worker_says_serving_once_the_broker_answers(domo: StartDomo) -> None:
    """READY gets no answer: "waiting" until the broker's first HEARTBEAT, then "serving"."""
    _, endpoint = await start_broker(domo)
    worker = await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    serving = f"domo worker: serving 'echo' (built-in echo) at {endpoint}, 1 at a time"
    assert await worker.line("domo worker: serving") == serving
    assert worker.lines() == [f"domo worker: waiting for the broker at {endpoint}", serving]
    assert not [line for line in worker.lines("stderr") if "nothing heard" in line]


async def test_broker_log_as_json_lines(domo: StartDomo) -> None:
    """--log-format json: one JSON object per line, the event's fields as keys."""
    import json

    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", "--log-format", "json")
    endpoint = await broker.endpoint()
    await domo("worker", "echo", "--connect", endpoint)
    line = await broker.line('"event": "WorkerRegistered"', "stderr")
    record = json.loads(line)
    assert (record["level"], record["logger"], record["service"]) == ("info", "domo.broker", "echo")
    assert re.fullmatch(r"[0-9a-f]+", record["worker"])


@pytest.mark.slow
async def test_a_body_too_large_for_the_heartbeat_is_named(domo: StartDomo) -> None:
    """300 MB at a 0.05 s heartbeat (liveness 2): nothing crosses a connection while the body
    does, heartbeats included, so the broker takes the worker for dead. The broker's log and the
    call's message say so, with the option to change, instead of "is the broker up?"."""
    beats = ["--heartbeat-interval", "0.05", "--liveness", "2"]
    # MDP-D-25, MDP-D-27: 300 MB passes, and a pipe holds 4 such messages (with 1, a HEARTBEAT
    # waiting in the worker's pipe would make the REQUEST's send fail: the worker "congested",
    # hence MDP-D-32); MDP-D-30: the pending bytes must hold one such message; MDP-D-26: the
    # held bytes one such request and its REQUEST_OVERHEAD.
    bounds = [
        "--max-message-bytes=400M",
        "--max-peer-bytes=1600M",
        "--max-held-bytes=401M",
        "--max-pending-bytes=400M",
    ]
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *beats, *bounds)
    endpoint = await broker.endpoint()
    await domo("worker", "echo", "--connect", endpoint, *beats)
    await broker.line("WorkerRegistered:", "stderr")
    done = await run_domo(
        "call", "echo", "-", "--connect", endpoint, "--timeout", "8", "--retries", "0", "--raw",
        stdin=b"\0" * 300_000_000, time_limit=90,
    )  # fmt: skip
    assert done.code == EXIT_TIMEOUT, done.stderr  # 300 MB cannot cross loopback in 0.1 s here
    assert "a body of 300 MB may take longer to cross than the broker's liveness" in done.stderr
    hint = await broker.line("while it held a request of 300 MB", "stderr")
    assert "raise --heartbeat-interval (on the broker and its workers)" in hint


async def test_defaults_from_the_environment(domo: StartDomo) -> None:
    """DOMO_ENDPOINT, DOMO_HEARTBEAT_INTERVAL and DOMO_LIVENESS set the defaults of --connect,
    --heartbeat-interval and --liveness (one setting for every process of a deployment); an
    option given wins; a bad value is a usage error that names the variable; --help shows it."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "echo", "--connect", endpoint)
    environment = {**os.environ, "DOMO_ENDPOINT": endpoint}
    with trio.fail_after(20):
        done = await trio.run_process(
            [*DOMO, "call", "echo", "hi"], env=environment, capture_stdout=True, check=False
        )
    assert (done.returncode, done.stdout) == (0, b"hi\n")
    wrong = {**environment, "DOMO_ENDPOINT": "tcp://127.0.0.1:1"}  # the option wins over it
    with trio.fail_after(20):
        done = await trio.run_process(
            [*DOMO, "call", "echo", "hi", "--connect", endpoint],
            env=wrong,
            capture_stdout=True,
            check=False,
        )
    assert (done.returncode, done.stdout) == (0, b"hi\n")
    for variable, value in [("DOMO_LIVENESS", "many"), ("DOMO_ENDPOINT", "tcp://nowhere")]:
        with trio.fail_after(20):
            bad = await trio.run_process(
                [*DOMO, "worker", "echo"],
                env={**os.environ, variable: value},
                capture_stderr=True,
                check=False,
            )
        assert bad.returncode == EXIT_USAGE
        assert f"(from {variable})" in bad.stderr.decode()
    shown = await run_domo("worker", "--help")
    for variable in ("DOMO_ENDPOINT", "DOMO_HEARTBEAT_INTERVAL", "DOMO_LIVENESS"):
        assert variable in shown.stdout


async def test_json_output_of_call_bench_and_demo(domo: StartDomo) -> None:
    """--json: `call` writes one JSON line per reply (UTF-8 frames as text, otherwise every
    frame of that reply in base64); `bench` and `demo` one JSON object with their figures,
    and nothing else on stdout."""
    broker, endpoint = await start_broker(domo)
    await start_worker(domo, broker, "echo", "--connect", endpoint)
    text = await run_domo("call", "echo", "hé", "two", "--connect", endpoint, "--json")
    assert text.code == EXIT_OK, text.stderr
    assert [json.loads(line) for line in text.stdout.splitlines()] == [
        {"reply": "final", "frames": ["hé", "two"], "encoding": "utf-8"}
    ]
    binary = await run_domo(
        "call", "echo", "-", "plain", "--connect", endpoint, "--json", stdin=b"\xff\x00"
    )
    assert json.loads(binary.stdout) == {
        "reply": "final",
        "frames": [base64.b64encode(b"\xff\x00").decode(), base64.b64encode(b"plain").decode()],
        "encoding": "base64",
    }
    bench = await run_domo("bench", "--connect", endpoint, "--requests", "30", "--json")
    assert bench.code == EXIT_OK, bench.stderr
    figures = json.loads(bench.stdout)
    assert (figures["command"], figures["requests_done"], figures["failed"]) == ("bench", 30, 0)
    assert figures["wrong"] == 0
    assert figures["exit_code"] == EXIT_OK
    assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"]
    demo = await run_domo("demo", "--requests", "40", "--json")
    assert demo.code == EXIT_OK, demo.stderr
    record = json.loads(demo.stdout)
    assert (record["command"], record["requests_done"], sum(record["finals_per_worker"])) == (
        "demo",
        40,
        40,
    )


SILENT_WHILE_BUSY = """
import sys, time, zmq
socket = zmq.Context().socket(zmq.DEALER)
socket.connect(sys.argv[1])
socket.send_multipart([b"", b"MDPW02", b"\\x01", b"slow"])
while True:  # heartbeats while idle, as a worker must
    if socket.poll(100):
        frames = socket.recv_multipart()
        if frames[2] == b"\\x02":
            break
    socket.send_multipart([b"", b"MDPW02", b"\\x05"])
time.sleep(1.0)  # works without a HEARTBEAT, as majortomo's worker does
socket.send_multipart([b"", b"MDPW02", b"\\x04", frames[3], b"", b"done"])
time.sleep(0.5)
"""


async def test_broker_names_a_worker_silent_while_busy(domo: StartDomo) -> None:
    """A worker that heartbeats while idle but not while it works expires holding a request and
    speaks again with its FINAL: the hint names both causes, busy silence first. (It frames as
    majortomo's does, whose workers get --busy-worker-timeout while busy, FAM-09: set to the
    liveness span here, so it still expires.)"""
    broker = await domo(
        "broker", "--bind", "tcp://127.0.0.1:0", "--heartbeat-interval", "0.1", "--liveness", "3",
        "--busy-worker-timeout", "0.3",
    )  # fmt: skip
    endpoint = await broker.endpoint()
    with trio.fail_after(20):
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-c", SILENT_WHILE_BUSY, endpoint]
        )
        try:
            await broker.line("WorkerRegistered:", "stderr")
            call = await run_domo(
                "call", "slow", "x", "--connect", endpoint, "--timeout", "3", "--retries", "0"
            )
            hint = await broker.line("spoke again after it expired", "stderr", time_limit=15)
        finally:
            worker.kill()
            await worker.wait()
    assert "while it held a request" in hint
    assert "must keep sending HEARTBEAT while it works (MDP-H-04" in hint
    assert call.code == EXIT_TIMEOUT  # the request went back to the queue: no worker left
