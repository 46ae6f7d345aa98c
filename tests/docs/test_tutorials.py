"""The tutorials' code runs: every file under docs/tutorials/examples/ against a real broker.

Each example is what a tutorial page includes (pymdownx.snippets), so a page cannot show code
that does not work; ``test_every_block_of_every_tutorial_is_a_tested_example`` holds the pages to
that. The broker, workers and clients are real subprocesses on 127.0.0.1 (free ports), each
bounded in time and stopped by PID at the end; majortomo's peers run from majortomo's own
virtualenv, as in tests/interop.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
EXAMPLES = TUTORIALS / "examples"
BIN = Path(sys.executable).parent
DOMO = str(BIN / "domo") if (BIN / "domo").exists() else "domo"
PAGE_ENDPOINT = "tcp://127.0.0.1:5555"  # the endpoint the pages show; tests use free ports
MAJORTOMO_VENV = ROOT / ".bench-venvs" / "majortomo"

# Every example file, and the test that runs it (or compares it with what a run printed).
RUN_BY = {
    "broker.sh": "broker fixture",
    "first_steps.sh": "test_first_steps_shell_block_runs",
    "upper_worker.py": "test_python_worker_and_client_run",
    "upper_client.py": "test_python_worker_and_client_run",
    "upper_worker_asyncio.py": "test_each_runtime_serves_upper",
    "upper_worker_sync.py": "test_each_runtime_serves_upper",
    "count_worker_sync.py": "test_asyncio_callers",
    "callers_asyncio.py": "test_asyncio_callers",
    "callers_asyncio.out": "test_asyncio_callers",
    "web_app.py": "test_web_app_answers_and_maps_a_timeout_to_504",
    "fuzz_broker.sh": "test_fuzz_tutorial_commands_run",
    "embed_client.py": "test_embedded_client_and_worker",
    "embed_worker.py": "test_embedded_client_and_worker",
    "embed_broker.py": "test_embedded_broker_serves_domo_and_embedded_peers",
    "operate_broker.sh": "test_operating_a_broker",
    "operate_check.sh": "test_operating_a_broker",
    "operate_stop.sh": "test_operating_a_broker",
    "operate_traces.py": "test_operating_a_broker",
    "operate_log.jsonl": "test_operating_a_broker",
    "operate_traces.out": "test_operating_a_broker",
    "operate_mismatch.sh": "test_heartbeat_mismatch_is_named_in_the_log",
    "operate_mismatch.log": "test_heartbeat_mismatch_is_named_in_the_log",
    "mdp01.sh": "test_mdp01_peers_and_domo_peers_share_a_broker",
    "mdp01_client.py": "test_mdp01_peers_and_domo_peers_share_a_broker",
    "mdp01_worker.py": "test_mdp01_peers_and_domo_peers_share_a_broker",
    "majortomo.sh": "test_majortomo_peers_and_domo_peers_share_a_broker",
    "majortomo_worker.py": "test_majortomo_peers_and_domo_peers_share_a_broker",
    "majortomo_client.py": "test_majortomo_peers_and_domo_peers_share_a_broker",
    # durable-requests.md: run by tests/titanic/test_tutorial_durable.py
    "durable_start.sh": "test_requests_survive_a_crash_tutorial",
    "durable_submit.sh": "test_requests_survive_a_crash_tutorial",
    "durable_submit.out": "test_requests_survive_a_crash_tutorial",
    "durable_restart.out": "test_requests_survive_a_crash_tutorial",
    "durable_worker.sh": "test_requests_survive_a_crash_tutorial",
    "durable_fetch.sh": "test_requests_survive_a_crash_tutorial",
    "durable_fetch.out": "test_requests_survive_a_crash_tutorial",
    "durable_client.py": "test_requests_survive_a_crash_tutorial",
    "durable_client.out": "test_requests_survive_a_crash_tutorial",
}

FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([\w.-]+)"$')


def included_examples(page: Path) -> list[tuple[str, str]]:
    """(language, file) of every code block of ``page``; AssertionError for inline code."""
    blocks = []
    for match in FENCE.finditer(page.read_text()):
        language, body = match.group(2), match.group(3).strip()
        snippet = SNIPPET.match(body)
        assert snippet is not None, (
            f"{page.name}: a {language or 'plain'} block is not an included example file, "
            f"so no test runs it:\n{body}"
        )
        blocks.append((language, snippet.group(1)))
    return blocks


def test_every_block_of_every_tutorial_is_a_tested_example() -> None:
    included: set[str] = set()
    for page in sorted(TUTORIALS.glob("*.md")):
        for _language, name in included_examples(page):
            assert name in RUN_BY, f"{page.name} shows {name}, which no test runs"
            included.add(name)
    on_disk = {path.name for path in EXAMPLES.iterdir() if path.is_file()}
    assert on_disk == set(RUN_BY), "every example file is listed in RUN_BY, and only those"
    assert included == set(RUN_BY), f"examples no page shows: {set(RUN_BY) - included}"


def like(sample: str) -> re.Pattern[str]:
    """A pattern for the lines a page shows as sample output: ids and numbers may differ."""
    parts = re.split(r"([0-9a-f]{10,}|\d+(?:\.\d+)?)", sample)
    wild = {1: r"[0-9a-f]+", 0: r"\d+(?:\.\d+)?"}
    return re.compile(
        "".join(
            re.escape(part) if i % 2 == 0 else wild[bool(re.fullmatch(r"[0-9a-f]{10,}", part))]
            for i, part in enumerate(parts)
        )
    )


def assert_shown(sample_file: str, lines: list[str]) -> None:
    """Every line of a page's sample output is like one of ``lines``, in the same order."""
    rest = [line.rstrip("\n") for line in lines]
    for shown in (EXAMPLES / sample_file).read_text().splitlines():
        pattern = like(shown)
        found = [i for i, line in enumerate(rest) if pattern.search(line)]
        assert found, f"{sample_file}: no line like {shown!r} in\n" + "\n".join(rest)
        rest = rest[found[0] + 1 :]


