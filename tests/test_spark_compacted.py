"""The Spark source reads compacted segments (offset gaps, rebuilt batches, empty batches) exactly
as loglake's own consumer does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from loglake.records.compression import CODEC_GZIP
from sparkkit import expected, reader, spark_rows


def test_spark_reads_a_compacted_topic(spark: Any, tmp_path: Path) -> None:
    import loglake.spark

    loglake.spark.register(spark)
    data_dir = tmp_path / "data"
    log = loglake.open(str(data_dir), cleaner_threads=0, merge_min_segments=0)
    try:
        log.create_topic("kv", partitions=2, config={"cleanup.policy": "compact", "segment.records": "40"})
        engine = log.engine
        for r in range(30):
            for k in range(8):
                value = None if (k == 3 and r == 29) else b"v%d-%d" % (k, r)
                engine.append_records("kv", k % 2, [(1_700_000_000_000 + r, b"k%d" % k, value, [("r", b"%d" % r)])],
                                      compression=CODEC_GZIP if r % 2 else None).result()
        log.flush()
        assert engine.compact("kv") == 2
        # the stores' copy of the metadata (what Spark plans from) already names only live objects
        from loglake.spark.plan import cached_store, load_metadata

        store = cached_store(str(data_dir / "segments"))
        listed = [s.key for pm in load_metadata(store).partitions.values() for s in pm.segments]
        assert listed and all(store.head(k) is not None for k in listed)
        want = expected(log, ["kv"])
        assert len(want) == 8  # newest value per key, the tombstone of k3 included
        assert {(row[0], row[1]) for row in want} == {(b"k%d" % k, None if k == 3 else b"v%d-29" % k) for k in range(8)}
        got = spark_rows(reader(spark, data_dir, subscribe="kv", includeHeaders="true"))
        assert got == want
    finally:
        log.close()
