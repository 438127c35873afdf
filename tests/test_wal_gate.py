"""WalRollGate: a WAL writer about to roll waits while the WAL is over its replay bound plus the
slack, until the seals let files go — or its stop is asked, or WAL_ROLL_WAIT_S_MAX passes."""

from __future__ import annotations

import threading
import time

import pytest

from loglake.engine.wal_gate import WAL_ROLL_SLACK_FILES, WalRollGate

FILE = 1000
BOUND = 10 * FILE
SHARDS = 2
LIMIT = BOUND + WAL_ROLL_SLACK_FILES * SHARDS * FILE


def test_under_the_limit_a_roll_does_not_wait() -> None:
    gate = WalRollGate(lambda: LIMIT - FILE, BOUND, FILE, SHARDS)
    assert gate.limit == LIMIT
    gate(lambda: False)
    assert (gate.waits, gate.overruns) == (0, 0)


def test_over_the_limit_a_roll_waits_until_files_go() -> None:
    held = [LIMIT]
    gate = WalRollGate(lambda: held[0], BOUND, FILE, SHARDS, wait_s_max=30.0)
    threading.Timer(0.2, lambda: held.__setitem__(0, BOUND)).start()  # a seal lets files go
    started = time.monotonic()
    gate(lambda: False)
    waited = time.monotonic() - started
    assert 0.15 <= waited < 10.0
    assert (gate.waits, gate.overruns) == (1, 0)
    assert gate.waited_s == pytest.approx(waited, abs=0.05)


def test_a_stopping_writer_does_not_wait() -> None:
    gate = WalRollGate(lambda: 10 * LIMIT, BOUND, FILE, SHARDS, wait_s_max=30.0)
    started = time.monotonic()
    gate(lambda: True)
    assert time.monotonic() - started < 1.0
    assert gate.overruns == 0


def test_seals_that_never_finish_cost_a_bounded_wait_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    gate = WalRollGate(lambda: 10 * LIMIT, BOUND, FILE, SHARDS, wait_s_max=0.1)
    for _ in range(3):
        started = time.monotonic()
        gate(lambda: False)
        assert 0.1 <= time.monotonic() - started < 5.0
    assert (gate.waits, gate.overruns) == (3, 3)
    warnings = [r for r in caplog.records if "rolling anyway" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: not one line per roll
