"""One table of a segment's life (`loglake.meta.lifecycle`): its moves, its refusals, and no tier
name spelled anywhere else in src/."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

import loglake
from loglake.engine import Engine
from loglake.meta import lifecycle
from loglake.meta.lifecycle import TRANSITIONS, IllegalSegmentMove, Stage, Tier, move
from loglake.meta.records import encode_record
from loglake.meta.segments import ENTRY, SegmentRef, SegmentTable
from loglake.meta.state import MetaState
from loglake.store.memory import MemoryStore

from enginekit import abandon, small_config

SRC = Path(loglake.__file__).parent
OWNER = Path(lifecycle.__file__)
#: The tier names as metadata records and checkpoints spell them.
TIER_NAMES = {"hot", "cold"}
#: file (relative to src/loglake) -> reason a tier word may be spelled there (user-facing text
#: that happens to be the same word). None today.
ALLOWED: dict[str, str] = {}

FINAL = {Stage.REPLACED, Stage.DELETED}


def tier_literals(source: str, filename: str) -> list[str]:
    """`file:line 'word'` for every string constant that is exactly a tier name."""
    return [
        f"{filename}:{node.lineno} {node.value!r}"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TIER_NAMES
    ]


def test_no_module_outside_the_lifecycle_spells_a_tier() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if path != OWNER and rel not in ALLOWED:
            found += tier_literals(path.read_text(), rel)
    assert found == []


def test_the_scan_finds_a_tier_spelled_in_code_but_not_in_prose() -> None:
    source = '"""Segments are "hot" or "cold"."""\nif seg.tier == "cold":\n    store = {"hot": 1}\nlog(f"{x} went cold")\n'
    assert tier_literals(source, "m.py") == ["m.py:2 'cold'", "m.py:3 'hot'"]


def test_tier_values_are_the_names_on_disk() -> None:
    assert [t.value for t in Tier] == ["hot", "cold"]
    assert json.dumps({"tier": Tier.COLD}) == '{"tier": "cold"}'
    assert encode_record("segment_tier", {"id": "00", "p": 0, "base": 5, "tier": Tier.COLD}) == encode_record(
        "segment_tier", {"id": "00", "p": 0, "base": 5, "tier": "cold"}
    )


def _ref(base: int, tier: Tier) -> SegmentRef:
    return SegmentRef(base, base + 9, "k", 100, 0, 10, b"\0" * 32, b"\1" * 32, 0, tier)


def test_records_of_the_previous_release_load_with_their_tier() -> None:
    """A segment_published seg list and a segment_tier body as written before `Tier` existed."""
    state = MetaState("c")
    tid = "ab" * 16
    state.apply("topic_created", {"name": "t", "id": tid, "partitions": 1, "config": {}, "created_ms": 0})
    seg = [0, 9, 100, 0, 10, "00" * 32, "11" * 32, 0, "hot"]  # 9 fields: before rewrites existed
    state.apply("segment_published", {"id": tid, "p": 0, "seg": seg, "producers": []})
    table = state.partition(bytes.fromhex(tid), 0).segments
    assert table[0].tier is Tier.HOT
    state.apply("segment_tier", {"id": tid, "p": 0, "base": 0, "tier": "cold"})
    assert table[0].tier is Tier.COLD
    assert table[0].to_json()[8] == "cold"
    with pytest.raises(ValueError, match="tier"):
        SegmentRef.from_json("k", [*seg[:8], "lukewarm"])


def test_a_checkpoint_entry_stores_the_tier_as_its_code() -> None:
    table = SegmentTable("p/")
    table.append(_ref(0, Tier.HOT))
    table.append(_ref(10, Tier.COLD))
    assert [table.raw()[i * ENTRY.size + 48] for i in range(2)] == [0, 1]  # the tier byte: 0 hot, 1 cold
    assert [s.tier for s in SegmentTable("p/", table.raw())] == [Tier.HOT, Tier.COLD]
    assert table.indexes_in_tier(Tier.COLD) == [1]


def test_the_table_holds_the_moves_of_a_segments_life() -> None:
    assert set(TRANSITIONS) == {
        (Stage.ACTIVE, Stage.SEALED),
        (Stage.SEALED, Stage.HOT),
        (Stage.SEALED, Stage.COLD),
        (Stage.SEALED, Stage.DELETED),
        (Stage.HOT, Stage.RELOCATING),
        (Stage.RELOCATING, Stage.COLD),
        (Stage.RELOCATING, Stage.HOT),
        (Stage.RELOCATING, Stage.REPLACED),
        (Stage.RELOCATING, Stage.DELETED),
        (Stage.HOT, Stage.COLD),
        (Stage.HOT, Stage.REPLACED),
        (Stage.COLD, Stage.REPLACED),
        (Stage.HOT, Stage.DELETED),
        (Stage.COLD, Stage.DELETED),
    }
    assert all(TRANSITIONS.values())  # every move names who makes it


def test_every_stage_is_reached_from_active_and_every_segment_ends() -> None:
    def reach(start: Stage) -> set[Stage]:
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for frm, to in TRANSITIONS:
                if frm is here and to not in seen:
                    seen.add(to)
                    todo.append(to)
        return seen

    assert reach(Stage.ACTIVE) == set(Stage)
    for stage in Stage:
        assert reach(stage) & FINAL, stage
    assert all(frm not in FINAL for frm, _to in TRANSITIONS)  # nothing comes back


@pytest.mark.parametrize(("frm", "to"), sorted(TRANSITIONS, key=str))
def test_each_move_of_the_table_is_allowed(frm: Stage, to: Stage) -> None:
    assert move(frm, to) is to


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        (Tier.COLD, Tier.HOT),  # no rehydration: cold data is read in place
        (Tier.COLD, Tier.COLD),  # a second switch of a relocated segment
        (Stage.DELETED, Tier.COLD),  # retention got there first
        (Stage.REPLACED, Stage.DELETED),
        (Stage.ACTIVE, Tier.HOT),  # published before its object exists
    ],
)
def test_an_illegal_move_raises_a_typed_error(frm: Tier | Stage, to: Tier | Stage) -> None:
    with pytest.raises(IllegalSegmentMove, match="cannot move") as info:
        move(frm, to, "seg-key")
    assert (info.value.frm, info.value.to) == (lifecycle.stage_of(frm), lifecycle.stage_of(to))
    assert "seg-key" in str(info.value)


def test_the_catalog_refuses_a_second_relocation_before_recording_it(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=MemoryStore(), start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "1"})
        for i in range(40):
            engine.append_records("t", 0, [(int(time.time() * 1000), None, b"%06d" % i * 50, [])]).result()
        engine.flush()
        assert engine.relocate_due() >= 1
        cold = engine.segments("t", 0)[0]
        assert cold.tier is Tier.COLD
        p = engine.catalog.partition("t", 0)
        seq = engine.catalog.state.seq
        with p.lock, pytest.raises(IllegalSegmentMove, match="COLD to COLD"):
            engine.catalog.record_tier(p, cold.base_offset, Tier.COLD)
        with p.lock, pytest.raises(IllegalSegmentMove, match="DELETED to COLD"):
            engine.catalog.record_tier(p, cold.base_offset + 1, Tier.COLD)  # no segment starts there
        assert engine.catalog.state.seq == seq  # nothing was recorded
        assert engine.segments("t", 0)[0].tier is Tier.COLD
    finally:
        abandon(engine)
