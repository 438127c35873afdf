"""The columnar segment reader (loglake.spark.reader) against the reference record decoder, without
Spark: every row read_slice builds must equal what loglake.records decodes from the same batches.

The data mixes what the reader's fast paths must not get wrong: uniform batches (located by
prediction, their record lengths reused by `build`), batches whose records differ in size (the
hopping fallback), both in one output batch; null keys and values, headers, every codec (the
uncompressed sections are views into the read chunk, the compressed ones fresh buffers), varints
of several bytes (values past 64 bytes, offset deltas past 64), and slices that start and end
inside batches."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import loglake
from loglake.records.batch import build_batch
from loglake.records.decode import iter_records
from loglake.spark import reader as spark_reader
from loglake.spark.options import parse_read_options
from loglake.spark.plan import cached_store, load_metadata, select_partitions, slices_for

TS0 = 1_700_000_000_000
Row = tuple[bytes | None, bytes | None, int, int, Any]


def _batches(
    rng: random.Random,
) -> list[list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]]:
    out = []
    for b in range(40):
        kind = b % 4
        n = rng.choice([1, 5, 40, 200, 300])
        recs: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
        for i in range(n):
            if kind == 0:  # uniform: same sizes, same timestamp
                recs.append((TS0, None, b"v" * 100, []))
            elif kind == 1:  # uniform with keys, headers and growing timestamps
                recs.append((TS0 + i, b"k%04d" % (i % 10_000), b"x" * 30, [("h", b"1")]))
            else:  # ragged: null values, empty and long values, headers with null values
                key = None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 20))
                value = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 3, 70, 300]))
                headers = [
                    (f"h{j}", None if j == 1 else rng.randbytes(j)) for j in range(rng.randrange(0, 3))
                ]
                recs.append((TS0 - rng.randrange(0, 10_000), key, value, headers))
        out.append(recs)
    return out


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_read_slice_equals_reference_decoder(
    tmp_path: Path, codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small output batches so that one read spans several builds, each of several sections
    monkeypatch.setattr(spark_reader, "MAX_BATCH_ROWS", 700)
    rng = random.Random(codec)
    raw = [build_batch(recs, compression=codec) for recs in _batches(rng)]
    with loglake.open(str(tmp_path)) as log:
        log.create_topic("t", 1, {"retention.ms": "-1"})
        for batch in raw:
            log.produce_raw("t", 0, batch)
    expected: list[Row] = []
    for batch in raw:
        for r in iter_records(batch):
            headers = [(h[0], h[1]) for h in r.headers] or None
            expected.append((r.key, r.value, len(expected), r.timestamp, headers))

    opts = parse_read_options({"path": str(tmp_path), "subscribe": "t"}, "batch")
    pm = select_partitions(opts, load_metadata(cached_store(opts.store_url)))[0]
    total = len(expected)
    for lo, hi in [(0, total), (7, total - 3), (250, 251), (1000, 2500)]:
        got: list[Row] = []
        for sl in slices_for(opts.store_url, pm, lo, hi):
            for rb in spark_reader.read_slice(sl, True):
                d = rb.to_pydict()
                assert set(d["topic"]) == {"t"} and set(d["partition"]) == {0}
                assert set(d["timestampType"]) == {0}
                for k, v, o, ts, h in zip(
                    d["key"], d["value"], d["offset"], d["timestamp"], d["headers"], strict=True
                ):
                    got.append(
                        (
                            k,
                            v,
                            o,
                            int(ts.timestamp() * 1000),
                            None if h is None else [(x["key"], x["value"]) for x in h],
                        )
                    )
        assert got == expected[lo:hi], (lo, hi)