# --- processes ---------------------------------------------------------------------------------


class Process:
    """A subprocess whose stdout and stderr are read into lists by threads, as they come."""

    def __init__(self, *argv: str, cwd: Path = EXAMPLES, env: dict[str, str] | None = None):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.popen.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.popen.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_for(self, what: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``what()`` holds; fail the test with the output so far if it does not."""
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline or (self.popen.poll() is not None and not what()):
                raise AssertionError(f"{self.argv}: gave up waiting; output so far:\n{self}")
            time.sleep(0.02)

    def line(self, pattern: str, timeout: float = 10.0, stream: str = "out") -> str:
        """The first line of stdout (or stderr) that matches ``pattern``, waited for."""
        lines = self.out if stream == "out" else self.err
        found: list[str] = []

        def seen() -> bool:
            found[:] = [line for line in list(lines) if re.search(pattern, line)]
            return bool(found)

        self.wait_for(seen, timeout)
        return found[0]

    def stop(self, signum: int = signal.SIGINT, timeout: float = 10.0) -> int:
        """Send ``signum`` (if still running), wait; SIGKILL if it does not exit in time."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        return self.popen.returncode

    def __str__(self) -> str:
        return f"stdout:\n{''.join(self.out)}stderr:\n{''.join(self.err)}"


@pytest.fixture
def processes() -> Iterator[Callable[..., Process]]:
    """Start processes that are all stopped (SIGINT, then SIGKILL) at the end of the test."""
    started: list[Process] = []

    def start(*argv: str, **kwargs: object) -> Process:
        process = Process(*argv, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()


def run(
    *argv: str, timeout: float = 30, cwd: Path = EXAMPLES, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (bounded by ``timeout``), its output captured."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def start_broker(
    start: Callable[..., Process], argv: list[str], **kwargs: object
) -> tuple[Process, str]:
    """Start a ``domo broker`` command of a page on a free port; the process and its endpoint."""
    assert argv[:2] == ["domo", "broker"], argv
    args = [re.sub(r"tcp://127\.0\.0\.1:\d+", "tcp://127.0.0.1:0", arg) for arg in argv[2:]]
    broker = start(DOMO, "broker", *args, **kwargs)
    line = broker.line("^domo broker: listening on ")  # printed first, then it serves
    return broker, line.split()[-1]


def shell_commands(name: str, endpoint: str = PAGE_ENDPOINT) -> list[list[str]]:
    """The commands of a shell example, with the tutorial's endpoint replaced by ``endpoint``."""
    commands = []
    for line in (EXAMPLES / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            line = line.replace(PAGE_ENDPOINT, endpoint)
            commands.append(shlex.split(line, comments=True))
    return commands


def domo(argv: list[str], endpoint: str | None = None) -> list[str]:
    """A ``domo ...`` command of a page, runnable here; ``--connect endpoint`` added if given."""
    assert argv[0] == "domo", argv
    return [DOMO, *argv[1:], *(["--connect", endpoint] if endpoint else [])]


def wait_for_service(endpoint: str, service: str, timeout: float = 10.0) -> None:
    """Ask the broker (mmi.service) until a worker serves ``service``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = run(DOMO, "call", "mmi.service", service, "--connect", endpoint, timeout=10)
        if answer.stdout.strip() == "200":
            return
        assert time.monotonic() < deadline, f"no worker registered for {service!r}"
        time.sleep(0.05)


@pytest.fixture
def broker(processes: Callable[..., Process]) -> str:
    """The page's ``domo broker`` (broker.sh) on a free loopback port; yields its endpoint."""
    [command] = shell_commands("broker.sh")
    _process, endpoint = start_broker(processes, command)
    return endpoint


# --- first steps, Python workers and clients ---------------------------------------------------


def test_first_steps_shell_block_runs(broker: str, processes: Callable[..., Process]) -> None:
    commands = shell_commands("first_steps.sh", broker)
    assert [c[:2] for c in commands] == [
        ["domo", "broker"],
        ["domo", "worker"],
        ["domo", "call"],
        ["domo", "call"],
    ]
    # The broker of the first line is the fixture's (same command, a free port).
    worker = processes(*domo(commands[1]))
    echo = run(*domo(commands[2], broker), "--timeout", "2", "--retries", "4")
    assert (echo.returncode, echo.stdout) == (0, "hello\nworld\n"), echo.stderr
    mmi = run(*domo(commands[3], broker))
    assert (mmi.returncode, mmi.stdout.strip()) == (0, "200"), mmi.stderr
    assert worker.stop() == 0


def test_python_worker_and_client_run(broker: str, processes: Callable[..., Process]) -> None:
    processes(sys.executable, "upper_worker.py", broker)
    client = run(sys.executable, "upper_client.py", broker)
    assert (client.returncode, client.stdout) == (0, "HELLO\nWORLD\n"), client.stderr


@pytest.mark.parametrize("example", ["upper_worker_asyncio.py", "upper_worker_sync.py"])
def test_each_runtime_serves_upper(
    broker: str, processes: Callable[..., Process], example: str
) -> None:
    worker = processes(sys.executable, example, broker)
    client = run(sys.executable, "upper_client.py", broker)
    assert (client.returncode, client.stdout) == (0, "HELLO\nWORLD\n"), client.stderr
    # Ctrl-C stops it cleanly: DISCONNECT, so the broker forgets the worker at once.
    assert worker.stop(signal.SIGINT) == 0, str(worker)
    mmi = run(DOMO, "call", "mmi.service", "upper", "--connect", broker)
    assert mmi.stdout.strip() == "404", mmi


def test_asyncio_callers(broker: str, processes: Callable[..., Process]) -> None:
    processes(sys.executable, "upper_worker_sync.py", broker)
    count = processes(sys.executable, "count_worker_sync.py", broker)
    wait_for_service(broker, "count")
    callers = run(sys.executable, "callers_asyncio.py", broker)
    assert callers.returncode == 0, callers.stderr
    assert callers.stdout == (EXAMPLES / "callers_asyncio.out").read_text()
    assert count.stop(signal.SIGTERM) == 0, str(count)  # SIGTERM: a graceful stop too


def test_web_app_answers_and_maps_a_timeout_to_504(
    broker: str, processes: Callable[..., Process]
) -> None:
    worker = processes(sys.executable, "upper_worker_sync.py", broker)
    app = processes(sys.executable, "web_app.py", broker, "0")
    url = app.line(r"^serving on http://127\.0\.0\.1:\d+/$").split()[-1]
    with urllib.request.urlopen(url + "?text=hello", timeout=20) as page:
        assert (page.status, page.read()) == (200, b"HELLO\n")
    assert worker.stop() == 0
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as failure:
        urllib.request.urlopen(url + "?text=hello", timeout=20)
    assert failure.value.code == 504
    assert failure.value.read() == b"the upper service did not answer\n"
    assert 1.5 < time.monotonic() - started < 10  # timeout 1.0 x (retries 1 + 1)
    assert app.stop() == 0


def test_fuzz_tutorial_commands_run(processes: Callable[..., Process]) -> None:
    commands = shell_commands("fuzz_broker.sh")
    assert [c[:2] for c in commands] == [["domo", "broker"], ["domo", "fuzz"]]
    _broker, endpoint = start_broker(processes, commands[0])
    fuzz_args = [endpoint if a == PAGE_ENDPOINT else a for a in commands[1][1:]]
    fuzz = run(DOMO, *fuzz_args, timeout=60)
    assert fuzz.returncode == 0, fuzz.stdout + fuzz.stderr


# --- embedding the core ------------------------------------------------------------------------


def test_embedded_client_and_worker(broker: str, processes: Callable[..., Process]) -> None:
    worker = processes(sys.executable, "embed_worker.py", broker)
    wait_for_service(broker, "reverse")
    # The embedded client against the embedded worker, and domo's own client against it.
    mine = run(sys.executable, "embed_client.py", broker, "reverse", "hello", "world")
    assert (mine.returncode, mine.stdout) == (0, "olleh\ndlrow\n"), mine.stderr
    theirs = run(DOMO, "call", "reverse", "abc", "--connect", broker)
    assert (theirs.returncode, theirs.stdout) == (0, "cba\n"), theirs.stderr
    # PARTIALs reach the embedded client as they come (a domo.sync worker streams them).
    processes(sys.executable, "count_worker_sync.py", broker)
    wait_for_service(broker, "count")
    counted = run(sys.executable, "embed_client.py", broker, "count", "3")
    assert (counted.returncode, counted.stdout) == (0, "1\n2\n3\n"), counted.stderr
    # No worker: the session retries on new sockets (timeout 1.0, retries 2), then fails.
    started = time.monotonic()
    nobody = run(sys.executable, "embed_client.py", broker, "nobody", "x")
    assert (nobody.returncode, nobody.stderr) == (1, "request failed: retries-exhausted\n")
    assert 2.5 < time.monotonic() - started < 15
    # SIGTERM: DISCONNECT, so the broker forgets the worker at once.
    assert worker.stop(signal.SIGTERM) == 0, str(worker)
    assert "WorkerConnected" in "".join(worker.err)
    mmi = run(DOMO, "call", "mmi.service", "reverse", "--connect", broker)
    assert mmi.stdout.strip() == "404"


def test_embedded_broker_serves_domo_and_embedded_peers(
    processes: Callable[..., Process],
) -> None:
    broker = processes(sys.executable, "embed_broker.py", "tcp://127.0.0.1:0")
    endpoint = broker.line(r"^listening on tcp://127\.0\.0\.1:\d+$").split()[-1]
    domo_worker = processes(DOMO, "worker", "echo", "--connect", endpoint)
    processes(sys.executable, "embed_worker.py", endpoint)
    wait_for_service(endpoint, "echo")
    wait_for_service(endpoint, "reverse")
    echo = run(DOMO, "call", "echo", "hi", "--connect", endpoint)
    assert (echo.returncode, echo.stdout) == (0, "hi\n"), echo.stderr
    reverse = run(sys.executable, "embed_client.py", endpoint, "reverse", "abc")
    assert (reverse.returncode, reverse.stdout) == (0, "cba\n"), reverse.stderr
    # SIGTERM: DISCONNECT to every worker, exit 0; domo's worker reconnects, waiting for a broker.
    assert broker.stop(signal.SIGTERM) == 0, str(broker)
    assert sum("left: broker-shutdown; DISCONNECT sent" in line for line in broker.err) == 2
    domo_worker.line("ReconnectRequired: broker-disconnect", stream="err")


# --- operating a broker ------------------------------------------------------------------------


def log_records(process: Process) -> list[dict[str, object]]:
    """The JSON log lines of a process's stderr (each line must be one JSON object)."""
    return [json.loads(line) for line in process.err if line.strip()]


def test_operating_a_broker(processes: Callable[..., Process], tmp_path: Path) -> None:
    # --trace-dir needs the trace extra: `nox -s docs` and `nox -s tests` install it.
    pytest.importorskip("pyarrow")
    [start_command] = shell_commands("operate_broker.sh")
    broker, endpoint = start_broker(processes, start_command, cwd=tmp_path)  # ./traces there
    check = shell_commands("operate_check.sh", endpoint)
    assert [c[:3] for c in check] == [
        ["domo", "call", "mmi.service"],
        ["domo", "worker", "echo"],
        ["domo", "call", "echo"],
    ]
    nobody = run(*domo(check[0], endpoint))
    assert (nobody.returncode, nobody.stdout) == (6, "404\n"), nobody.stderr
    worker = processes(*domo(check[1]))
    wait_for_service(endpoint, "echo")
    up = run(*domo(check[0], endpoint))
    assert (up.returncode, up.stdout) == (0, "200\n"), up.stderr
    ping = run(*domo(check[2], endpoint))
    assert (ping.returncode, ping.stdout) == (0, "ping\n"), ping.stderr

    # The stop block, run by a shell as it is on the page, given the broker's PID.
    stop = run("bash", "operate_stop.sh", env={**os.environ, "BROKER_PID": str(broker.pid)})
    assert stop.returncode == 0, stop.stderr
    broker.popen.wait(timeout=10)  # a second signal now would cut the graceful stop short
    assert broker.stop() == 0, str(broker)  # it has exited: this only collects its output
    assert broker.out[-1] == "domo broker: stopped; 1 requests completed\n", str(broker)
    # The worker was told DISCONNECT, and waits for a broker to come back.
    worker.line("ReconnectRequired: broker-disconnect", stream="err")
    assert worker.stop(signal.SIGTERM) == 0

    # The log: one JSON object per line, with the fields the page's sample shows.
    records = log_records(broker)
    sample = [
        json.loads(line) for line in (EXAMPLES / "operate_log.jsonl").read_text().splitlines()
    ]
    for shown in sample:
        same = [
            r
            for r in records
            if (r["level"], r["logger"], r.get("event"))
            == (shown["level"], shown["logger"], shown.get("event"))
            and set(r) == set(shown)
        ]
        assert same, f"no line of the broker's log is like the page's {shown}"
    stopping = [r for r in records if r["message"] == "broker: SIGTERM received, stopping"]
    assert stopping, records

    # The traces: one request (mmi.* is not traced), the worker's registration and its end.
    traces = run(sys.executable, str(EXAMPLES / "operate_traces.py"), "traces", cwd=tmp_path)
    assert traces.returncode == 0, traces.stderr
    assert len(traces.stdout.splitlines()) == 3, traces.stdout
    assert_shown("operate_traces.out", traces.stdout.splitlines())


def test_heartbeat_mismatch_is_named_in_the_log(processes: Callable[..., Process]) -> None:
    broker_command, worker_command = shell_commands("operate_mismatch.sh")
    broker, endpoint = start_broker(processes, broker_command)
    worker_argv = [endpoint if a == "tcp://127.0.0.1:5556" else a for a in worker_command]
    processes(*domo(worker_argv))
    # Registered, expired after 3 x 0.2 s of silence, then heard again at the worker's 1 s.
    broker.line("WorkerRegistered", stream="err")
    broker.line("WorkerExpired: .* expired: nothing heard from it for", stream="err")
    broker.line("spoke again after it expired", stream="err")
    assert_shown("operate_mismatch.log", broker.err)


# --- moving from MDP/0.1 and from majortomo ----------------------------------------------------


def python_command(argv: list[str], python: str = sys.executable) -> list[str]:
    assert argv[0] == "python", argv
    return [python, *argv[1:]]


def test_mdp01_peers_and_domo_peers_share_a_broker(processes: Callable[..., Process]) -> None:
    commands = shell_commands("mdp01.sh")
    assert [c[:2] for c in commands] == [
        ["domo", "broker"],
        ["python", "mdp01_worker.py"],
        ["domo", "worker"],
        ["python", "mdp01_client.py"],
        ["python", "mdp01_client.py"],
        ["domo", "call"],
    ]
    _broker, endpoint = start_broker(processes, commands[0])
    commands = shell_commands("mdp01.sh", endpoint)
    old_worker = processes(*python_command(commands[1]))
    processes(*domo(commands[2]))
    wait_for_service(endpoint, "lower")
    wait_for_service(endpoint, "echo")
    # The MDP/0.1 client, served by domo's worker and by the MDP/0.1 worker.
    echo = run(*python_command(commands[3]))
    assert (echo.returncode, echo.stdout) == (0, "hello\nworld\n"), echo.stderr
    lower = run(*python_command(commands[4]))
    assert (lower.returncode, lower.stdout) == (0, "hello\n"), lower.stderr
    # domo's client, served by the MDP/0.1 worker.
    call = run(*domo(commands[5]))
    assert (call.returncode, call.stdout) == (0, "shout\n"), call.stderr
    # The MDP/0.1 worker's stop says DISCONNECT: the broker forgets it at once.
    assert old_worker.stop(signal.SIGTERM) == 0, str(old_worker)
    gone = run(DOMO, "call", "mmi.service", "lower", "--connect", endpoint)
    assert gone.stdout == "404\n", gone


@pytest.fixture(scope="session")
def majortomo_python() -> str:
    """The python of majortomo's virtualenv (majortomo 0.2.0), made with pip on first use."""
    python = MAJORTOMO_VENV / "bin" / "python"
    probe = [str(python), "-c", "import majortomo"]
    if not (python.exists() and subprocess.run(probe, capture_output=True).returncode == 0):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(MAJORTOMO_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "majortomo==0.2.0", "six", "pyzmq"],
            check=True,
            timeout=300,
        )
    return str(python)


def test_majortomo_peers_and_domo_peers_share_a_broker(
    processes: Callable[..., Process], majortomo_python: str
) -> None:
    commands = shell_commands("majortomo.sh")
    assert [c[:2] for c in commands] == [
        ["domo", "broker"],
        ["python", "majortomo_worker.py"],
        ["domo", "worker"],
        ["python", "majortomo_client.py"],
        ["python", "majortomo_client.py"],
        ["domo", "call"],
    ]
    _broker, endpoint = start_broker(processes, commands[0])
    commands = shell_commands("majortomo.sh", endpoint)
    old_worker = processes(*python_command(commands[1], majortomo_python))
    processes(*domo(commands[2]))
    wait_for_service(endpoint, "shout")
    wait_for_service(endpoint, "echo")
    mine = run(*python_command(commands[3], majortomo_python))
    assert (mine.returncode, mine.stdout) == (0, "HELLO!\n"), mine.stderr
    theirs = run(*python_command(commands[4], majortomo_python))
    assert (theirs.returncode, theirs.stdout) == (0, "hello\n"), theirs.stderr
    call = run(*domo(commands[5]))
    assert (call.returncode, call.stdout) == (0, "HI!\n"), call.stderr
    assert old_worker.stop(signal.SIGTERM) == 0, str(old_worker)
    gone = run(DOMO, "call", "mmi.service", "shout", "--connect", endpoint)
    assert gone.stdout == "404\n", gone


SLOW_MAJORTOMO_WORKER = """
import sys, time, majortomo
from majortomo.error import Disconnected
worker = majortomo.Worker(sys.argv[1], b"slow", heartbeat_interval=0.2, heartbeat_timeout=0.6)
worker.connect()
while True:
    try:
        client, body = worker.wait_for_request()
    except Disconnected:
        worker.connect(reconnect=True)
        continue
    time.sleep(1.0)  # longer than the broker's liveness x interval: 0.6 s
    worker.send_reply_final(client, body)
"""

SLOW_DOMO_WORKER = """
import sys, time
from domo.protocol import WorkerConfig
from domo.sync import run_worker
def slow(body):
    time.sleep(1.0)
    return body
run_worker(sys.argv[1], "slow", slow, config=WorkerConfig(heartbeat_interval=0.2, liveness=3))
"""


def test_majortomo_page_long_requests_claim(
    processes: Callable[..., Process], majortomo_python: str
) -> None:
    """from-majortomo.md, "long requests": a majortomo worker busy longer than liveness x
    interval is taken for dead by domo's broker (it sends no heartbeat while busy); a domo.sync
    worker with the same handler is not."""
    argv = ["domo", "broker", "--bind", "tcp://127.0.0.1:0"]
    broker, endpoint = start_broker(
        processes, [*argv, "--heartbeat-interval", "0.2", "--liveness", "3"]
    )
    call = [DOMO, "call", "slow", "x", "--connect", endpoint, "--timeout", "2", "--retries", "0"]
    majortomo = processes(majortomo_python, "-c", SLOW_MAJORTOMO_WORKER, endpoint)
    wait_for_service(endpoint, "slow")
    lost = run(*call)
    assert lost.returncode == 3, lost
    broker.line("WorkerExpired: .*'slow'", stream="err")
    majortomo.stop(signal.SIGKILL)
    processes(sys.executable, "-c", SLOW_DOMO_WORKER, endpoint)
    wait_for_service(endpoint, "slow")
    served = run(*call)
    assert (served.returncode, served.stdout) == (0, "x\n"), served
