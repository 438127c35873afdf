"""README.md's "Requirements": without etcd or Java the tests that need them are skipped and the
run's closing summary says so in one line; under CI (`CI=true`) they fail instead
(tests/conftest.py). Run as a real pytest subprocess on a PATH without etcd, java and kcat."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: One test that needs etcd, one that needs Java (the parametrized etcd test counts twice).
NEEDS_TOOLS = [
    "tests/test_meta_etcd.py::test_records_apply_and_replay_after_reopen",
    "tests/test_spark_read.py::test_batch_read_equals_produced",
]
HIDDEN = {"etcd", "java", "kcat"}


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PATH as now, less etcd, java and kcat: a directory of links to everything else on it."""
    bare = tmp_path_factory.mktemp("bin")
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name not in HIDDEN and not (bare / name).exists():
                (bare / name).symlink_to(Path(directory) / name)
    return f"{Path(sys.executable).parent}{os.pathsep}{bare}"


def run_without_tools(bare_path: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "JAVA_HOME", "PYTEST_XDIST_WORKER")}
    env["PATH"] = bare_path
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *NEEDS_TOOLS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )


def test_missing_tools_skip_locally_with_one_loud_line(bare_path: str) -> None:
    result = run_without_tools(bare_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 skipped" in result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("NOT THE FULL SUITE: ")]
    assert "etcd is not installed" in line and "2 test(s) skipped" in line
    assert "java is not installed (Java 17+ for Spark" in line and "1 test(s) skipped" in line


def test_missing_tools_fail_under_ci(bare_path: str) -> None:
    result = run_without_tools(bare_path, "true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "skipped" not in result.stdout.splitlines()[-1]
    assert "3 errors" in result.stdout.splitlines()[-1]
    assert "under CI (CI=true) a test may not skip for a missing tool: etcd is not installed" in result.stdout
    assert "under CI (CI=true) a test may not skip for a missing tool: java is not installed" in result.stdout
