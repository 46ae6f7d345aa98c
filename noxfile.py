"""Automation for domo: ``nox`` runs lint, typecheck and tests; other sessions are named.

Sessions run on the interpreter nox itself runs on (CI has only Python 3.11); ``tests_all`` runs
the suite on every supported Python that is installed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "tests"]


class _NoUvNotice(logging.Filter):
    """Drops nox's "uv binary not found." line: nox probes for uv even when the backend is
    virtualenv, as here, and the line reads like a failure to newcomers. It is harmless: domo's
    sessions make their virtualenvs with virtualenv and install with pip."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


logging.getLogger("nox").addFilter(_NoUvNotice())

PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = ["3.11", "3.12", "3.13"]


# Most of the suite waits on the wall clock (fuzz time budgets, heartbeats, subprocesses) with
# the CPU idle, so it runs on pytest-xdist workers: -n 2 took the clean-clone CI run from X to Y
# on 2 cores. ``loadgroup``: any test on any worker, but the tests sharing one costly session
# fixture (tests/conftest.py's ONE_PER_RUN: the SparkSession, the peers' virtualenvs) together.
PARALLEL = ["-n", "2", "--dist", "loadgroup"]


def group(name: str) -> list[str]:
    """The requirements of one PEP 735 dependency group of pyproject.toml."""
    return list(nox.project.dependency_groups(PYPROJECT, name))


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite (Hypothesis profile ``ci`` when CI is set).

    trace: pyarrow, for tests/trace; spark: pyspark and the rest, for tests/spark (a local Spark
    on the machine's Java 17, a standalone cluster and a Spark Connect server started from
    pyspark's own scripts; those tests skip with the reason where pyspark is missing);
    connect: the Spark Connect client (gRPC), for tests/spark/test_connect.py;
    metrics: prometheus-client, for tests/test_metrics.py; nng: pynng and cbor2, for memo01
    (tests/protocol/test_memo01*.py, tests/nng); uvloop: domo.asyncio on uvloop's loop
    (tests/runtimes/test_uvloop.py).

    On ``PARALLEL`` pytest-xdist workers (``-- -n 0`` for one process; later options win).
    """
    session.install("-e", ".[trace,spark,connect,metrics,nng,uvloop]", *group("test"))
    session.run("pytest", *PARALLEL, *session.posargs)


@nox.session(python=SUPPORTED)
def tests_all(session: nox.Session) -> None:
    """The test suite on each supported Python."""
    session.install("-e", ".", *group("test"))
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install(*group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src, tests and this file (uvloop: benchmarks/_peers.py imports it)."""
    session.install("-e", ".[metrics,nng,uvloop]", *group("typecheck"))
    session.run("mypy", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Plant each bug of tests/mutants/mutants.toml in a copy of the core; the suite must fail.

    nng: the memo01 mutants (tests/mutants/memo01.toml) are killed by tests that need cbor2.
    """
    session.install("-e", ".[nng]", *group("test"))
    session.run("python", "tests/mutants/run.py", *session.posargs)


@nox.session
def fuzz_planted(session: nox.Session) -> None:
    """`domo fuzz` against every planted broker of every dialect, worker and client (40 s each,
    seed 1) and domo's own peers as controls: the find rates and control runs of docs/fuzz.md
    (`-- --hog 2` for the controls under two CPU hogs, `-- --dialects mdp02 emqp` for some)."""
    session.install("-e", ".", *group("test"))
    session.run("python", "tests/fuzz/measure_planted.py", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """The chaos harness's long form: 10,000 requests while workers are SIGKILLed every ~0.5 s
    and the broker is SIGKILLed and restarted; 0 lost, 0 duplicated; then an honest client under a
    garbage flood from two processes (about 1,000,000 junk messages), and beside one client, then
    four, that never read their 1 MiB replies; 10,000 durable requests (Titanic) under SIGKILLs
    and a Binary Star pair killed and stopped; then the hostile-peer probes of every endpoint and
    dialect (tests/chaos/hostile.py --long: authentication, floods of a minute, a busy memo01
    worker killed, drain; docs/security.md, docs/reliability.md).
    Options after ``--`` go to tests/chaos/harness.py (``--requests N``, ``--seed N``, ...)."""
    session.install("-e", ".[nng,metrics]", *group("test"))
    session.run("python", "tests/chaos/harness.py", "--requests", "10000", *session.posargs)
    session.run("python", "tests/chaos/flood.py", "--seconds", "20", "--flooders", "2")
    session.run("python", "tests/chaos/slow_reader.py", "--seconds", "10")
    session.run("python", "tests/chaos/slow_reader.py", "--seconds", "10", "--readers", "4")
    # Durable requests (issue 26): 10,000 through Titanic while broker, Titanic and workers are
    # SIGKILLed; a Binary Star pair's primary SIGKILLed, then SIGSTOPped (docs/reliability.md).
    session.run("python", "tests/chaos/titanic_chaos.py", "--requests", "10000")
    session.run("python", "tests/chaos/binary_star.py", "--requests", "1000")
    session.run("python", "tests/chaos/hostile.py", "--long")


@nox.session
def soak(session: nox.Session) -> None:
    """The soak: 2,000 clients and 500 workers through one broker for 30 minutes; nothing lost,
    nothing duplicated, flat RSS (docs/reliability.md). ``nox -s soak -- --minutes 2`` for a
    short form; options after ``--`` go to tests/chaos/soak.py."""
    session.install("-e", ".", *group("test"))
    session.run("python", "tests/chaos/soak.py", *session.posargs)


@nox.session
def stateful_long(session: nox.Session) -> None:
    """The Hypothesis state machines of the core with the ``long`` profile."""
    session.install("-e", ".", *group("test"))
    session.run("pytest", "tests/protocol", "--hypothesis-profile=long", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark script in benchmarks/ (not ``_*.py``); e.g. ``nox -s bench -- --quick``.

    Options after ``--`` go to every script (each takes ``--quick``, ``--reps N``, ``--json FILE``).
    ``brokers.py`` makes ``.bench-venvs/majortomo`` (majortomo 0.2.0 and six, never a domo
    dependency) on first use; matplotlib draws its plot and is installed here only.
    """
    # trace: trace_overhead.py; spark: report_bench.py and call_service_bench.py;
    # nng: memo01_bench.py
    session.install("-e", ".[trace,spark,nng]", "matplotlib")
    for script in sorted(Path("benchmarks").glob("[!_]*.py")):
        session.run("python", str(script), *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """``domo fuzz`` against majortomo's broker, worker and client, EventMQ 0.3.13's router
    (``--dialect emqp``), and domo's own; not in CI.

    Rewrites ``docs/conformance.json``, ``docs/conformance-emqp.json`` and the tables of
    ``docs/conformance.md``. majortomo 0.2.0 (with ``six``, which it needs) lives in
    ``.bench-venvs/majortomo``, made here with ``python -m venv`` and pip if missing (the
    benchmarks share it); EventMQ 0.3.13 in ``tmp/cache/eventmq-0.3.13``, made by
    ``tests/interop/eventmq_venv.py`` with the pins the interop tests use (they share it). Neither
    is ever a domo dependency. Options after ``--`` go to ``conformance/run.py``, e.g. ``nox -s
    conformance -- --targets broker --time-budget 30`` or ``-- --dialects emqp``.
    """
    session.install("-e", ".[fuzz]")
    venv = Path(".bench-venvs") / "majortomo"
    python = venv / "bin" / "python"
    if not python.exists():
        session.run("python", "-m", "venv", str(venv))
        session.run(
            str(python), "-m", "pip", "install", "-q", "majortomo==0.2.0", "six", external=True
        )
    eventmq = session.run("python", "tests/interop/eventmq_venv.py", silent=True, external=True)
    eventmq_python = str(eventmq).strip().splitlines()[-1] if eventmq else ""
    session.run(
        "python",
        "conformance/run.py",
        "--majortomo-python",
        str(python),
        "--eventmq-python",
        eventmq_python,
        *session.posargs,
    )


@nox.session
def docs(session: nox.Session) -> None:
    """Build the site in strict mode (any warning fails), run the tutorials' code, and open
    every page from build/site/ by file:// URLs, as a reader does, in headless Debian Chromium
    (installed with apt-get when missing, as is npm for the search shim).

    Screenshots land in build/site-check/.
    """
    # trace: the operating tutorial reads a broker's --trace-dir with pyarrow; metrics: the API
    # reference of domo.metrics; spark: a `domo report --html` page for the browser check.
    session.install("-e", ".[trace,metrics,spark]", *group("docs"), *group("test"))
    if shutil.which("npm") is None:
        # docs/_hooks/offline_search.py takes search's iframe-worker shim from npm (npm pack),
        # so that the site searches opened from its folder and loads nothing from elsewhere.
        session.run("apt-get", "update", "-qq", external=True)
        session.run(
            "apt-get", "install", "-y", "-qq", "npm", external=True,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "tests/docs", "-q", *session.posargs)
    # The HTML page domo itself produces, checked and screenshotted beside the site's pages
    # (tests/docs/site_check.toml): a report over synthetic traces in the schema the broker writes.
    sample = Path("build/report-sample")
    shutil.rmtree(sample, ignore_errors=True)
    session.run("python", "benchmarks/_gen_traces.py", "--rows", "20000", str(sample / "traces"))
    session.run("domo", "report", str(sample / "traces"), "--html", str(sample / "report.html"))
    if not Path("/usr/bin/chromium").exists() or not Path("/usr/bin/chromedriver").exists():
        # Debian's browser and driver, never a browser download of a library's own.
        session.run("apt-get", "update", "-qq", external=True)
        session.run(
            "apt-get",
            "install",
            "-y",
            "-qq",
            "chromium",
            "chromium-driver",
            external=True,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
    session.run("pytest", "tests/docs/check_site_browser.py", "-q", *session.posargs)
