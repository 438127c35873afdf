"""Shared fixtures. `spark`: one local[2] SparkSession per test run, built only when a test asks.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`), scheduled here
in groups: every test of a module runs on one worker, in file order, so a module-scoped broker
starts once and tests that build on their module's earlier tests (the docs' shell session) keep
that order; every Spark test (a test_spark_* module, or a test named test_spark_*) goes to one
group, so the run still builds a single SparkSession and never runs two JVMs at once. The
longest groups go out first (GROUP_SECONDS). xdist's own
loadgroup (`xdist_group` marks) cannot do this under pytest 9: it renames items through
`item._nodeid`, which pytest 9 no longer reads, so the marks are silently ignored.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from etcdkit import ETCD_BINARY, ETCD_MISSING

# Every ranked lock checks the lock order in tests (loglake.locks), brokers the tests start too.
os.environ.setdefault("LOGLAKE_LOCK_ORDER", "check")
# Brokers the tests start answer a new group's first JoinGroup at once, as Kafka's own shipped
# server.properties does for development: the default 3 s initial rebalance delay (Kafka's too)
# is a wait, per new classic group, in hundreds of tests (38 s of test_cli_remote's 135 s).
# The delay itself is tested where it is the subject (test_groups, with its own setting).
os.environ.setdefault("LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")

#: Under CI (`CI=true`, as .ci/run sets and CI services do) a test skipped because a tool of the
#: full suite is missing FAILS: a CI run that quietly left out the cluster or Spark tests would
#: pass with a part of the suite. Locally the skips stay, and the closing summary names the tools.
UNDER_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
#: The Java the Spark tests need (PySpark 4 runs on Java 17 and later).
JAVA_MIN = 17
KCAT_BINARY = shutil.which("kcat")


@functools.cache
def java_missing() -> str | None:
    """Why the Spark tests cannot start a JVM here, or None."""
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get("JAVA_HOME") else None
    java = java or shutil.which("java")
    if java is None:
        return f"java is not installed (Java {JAVA_MIN}+ for Spark: Debian package openjdk-{JAVA_MIN}-jre-headless)"
    shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    found = re.search(r'version "(?:1\.)?(\d+)', shown)
    if found is None or int(found.group(1)) < JAVA_MIN:
        return f"java at {java} is not Java {JAVA_MIN}+ ({shown.strip().splitlines()[0] if shown.strip() else 'no version'})"
    return None


def missing_tools() -> dict[str, str]:
    """The full suite's tools that this machine lacks, each with how to get it (README.md,
    "Requirements"): a skip whose reason names one of them is a test this run left out."""
    missing = {}
    if ETCD_BINARY is None:
        missing["etcd"] = ETCD_MISSING
    if (java := java_missing()) is not None:
        missing["java"] = java
    if KCAT_BINARY is None:
        missing["kcat"] = "kcat is not installed (Debian package kcat; .ci/run installs it)"
    return missing


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def _left_out_for(report: pytest.TestReport) -> str | None:
    """The missing tool a skipped test was skipped for, or None."""
    if not report.skipped:
        return None
    reason = _skip_reason(report)
    return next((tool for tool in missing_tools() if re.search(rf"\b{tool}\b", reason, re.IGNORECASE)), None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    tool = _left_out_for(report) if UNDER_CI else None
    if tool is not None:
        report.outcome = "failed"
        report.longrepr = f"under CI (CI={os.environ['CI']}) a test may not skip for a missing tool: {missing_tools()[tool]}"
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One loud line when tests were left out because a tool is missing (the skips themselves are
    in -ra's list, easy to miss among the rest)."""
    left_out: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        tool = _left_out_for(report)
        if tool is not None:
            left_out[tool] = left_out.get(tool, 0) + 1
    if left_out:
        missing = missing_tools()
        what = "; ".join(f"{missing[tool]}: {n} test(s) skipped" for tool, n in sorted(left_out.items()))
        terminalreporter.write_line(
            f"NOT THE FULL SUITE: {what} (README.md, Requirements; under CI=true these fail)", red=True, bold=True
        )

