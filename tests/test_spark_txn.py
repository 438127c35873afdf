"""Spark reads of transactional topics straight from the stores (`kafka.isolation.level`).

A real broker takes confluent-kafka's transactional producer: committed transactions, aborted
ones whose records span several segments (the ABORT marker sealed in a later segment than the
data), plain records between them, and one transaction left open. After the broker stops, the
Spark source reads the data directory: read_committed returns exactly the committed and plain
records below the open transaction; read_uncommitted returns every record; and `pipeline
export`'s default is read_committed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from loglake.spark.plan import cached_store, load_metadata, slices_for
from sparkkit import reader

from brokerkit import serving_broker

WAIT_S = 60.0
TOPIC = "tx"


def _values(df: Any) -> list[bytes]:
    return sorted(bytes(r.value) for r in df.select("value").collect())


@pytest.fixture(scope="module")
def txn_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[bytes]]]:
    data = tmp_path_factory.mktemp("spark-txn") / "data"
    want: dict[str, list[bytes]] = {"committed": [], "aborted": [], "open": [], "after_open": []}
    with serving_broker(data) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        # small segments: an aborted transaction's records and its marker land in different ones
        fs = admin.create_topics([NewTopic(TOPIC, 2, 1, config={"segment.bytes": "1500"})])
        fs[TOPIC].result(WAIT_S)
        tp = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "spark-txn", "linger.ms": 0})
        plain = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        tp.init_transactions(WAIT_S)

        def txn(kind: str, n: int, commit: bool | None) -> None:
            tp.begin_transaction()
            for i in range(n):
                v = b"%s-%03d-%s" % (kind.encode(), i, b"x" * 60)
                tp.produce(TOPIC, value=v, partition=i % 2)
                tp.flush(WAIT_S)  # one batch per record: the transaction spans segments
                want[kind].append(v)
            if commit is True:
                tp.commit_transaction(WAIT_S)
            elif commit is False:
                tp.abort_transaction(WAIT_S)

        def plain_records(tag: bytes, n: int) -> None:
            for i in range(n):
                plain.produce(TOPIC, value=b"%s-%03d" % (tag, i), partition=i % 2)
            plain.flush(WAIT_S)
            want["committed"].extend(b"%s-%03d" % (tag, i) for i in range(n))

        txn("committed", 20, True)
        plain_records(b"plain-a", 6)
        txn("aborted", 40, False)
        txn("committed", 10, True)
        txn("aborted", 6, False)
        plain_records(b"plain-b", 6)
        txn("open", 4, None)  # left open: the last stable offset stays at its first record
        for i in range(4):
            v = b"after-open-%d" % i
            plain.produce(TOPIC, value=v, partition=i % 2)
            want["after_open"].append(v)
        plain.flush(WAIT_S)
    return data, want


def test_read_committed_returns_committed_rows_only(spark: Any, txn_data: tuple[Path, dict[str, list[bytes]]]) -> None:
    import loglake.spark

    loglake.spark.register(spark)
    data, want = txn_data
    committed = _values(reader(spark, data, subscribe=TOPIC, **{"kafka.isolation.level": "read_committed"}))
    assert committed == sorted(want["committed"])
    everything = _values(reader(spark, data, subscribe=TOPIC))
    assert everything == sorted(want["committed"] + want["aborted"] + want["open"] + want["after_open"])
    # split into many slices, the filter still holds in every piece
    split = reader(spark, data, subscribe=TOPIC, minPartitions="12", **{"kafka.isolation.level": "READ_COMMITTED"})
    assert _values(split) == sorted(want["committed"])


def test_segments_carry_the_index_the_reader_needs(txn_data: tuple[Path, dict[str, list[bytes]]]) -> None:
    """Where the metadata no longer lists old aborted transactions, the segments' transaction
    indexes give the same answer."""
    data, _want = txn_data
    url = str(data / "segments")
    meta = load_metadata(cached_store(url), "read_committed")
    for p in (0, 1):
        pm = meta.partitions[(TOPIC, p)]
        assert len(pm.aborted) == 2 and len(pm.segments) > 3
        full = slices_for(url, pm, pm.log_start, pm.end, committed=True)
        trimmed = dataclasses.replace(pm, aborted=(), aborted_trimmed=True)
        from_segments = slices_for(url, trimmed, pm.log_start, pm.end, committed=True)
        assert [s.aborted for s in from_segments] == [s.aborted for s in full]
        assert any(s.aborted for s in full)
        # the first aborted transaction's data starts segments before its marker
        first, marker = pm.aborted[0][1], pm.aborted[0][2]
        assert sum(1 for s in pm.segments if first <= s.base <= marker) >= 2


def test_pipeline_export_defaults_to_read_committed(
    spark: Any, txn_data: tuple[Path, dict[str, list[bytes]]], tmp_path: Path
) -> None:
    from loglake.spark.pipeline import export_query, watch

    data, want = txn_data
    out = tmp_path / "out"
    watch(export_query(spark, str(data), TOPIC, str(out)), lambda _p: None)
    rows = spark.read.parquet(str(out)).select("value").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(want["committed"])


def test_isolation_option_errors() -> None:
    from loglake.spark.options import LoglakeOptionError, parse_read_options

    with pytest.raises(LoglakeOptionError, match=r"kafka\.isolation\.level must be read_uncommitted or read_committed"):
        parse_read_options({"path": "/x", "subscribe": "t", "kafka.isolation.level": "serializable"}, "batch")
    assert parse_read_options({"path": "/x", "subscribe": "t"}, "batch").isolation == "read_uncommitted"
