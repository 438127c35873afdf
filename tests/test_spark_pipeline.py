"""The Spark pipelines: export to partitioned Parquet (exactly once) and distributed verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import loglake

DAY_MS = 86_400_000
#: 2026-01-01T00:00:00Z
T0 = 1_767_225_600_000
LOGLAKE_BIN = Path(sys.executable).parent / "loglake"
SRC = str(Path(__file__).resolve().parents[1] / "src")
#: A JAVA_HOME with no Java in it: a command run with it succeeds only if it never starts Spark.
NO_JAVA = "/nonexistent-java-home-of-loglake-tests"


def cli(*args: str, java: bool = True) -> subprocess.CompletedProcess[str]:
    """`loglake ARGS` in a child process; java=False: with no Java to start a JVM with."""
    env = {**os.environ, "PYTHONPATH": SRC}
    if not java:
        env["JAVA_HOME"] = NO_JAVA
    return subprocess.run([str(LOGLAKE_BIN), *args], capture_output=True, text=True, env=env, timeout=300)


def _produce(log: loglake.Log, start: int, count: int) -> None:
    for i in range(start, start + count):
        value = json.dumps({"user": f"u{i % 4}", "n": i}).encode()
        log.produce("j", value, key=f"{i}".encode(), partition=i % 2, timestamp=T0 + (i % 2) * DAY_MS + i)
    log.flush()


def test_export_parquet_exactly_once(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.pipeline import export_query, watch

    data_dir, out = tmp_path / "data", tmp_path / "table"
    log = loglake.open(str(data_dir))
    try:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 20)
        seen: list[dict[str, Any]] = []
        q = export_query(spark, str(data_dir), "j", str(out), value_format="json")
        result = watch(q, seen.append)
        assert result.rows == 20 and seen
        _produce(log, 20, 10)
        q = export_query(spark, str(data_dir), "j", str(out), value_schema="n bigint, user string")
        assert watch(q, seen.append).rows == 10
        q = export_query(spark, str(data_dir), "j", str(out), value_schema="n bigint, user string")
        assert watch(q, seen.append).rows == 0
    finally:
        log.close()
    table = spark.read.parquet(str(out))
    rows = sorted(
        (r["partition"], r["offset"], bytes(r["value"]), r["n"], r["user"], str(r["date"]))
        for r in table.collect()
    )
    want = sorted(
        (
            i % 2,
            i // 2,
            json.dumps({"user": f"u{i % 4}", "n": i}).encode(),
            i,
            f"u{i % 4}",
            "2026-01-0" + str(1 + i % 2),
        )
        for i in range(30)
    )
    assert rows == want
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("date=")) == [
        "date=2026-01-01",
        "date=2026-01-02",
    ]
    assert (out / "date=2026-01-02" / "partition=1").is_dir()


def test_verify_distributed(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.pipeline import verify_store

    data_dir = tmp_path / "data"
    with loglake.open(str(data_dir)) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        for start in (0, 10, 20):
            _produce(log, start, 10)
    ok = verify_store(spark, str(data_dir))
    assert ok.ok and ok.segments == 6 and ok.partitions == 2
    segs = sorted((data_dir / "segments").rglob("*.seg"))
    victim = [s for s in segs if s.parent.name == "1"][1]
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 0x01
    victim.write_bytes(bytes(raw))
    bad = verify_store(spark, str(data_dir))
    assert not bad.ok
    assert bad.errors[0][0].endswith(str(victim.relative_to(data_dir / "segments")))


@pytest.mark.parametrize(
    ("where", "why", "hint"),
    [
        ("missing", "it does not exist", "hint: give the directory `loglake serve --data-dir` uses"),
        (
            "empty",
            "it holds no loglake metadata (loglake-*/meta/)",
            "hint: give the directory `loglake serve --data-dir` uses",
        ),
        (
            "data/wal",
            "it holds no loglake metadata (loglake-*/meta/)",
            "looks like the data directory this is part of: give that",
        ),
    ],
)
def test_a_path_without_loglake_data_is_one_error_and_a_hint(
    tmp_path: Path, where: str, why: str, hint: str
) -> None:
    """Said before Spark starts (there is no Java here): which path, what it should have been."""
    (tmp_path / "empty").mkdir()
    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("j", 1)
    path = str(tmp_path / where)
    for command in (
        ["pipeline", "export", "--path", path, "--topic", "j", "--to", str(tmp_path / "out")],
        ["pipeline", "verify", "--path", path],
    ):
        r = cli(*command, java=False)
        assert r.returncode == 1, r.stderr
        error, hint_line = r.stderr.splitlines()
        assert error.startswith(
            f"error: no loglake data at {path!r}: {why}; path must be a loglake data directory"
        )
        assert "s3://BUCKET/PREFIX" in error
        assert hint_line.startswith("hint: ") and hint in hint_line


def test_a_bad_option_is_one_error_line_naming_the_forms(tmp_path: Path) -> None:
    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("j", 1)
    r = cli(
        "pipeline", "export", "--path", str(tmp_path / "data"), "--topic", "j", "--to", str(tmp_path / "out"),
        "-o", "startingOffsets=bogus", java=False,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: option startingOffsets must be earliest, latest or a JSON object of per-partition offsets "
        'like {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest), got \'bogus\''
    ]


def test_an_export_with_nothing_new_to_land_starts_no_spark(spark: Any, tmp_path: Path) -> None:
    """What the checkpoint holds is compared with the log's ends without a JVM; an export with
    something to land still starts Spark (here: fails for want of Java, saying so)."""
    from loglake.spark.pipeline import checkpoint_offsets, export_query, watch

    data_dir, out = tmp_path / "data", tmp_path / "table"
    export = ["pipeline", "export", "--path", str(data_dir), "--topic", "j", "--to", str(out)]
    with loglake.open(str(data_dir)) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 20)
    assert watch(export_query(spark, str(data_dir), "j", str(out)), lambda p: None).rows == 20
    assert checkpoint_offsets(str(out / "_checkpoint")) == {("j", 0): 10, ("j", 1): 10}
    r = cli(*export, java=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        f"export: nothing new to land: {out} already holds j up to the log's end (next offset by partition: 0=10, 1=10)"
    )
    assert "Spark not started" in r.stdout
    r = cli(*export[:4], "--topic", "jj", "--to", str(out), java=False)
    assert (
        r.returncode == 0 and f"nothing to land: topic 'jj' is not in {data_dir} (its topics: j)" in r.stdout
    )
    with loglake.open(str(data_dir)) as log:
        _produce(log, 20, 2)
    r = cli(*export, java=False)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "error: Spark could not start its JVM: pipelines need Java 17 or newer (java on PATH, or JAVA_HOME)"
    )
    # a batch planned but not committed (a crash): only Spark knows what to redo
    (out / "_checkpoint" / "offsets" / "1").write_text((out / "_checkpoint" / "offsets" / "0").read_text())
    assert checkpoint_offsets(str(out / "_checkpoint")) is None


def test_verify_distributed_over_a_cluster_bucket(spark: Any, tmp_path: Path) -> None:
    """`pipeline verify` on a cluster's bucket (one broker over a shared folder, tests/clusterkit.py):
    every merged and compacted segment in full with the hash chain between them, and every flush
    range not merged yet against its commit's CRC-32C, one Spark task each; a flipped byte in
    either is named."""
    import time

    from confluent_kafka import Producer

    import clusterkit
    from etcdkit import ETCD_BINARY
    from loglake.cluster.verify import PlogSource
    from loglake.spark.pipeline import verify_store
    from loglake.spark.plan import cached_store

    if ETCD_BINARY is None:
        pytest.skip("etcd is not installed (Debian package etcd-server; .ci/run installs it)")
    env = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "1500"}  # merged and compacted between rounds
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
    with clusterkit.running_cluster(tmp_path, brokers=1, cold_store="file", broker_env=env) as c:
        c.create_topic("kv", 2, config=config)
        url = c.cold_store_url
        producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
        broker = c.brokers[0]

        def frozen() -> PlogSource | None:
            """The published metadata once it lists compacted segments and unmerged ranges."""
            source = PlogSource(cached_store(url))
            plogs = [plog for _t, _id, _p, plog in source.plogs()]
            compacted = any(s.gen > 0 for pl in plogs for s in pl.segments)
            return source if compacted and any(pl.ranges for pl in plogs) else None

        source = None
        for rnd in range(20):  # rounds until a snapshot holds both: then the broker is paused
            for i in range(200):
                producer.produce("kv", key=b"k%02d" % (i % 20), value=b"r%d-%d" % (rnd, i), partition=i % 2)
            assert producer.flush(60) == 0
            time.sleep(1.2)  # published (every second), likely before the next merge
            if frozen() is not None:
                broker.pause()
                time.sleep(1.5)  # a publish in flight has landed
                source = frozen()
                if source is not None:
                    break
                broker.resume()
        assert source is not None, "no published snapshot with both compacted segments and unmerged ranges"
        try:
            ok = verify_store(spark, url)
            assert ok.ok, ok.errors
            segments = [s for _t, _id, _p, pl in source.plogs() for s in pl.segments]
            ranges = [r for _t, _id, _p, pl in source.plogs() for r in pl.ranges]
            assert (ok.segments, ok.ranges, ok.partitions) == (len(segments), len(ranges), 2)
            for key, at in ((next(s.key for s in segments if s.gen > 0), 40), (ranges[0].key, ranges[0].pos + 40)):
                path = c.shared_dir / key
                raw = path.read_bytes()
                path.write_bytes(raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1 :])
                bad = verify_store(spark, url)
                path.write_bytes(raw)
                assert not bad.ok and bad.errors[0][0] == key, bad.errors
        finally:
            broker.resume()