#: The xdist group of every test that needs Spark.
SPARK_GROUP = "spark"
#: With this set to a directory, each pytest process counts the broker processes it starts
#: (`loglake serve` children) and writes the count there at the end (docs/ARCHITECTURE.md quotes
#: the total for `make test`).
COUNT_BROKERS_ENV = "LOGLAKE_COUNT_BROKERS"


def _is_broker_command(args: object) -> bool:
    if not isinstance(args, (list, tuple)):
        return False
    words = [str(a) for a in args]
    return "serve" in words and any(w.endswith(("loglake", "loglake.cli.main")) for w in words)


def pytest_configure(config: pytest.Config) -> None:
    where = os.environ.get(COUNT_BROKERS_ENV)
    if not where:
        return
    import atexit
    import subprocess

    started = [0]
    original = subprocess.Popen.__init__

    def counting(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        if _is_broker_command(args):
            started[0] += 1
        original(self, args, *rest, **kw)

    subprocess.Popen.__init__ = counting  # type: ignore[method-assign]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")

    def write() -> None:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, f"{worker}-{os.getpid()}.count"), "w") as fh:
            fh.write(f"{started[0]}\n")

    atexit.register(write)


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under `make test`: "spark" or its module's path."""
    module, _, rest = nodeid.partition("::")
    if module.rsplit("/", 1)[-1].startswith("test_spark_") or rest.startswith("test_spark"):
        return SPARK_GROUP
    return module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for `spark` must land in the Spark group, or a second worker would start
    a second SparkSession."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) and xdist_group(item.nodeid) != SPARK_GROUP:
            raise pytest.UsageError(
                f"{item.nodeid} uses the spark fixture: put it in a test_spark_* module or name it "
                "test_spark_* so that `make test` runs it with the other Spark tests (tests/conftest.py)"
            )


#: Seconds each of the longest groups took in a run of `make test` (per group, the sum of its
#: tests' setup, call and teardown; 2 cores, three workers, commit 028f873 on a quiet machine:
#: 2,730 s of work in 937 s), longest first. The scheduler starts these first:
#: a worker that picks up a long module near the end would run alone for its whole length while
#: the others have finished. Only the order of the run depends on it: a stale or missing entry
#: costs minutes, never a test. Refresh it from a run's junit XML with scripts/test_groups.py.
GROUP_SECONDS: dict[str, float] = {
    "spark": 525,
    "tests/test_cli_remote.py": 210,
    "tests/test_cluster_faults.py": 142,
    "tests/test_docs.py": 129,
    "tests/test_share_groups.py": 112,
    "tests/test_broker_groups.py": 88,
    "tests/test_broker_clients.py": 79,
    "tests/test_broker_quotas.py": 79,
    "tests/test_cluster_netsplit.py": 75,
    "tests/test_fetch_limits.py": 66,
    "tests/test_cluster_health.py": 58,
    "tests/test_compaction_clients.py": 50,
    "tests/test_compaction_crash.py": 42,
    "tests/test_cluster_serve.py": 41,
    "tests/test_broker_kip848.py": 41,
    "tests/test_acked_end.py": 35,
    "tests/test_broker_txn_clients.py": 30,
}


def schedule_order(counts: dict[str, int]) -> list[str]:
    """The order the groups (with their test counts) go out to the workers: the groups of
    GROUP_SECONDS longest first, then the others by test count, the largest first."""
    return sorted(counts, key=lambda g: (-GROUP_SECONDS.get(g, 0.0), -counts[g]))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, only called when it runs the suite
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Whole groups to a worker, the longest first (`schedule_order`)."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # xdist has filled its queue (by test count) before the first unit goes out: put it
            # in our order once, then let xdist hand out units from its front as ever.
            if not self.ordered:
                self.ordered = True
                for group in schedule_order({g: len(ids) for g, ids in self.workqueue.items()}):
                    self.workqueue.move_to_end(group)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark_sql = pytest.importorskip(
        "pyspark.sql", reason="pyspark is not installed (pip install loglake[spark])"
    )
    if (java := java_missing()) is not None:
        pytest.skip(java)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        pyspark_sql.SparkSession.builder.master("local[2]")
        .appName("loglake-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
