"""Crash-point sweep over the rewrite swap: compaction and merging.

A workload produces keyed updates and seals them (no crash there), then compacts or merges.
The sweep crashes at every mutating filesystem call k of that last part, with and without a
torn last write, recovers, and checks:

* `verify_data_dir` finds no error, and no unreferenced object is left in the hot store;
* the read equals one of the states an uncrashed run goes through (before the swap, or after
  one of its passes): a swap is all or nothing;
* in any case the newest value of every key is there, and every record read was there before
  at the same offset;
* recovering again changes nothing, and cleaning on from the recovered state reaches the
  uncrashed run's final state.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any
from unittest import mock

import pytest

from loglake.engine import Engine
from loglake.engine import compaction as compaction_mod
from loglake.engine.verify import verify_data_dir
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.records.compression import CODEC_GZIP

from enginekit import DATA_DIR, abandon, read_all, small_config

TOPIC = "t"
START_MS = 1_700_000_000_000

Records = list[tuple[int, bytes | None, bytes | None]]


class Case:
    """One workload: topic config, engine config, what is produced, and the cleaning step."""

    def __init__(
        self, name: str, topic_config: dict[str, str], tiny_map: bool = False, **engine_config: Any
    ) -> None:
        self.name = name
        self.topic_config = topic_config
        self.tiny_map = tiny_map
        self.engine_config = {"cleaner_threads": 0, "cleaner_dedupe_buffer_bytes": 1 << 20, **engine_config}

    def engine(self, fs: FaultyFileSystem) -> Engine:
        return Engine(
            DATA_DIR,
            small_config(merge_min_age_ms=0, **self.engine_config),
            fs=fs,
            clock=lambda: START_MS / 1000,
            start_background=False,
        )

    def produce(self, engine: Engine) -> None:
        engine.create_topic(TOPIC, 1, self.topic_config)
        for i in range(36):
            key = f"key-{(i * 5) % 9}".encode()
            value = None if i % 10 == 9 else f"value-{i}".encode() * 8
            codec = CODEC_GZIP if i % 4 == 0 else None
            engine.append_records(TOPIC, 0, [(None, key, value, [])], compression=codec).result()
        engine.flush()

    def clean(self, engine: Engine, on_pass: Callable[[], None]) -> None:
        """Compact (or merge) until nothing is left to do; `on_pass` after each rewrite round."""
        patch = (
            mock.patch.object(compaction_mod, "KEY_ENTRY_BYTES", 250_000) if self.tiny_map else nullcontext()
        )
        with patch:
            for _ in range(50):
                if engine.compact(TOPIC) == 0:
                    return
                on_pass()
        raise AssertionError("cleaning did not settle")


CASES = [
    Case("compact", {"cleanup.policy": "compact", "segment.records": "6"}, merge_min_segments=0),
    Case(
        "compact-multipass",
        {"cleanup.policy": "compact", "segment.records": "6"},
        tiny_map=True,
        merge_min_segments=0,
    ),
    Case("compact-and-merge", {"cleanup.policy": "compact", "segment.records": "3"}, merge_min_segments=3),
    Case("merge", {"cleanup.policy": "delete", "segment.records": "2"}, merge_min_segments=4),
]


def run(
    case: Case, fs: FaultyFileSystem, crash_at: int | None = None, states: list[Records] | None = None
) -> int:
    """The workload until done or crashed at the `crash_at`-th mutating call of the cleaning
    part (counted from there: how many calls producing takes may vary with thread timing).
    Returns how many calls cleaning made. `states` collects the read after each round."""
    engine = case.engine(fs)
    engine.open()
    case.produce(engine)
    before = fs.mutating_calls
    if crash_at is not None:
        fs.crash_after = before + crash_at
    try:
        if states is not None:
            states.append(read_all(engine, TOPIC)[0])
        case.clean(engine, lambda: states.append(read_all(engine, TOPIC)[0]) if states is not None else None)
        engine.close()
    except (SimulatedCrash, Exception):
        abandon(engine)
    return fs.mutating_calls - before


def reference(case: Case) -> tuple[int, list[Records]]:
    """The mutating calls cleaning makes, and the states an uncrashed run reads."""
    states: list[Records] = []
    calls = run(case, FaultyFileSystem(seed=1), states=states)
    assert len(states) >= 2, f"{case.name}: the reference run did not clean"
    return calls, states


REFERENCE = {case.name: reference(case) for case in CASES}


def recover(case: Case, fs: FaultyFileSystem) -> tuple[Engine, Records]:
    engine = case.engine(fs)
    engine.open()
    return engine, read_all(engine, TOPIC)[0]


def check_state(case: Case, k: int, torn: bool, engine: Engine, state: Records) -> None:
    _calls, states = REFERENCE[case.name]
    where = f"{case.name} k={k} torn={torn}"
    report = verify_data_dir(engine)
    assert report.ok and not report.errors, f"{where}: {report.errors}"
    assert not report.unreferenced, f"{where}: unreferenced objects after recovery: {report.unreferenced}"
    original = {o: (key, v) for o, key, v in states[0]}
    offsets = [o for o, _k, _v in state]
    assert offsets == sorted(set(offsets)), f"{where}: offsets not strictly increasing"
    for o, key, v in state:
        assert original.get(o) == (key, v), f"{where}: record at {o} was not there before"
    latest = {key: o for o, key, v in states[-1]}
    for key, o in latest.items():
        assert any(r[0] == o for r in state), f"{where}: newest record of {key!r} (offset {o}) missing"
    assert state in states, f"{where}: the recovered read is none of the uncrashed run's states"


def check(case: Case, k: int, torn: bool) -> None:
    fs = FaultyFileSystem(seed=k)
    run(case, fs, crash_at=k)
    after = fs.crash(torn=torn)
    engine, state = recover(case, after)
    try:
        check_state(case, k, torn, engine, state)
    finally:
        abandon(engine)
    # Recovering the recovered state again changes nothing; cleaning on from it ends where an
    # uncrashed run ends.
    again = after.crash()
    engine, state2 = recover(case, again)
    try:
        assert state2 == state, f"{case.name} k={k} torn={torn}: second recovery differs from the first"
        case.clean(engine, lambda: None)
        assert read_all(engine, TOPIC)[0] == REFERENCE[case.name][1][-1], (
            f"{case.name} k={k}: cleaning on differs"
        )
        check_state(case, k, torn, engine, read_all(engine, TOPIC)[0])
        engine.close()
    except BaseException:
        abandon(engine)
        raise


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_run_is_deterministic_and_cleans(case: Case) -> None:
    calls, states = REFERENCE[case.name]
    again: list[Records] = []
    assert run(case, FaultyFileSystem(seed=2), states=again) == calls and again == states
    assert calls >= 8, f"{case.name}: only {calls} mutating calls while cleaning"
    if case.name == "merge":
        assert all(s == states[0] for s in states)
    else:
        assert len(states[-1]) < len(states[0])
    if case.tiny_map:
        assert len(states) > 3, "the tiny key map should take several passes"


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_crash_at_every_mutating_call_while_cleaning(case: Case, torn: bool) -> None:
    calls, _states = REFERENCE[case.name]
    for k in range(1, calls + 1):
        check(case, k, torn)
