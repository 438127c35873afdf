"""The metadata's copy in the object stores: incremental pieces and checkpoints, bounded reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loglake.broker.groups.meta_store import MetaGroupLog
from loglake.engine import Engine, EngineConfig
from loglake.fs import OsFileSystem
from loglake.meta.checkpoint import capture
from loglake.meta.publish import META_PUBLISH_PIECES_MAX, read_remote_state
from loglake.meta.records import Acked
from loglake.store.local import LocalStore


def image(state: Any) -> Any:
    img = capture(state)
    return img.doc, b"".join(img.tables)


def open_engine(tmp_path: Path, **config: Any) -> tuple[Engine, LocalStore]:
    bucket = LocalStore(str(tmp_path / "bucket"), OsFileSystem())
    engine = Engine(
        str(tmp_path / "data"),
        EngineConfig(wal_shards=1, **config),
        cold_store=bucket,
        start_background=False,
    )
    engine.open()
    return engine, bucket


def meta_objects(bucket: LocalStore) -> dict[str, int]:
    return {k: bucket.head(k) or 0 for k in bucket.list("loglake-") if "/meta/" in k}


def test_a_seal_publishes_a_small_piece_not_the_whole_state(tmp_path: Path) -> None:
    engine, bucket = open_engine(tmp_path, meta_checkpoint_records=10_000)
    puts: list[tuple[str, int]] = []
    real_put = bucket.put

    def spy(key: str, parts: Any) -> None:
        puts.append((key, sum(len(p) for p in parts)))
        real_put(key, parts)

    bucket.put = spy  # type: ignore[method-assign]
    try:
        engine.create_topic("t", 1, {"segment.records": "1", "hot.retain.segments": "1000000"})
        for i in range(300):
            engine.append_records("t", 0, [(1, None, f"v{i}".encode(), [])]).result()
            engine.flush()  # one seal, one publish
        meta_puts = [(k, n) for k, n in puts if "/meta/" in k]
        # The data directory's first checkpoint goes up once; after that, only log pieces.
        assert len([k for k, _n in meta_puts if "/meta/checkpoint-" in k]) == 1
        pieces = [n for k, n in meta_puts if "/meta/log-" in k]
        large = [n for n in pieces if n >= 2048]  # merges of the pieces since the checkpoint
        assert len(pieces) >= 300 and len(large) <= len(pieces) // META_PUBLISH_PIECES_MAX + 1
        objects = meta_objects(bucket)
        # 300 seals, no checkpoint since the first: pieces were merged, never more than the bound.
        assert sum("/meta/log-" in k for k in objects) <= META_PUBLISH_PIECES_MAX + 1
        assert sum("/meta/checkpoint-" in k for k in objects) == 1
        remote = read_remote_state(bucket)
        assert remote.gets <= 1 + META_PUBLISH_PIECES_MAX + 1
        assert image(remote.state) == image(engine.meta.state)
    finally:
        engine.close()


def test_checkpoints_replace_pieces_in_the_bucket(tmp_path: Path) -> None:
    engine, bucket = open_engine(tmp_path, meta_checkpoint_records=20)
    try:
        engine.create_topic("t", 2, {"segment.records": "1"})
        for i in range(120):
            engine.append_records("t", i % 2, [(1, None, b"x", [])]).result()
            engine.flush()
            MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", i % 2, i, -1, "", i)]).result()
            engine.meta.maybe_checkpoint()
            engine.publish_metadata()
        objects = meta_objects(bucket)
        checkpoints = [k for k in objects if "/meta/checkpoint-" in k]
        assert len(checkpoints) == 2  # the newest and the one before it
        # Only pieces after the older kept checkpoint remain.
        assert sum("/meta/log-" in k for k in objects) <= 2 * (META_PUBLISH_PIECES_MAX + 1)
        engine.publish_metadata()
        assert image(read_remote_state(bucket).state) == image(engine.meta.state)
    finally:
        engine.close()


def test_a_restart_keeps_publishing_where_it_left_off(tmp_path: Path) -> None:
    engine, bucket = open_engine(tmp_path)
    engine.create_topic("t", 1, {"segment.records": "1"})
    for _i in range(5):
        engine.append_records("t", 0, [(1, None, b"x", [])]).result()
    engine.close()  # seals and publishes
    engine, bucket = open_engine(tmp_path)
    try:
        MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, 3, -1, "", 1)]).result()
        engine.publish_metadata()
        state = read_remote_state(bucket).state
        assert state.groups["g"].offsets[("t", 0)][0] == 3
        assert image(state) == image(engine.meta.state)
    finally:
        engine.close()


def test_the_previous_release_meta_json_is_still_read(tmp_path: Path) -> None:
    bucket = LocalStore(str(tmp_path / "bucket"), OsFileSystem())
    tid = "ef" * 16
    doc = {
        "format": "loglake-meta",
        "version": 1,
        "seq": 7,
        "written_ms": 1,
        "cluster_id": "legacy",
        "topics": {"t": {"id": tid, "partitions": 1, "config": {}, "created_ms": 1}},
        "partitions": {
            f"{tid}/0": {
                "log_start": 0,
                "sealed_end": 10,
                "chain": "22" * 32,
                "segments": [[0, 9, 500, 5, 10, "00" * 32, "22" * 32, 1, "cold"]],
                "producers": {},
            }
        },
        "extra": {},
    }
    bucket.put("loglake-legacy/meta.json", [json.dumps(doc).encode()])
    remote = read_remote_state(bucket)
    assert remote.legacy and remote.state.cluster_id == "legacy"
    seg = remote.state.partition(bytes.fromhex(tid), 0).segments[0]
    assert seg.key == f"loglake-legacy/t-{tid}/0/00000000000000000000.seg" and seg.tier == "cold"


def test_acked_records_alone_cost_no_put(tmp_path: Path) -> None:
    """The acknowledged-end records (one a second while producing) ride with the next real change:
    a quiet broker whose only changes are those records does not PUT a piece per interval."""
    from loglake.meta.publish import LAZY_RECORDS_MAX

    engine, bucket = open_engine(tmp_path, meta_checkpoint_records=10_000, meta_publish_interval_ms=0)
    try:
        engine.create_topic("t", 1)
        tid = engine.topic_id_of("t").hex()
        publisher = engine.log.parts.publisher
        assert publisher is not None
        publisher.publish()
        for end in range(1, 50):
            engine.meta.append(Acked([(tid, 0, end)])).result()
        assert not publisher.due()  # maintenance publishes only when due: no PUT for these
        engine.create_topic("u", 1)  # a real change: everything pending goes up, in order
        assert publisher.due() and publisher.publish()
        for end in range(50, 50 + LAZY_RECORDS_MAX):
            engine.meta.append(Acked([(tid, 0, end)])).result()
        assert publisher.due()  # the bound: they do not wait forever
        assert publisher.publish()
        assert image(read_remote_state(bucket).state) == image(engine.meta.state)
    finally:
        engine.close()
