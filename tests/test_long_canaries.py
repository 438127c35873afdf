"""Canary runs (make test-long): proof that the tests see what they claim to guard.

For each canary mutation (loglake/canary.py) the tests that guard the broken mechanism run in a
pytest subprocess with `LOGLAKE_CANARY=<name>`, and must FAIL: exit code 1 (test failures, not
a collection or usage error) with at least one of the selected tests named as failed — every one
of them for a canary whose tests each guard a different part of it or catch it in a different
way (`every`). A control run of
all the selections without any canary must pass, so a failure under a canary is the canary's.

`LOGLAKE_CANARY_REPORT=path.json` records, per canary, whether it was caught, the tests, the
ones that failed and the seconds taken (merged into the file, one entry per run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loglake import canary
from longreport import update_report

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parent.parent
REPORT_ENV = "LOGLAKE_CANARY_REPORT"
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Selection:
    tests: tuple[str, ...]
    why: str
    every: bool = False  # every test must fail (each guards a different part or way); else -x, any one


SELECTIONS: dict[str, Selection] = {
    "skip_wal_fsync": Selection(
        (
            "tests/test_crash_sweep.py::test_crash_at_every_mutating_call[clean]",
            "tests/test_txn_crash_sweep.py::test_crash_at_every_mutating_call_of_a_transaction[clean]",
        ),
        "a crash after an acked group finds its frames never reached the durable file (records, "
        "and the metadata log's topic and transaction records)",
        every=True,
    ),
    "ack_before_wal_write": Selection(
        (
            "tests/test_crash_sweep.py::test_crash_at_every_mutating_call[clean]",
            "tests/test_txn_crash_sweep.py::test_crash_at_every_mutating_call_of_a_transaction[clean]",
        ),
        "a crash between the ack and the WAL write loses an acknowledged record, and a committed "
        "transaction recovers without some of its acknowledged appends",
        every=True,
    ),
    "skip_crc_check": Selection(
        ("tests/test_corrupt_engine.py::test_a_read_stops_before_a_bad_batch_and_one_starting_there_fails",),
        "garbage inside a sealed batch is served instead of failing the read with CorruptBatchError",
    ),
    "skip_chain_check": Selection(
        (
            "tests/test_verify.py::test_refixed_crcs_are_caught_by_the_chain_hash",
            "tests/test_verify.py::test_recomputed_chain_hash_breaks_the_link_to_the_next_segment",
            "tests/test_corrupt_engine.py::test_the_scrubber_finds_a_segment_forged_with_refixed_crcs_by_its_chain_hash",
            "tests/test_corrupt_engine.py::test_relocation_never_uploads_a_hot_copy_forged_with_refixed_crcs",
        ),
        "a segment forged with re-fixed CRCs passes verify, the scrubber and the check before an "
        "upload (chain hash), and one with a recomputed chain hash no longer breaks the link to the "
        "next segment (prev_hash)",
        every=True,
    ),
    "delete_hot_before_cold_verified": Selection(
        (
            "tests/test_tiering.py::test_a_cold_copy_that_fails_verification_keeps_the_segment_hot_and_readable",
            "tests/test_tiering.py::test_crash_at_every_step_of_relocation_loses_no_segment[clean]",
        ),
        "a cold copy that fails verification leaves a hot segment with no hot copy, and so does a "
        "crash between the upload and the tier switch",
        every=True,
    ),
}

# pytest's short summary lines (-rfE): "FAILED tests/x.py::test_y[id] - reason"
_FAILED = re.compile(r"^FAILED (tests/\S+)", re.MULTILINE)
_ERROR = re.compile(r"^ERROR (tests/\S+)", re.MULTILINE)


@dataclass
class Run:
    exit_code: int
    failed: list[str]
    errors: list[str]
    seconds: float
    output: str


def run_pytest(tests: tuple[str, ...], canary_name: str | None, *, stop_at_first: bool) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in (canary.ENV, REPORT_ENV)}
    if canary_name is not None:
        env[canary.ENV] = canary_name
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *(["-x"] if stop_at_first else []), *tests]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # a hang is not a catch (exit code -1 in the report)
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Run(-1, [], [], time.perf_counter() - started, f"timed out after {RUN_TIMEOUT_S} s\n{out}")
    seconds = time.perf_counter() - started
    output = proc.stdout + proc.stderr
    return Run(proc.returncode, _FAILED.findall(proc.stdout), _ERROR.findall(proc.stdout), seconds, output)


def write_report(key: str, entry: dict[str, Any]) -> None:
    def change(doc: dict[str, Any]) -> None:
        names = doc.setdefault("canaries", {})
        if key == "control":
            doc["control"] = entry
        else:
            names[key] = entry
        doc["all_caught"] = set(names) == set(SELECTIONS) and all(v["caught"] for v in names.values())

    update_report(REPORT_ENV, change)


def test_every_canary_has_a_selection() -> None:
    assert set(SELECTIONS) == set(canary.NAMES)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_control_run_without_canaries_passes() -> None:
    tests = tuple(dict.fromkeys(t for s in SELECTIONS.values() for t in s.tests))
    run = run_pytest(tests, None, stop_at_first=False)
    write_report(
        "control",
        {"passed": run.exit_code == 0, "tests": list(tests), "seconds": round(run.seconds, 1), "exit_code": run.exit_code},
    )
    assert run.exit_code == 0, f"the selected tests fail without any canary:\n{run.output[-6000:]}"


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_canary_is_caught(name: str) -> None:
    selection = SELECTIONS[name]
    run = run_pytest(selection.tests, name, stop_at_first=not selection.every)
    failed = [n for n in run.failed if n in selection.tests]
    if selection.every:
        caught = run.exit_code == 1 and set(failed) == set(selection.tests)
    else:
        caught = run.exit_code == 1 and bool(failed)
    caught = caught and not run.errors
    write_report(
        name,
        {
            "caught": caught,
            "mutation": canary.NAMES[name],
            "tests": list(selection.tests),
            "failed": failed,
            "every": selection.every,
            "why": selection.why,
            "seconds": round(run.seconds, 1),
            "exit_code": run.exit_code,
        },
    )
    assert caught, (
        f"canary {name} was not caught: exit code {run.exit_code} (1 = tests failed), failed {run.failed}, "
        f"errors {run.errors}; the tests {list(selection.tests)} should fail because {selection.why}\n"
        f"{run.output[-6000:]}"
    )
