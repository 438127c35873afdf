"""`loglake pipeline export --format iceberg`: topics landed as Iceberg tables exactly once, with
the offsets in the snapshot summaries; compact-table; the table read by pyiceberg and DuckDB."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")
s3kit = pytest.importorskip("s3kit")

import loglake  # noqa: E402

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket

DAY_MS = 86_400_000
#: 2026-01-01T00:00:00Z
T0 = 1_767_225_600_000
LOGLAKE_BIN = Path(sys.executable).parent / "loglake"
SRC = str(Path(__file__).resolve().parents[1] / "src")
#: How long a child export may take to reach its pause before the commit (Spark start included).
CHILD_WAIT_S = 300


def _value(i: int, extra: bool = False) -> bytes:
    doc: dict[str, Any] = {"user": f"u{i % 4}", "n": i}
    if extra:
        doc["city"] = f"c{i}"
    return json.dumps(doc).encode()


def _produce(log: loglake.Log, start: int, count: int, extra: bool = False) -> None:
    """Record i goes to partition i % 2 and to day 1 + i % 2 of 2026 (+ (i // 20) days), so each
    partition of the table's day transform gets rows from several runs."""
    for i in range(start, start + count):
        ts = T0 + (i % 2) * DAY_MS + i
        log.produce("j", _value(i, extra), key=f"{i}".encode(), partition=i % 2, timestamp=ts)
    log.flush()


def _catalog(tmp_path: Path, **options: str) -> Any:
    from loglake.spark.iceberg import open_catalog

    return open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"), options)


def _rows(table: Any) -> list[tuple[Any, ...]]:
    data = table.scan().to_arrow()
    cols = [c for c in ("partition", "offset", "key", "value", "n", "user", "city") if c in data.column_names]
    return sorted(zip(*(data.column(c).to_pylist() for c in cols), strict=True))


def _export(spark: Any, tmp_path: Path, schema: str, **kw: Any) -> Any:
    from loglake.spark.iceberg import export_iceberg

    return export_iceberg(
        spark,
        str(tmp_path / "data"),
        "j",
        catalog_uri=f"sqlite:///{tmp_path}/catalog.db",
        table_name="lake.j",
        warehouse=str(tmp_path / "warehouse"),
        value_schema=schema,
        **kw,
    )


def _duckdb(metadata_location: str) -> Any:
    """A DuckDB connection with the iceberg extension of the duckdb-ext-iceberg wheel (no network
    here to INSTALL it from), or a skip saying why it cannot load."""
    duckdb = pytest.importorskip("duckdb")
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the duckdb-ext-iceberg and duckdb-ext-avro wheels are not installed")
    ext_dir = os.path.join(next(iter(spec.submodule_search_locations)), "extensions")
    con = duckdb.connect(config={"extension_directory": ext_dir, "autoinstall_known_extensions": "false"})
    con.execute("LOAD iceberg")
    return con


def test_export_exactly_once_schema_evolution_and_readers(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.iceberg import OFFSETS_PROP, SOURCE_PROP, committed_offsets

    log = loglake.open(str(tmp_path / "data"))
    try:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 20)
        batches: list[Any] = []
        first = _export(spark, tmp_path, "n bigint, user string", on_batch=batches.append)
        assert first.rows == 20 and first.batches == 1 and batches[0].files >= 2
        again = _export(spark, tmp_path, "n bigint, user string")
        assert again.rows == 0 and again.batches == 0
        table = _catalog(tmp_path).load_table("lake.j")
        assert len(table.snapshots()) == 1
        # New records with a new field: only they are appended, the column is added.
        _produce(log, 20, 10, extra=True)
        third = _export(spark, tmp_path, "n bigint, user string, city string", max_batch_records=6)
        assert third.rows == 10 and third.batches == 2
    finally:
        log.close()
    table = _catalog(tmp_path).load_table("lake.j")
    assert [f.name for f in table.schema().fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "n",
        "user",
        "city",
    ]
    assert str(table.schema().find_field("timestamp").field_type) == "timestamptz"
    (field,) = table.spec().fields
    assert str(field.transform) == "day" and table.schema().find_field(field.source_id).name == "timestamp"
    want = sorted(
        (i % 2, i // 2, f"{i}".encode(), _value(i, i >= 20), i, f"u{i % 4}", f"c{i}" if i >= 20 else None)
        for i in range(30)
    )
    assert _rows(table) == want
    snaps = table.snapshots()
    assert len(snaps) == 3 and all(s.summary.operation.value == "append" for s in snaps)
    assert json.loads(snaps[-1].summary[OFFSETS_PROP] or "") == {"j": {"0": 15, "1": 15}}
    assert json.loads(snaps[-1].summary[SOURCE_PROP] or "")["topic"] == "j"
    assert committed_offsets(table)[0] == {("j", 0): 15, ("j", 1): 15}
    # Day partitions: the partition value of every file is the day of its rows.
    days = {int(f.partition[0]) for f in (t.file for t in table.scan().plan_files())}
    assert days == {T0 // DAY_MS, T0 // DAY_MS + 1}

    con = _duckdb(table.metadata_location)
    duck = con.execute(
        'SELECT partition, "offset", key, value, n, user, city FROM iceberg_scan(?)',
        [table.metadata_location],
    ).fetchall()
    assert sorted(tuple(bytes(v) if isinstance(v, bytes | bytearray) else v for v in r) for r in duck) == want
    per_day = con.execute(
        "SELECT CAST(timestamp AT TIME ZONE 'UTC' AS DATE)::VARCHAR, count(*) FROM iceberg_scan(?) GROUP BY 1 ORDER BY 1",
        [table.metadata_location],
    ).fetchall()
    assert per_day == [("2026-01-01", 15), ("2026-01-02", 15)]


def test_compact_table_keeps_rows_and_offsets(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.iceberg import committed_offsets

    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        for start in range(0, 24, 8):
            _produce(log, start, 8)
    _export(spark, tmp_path, "n bigint, user string", max_batch_records=8)
    table = _catalog(tmp_path).load_table("lake.j")
    before = _rows(table)
    files_before = len(list(table.scan().plan_files()))
    assert files_before == 6 and len(before) == 24
    child = subprocess.run(
        [
            str(LOGLAKE_BIN),
            "pipeline",
            "compact-table",
            "--catalog-uri",
            f"sqlite:///{tmp_path}/catalog.db",
            "--table",
            "lake.j",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "6 files in 2 partitions -> 2 files" in child.stdout
    table = _catalog(tmp_path).load_table("lake.j")
    assert _rows(table) == before
    assert len(list(table.scan().plan_files())) == 2
    assert committed_offsets(table)[0] == {("j", 0): 12, ("j", 1): 12}
    assert table.current_snapshot().summary.operation.value == "overwrite"
    # An export resumes from the compaction's snapshot: nothing again, then only new records.
    assert _export(spark, tmp_path, "n bigint, user string").rows == 0
    with loglake.open(str(tmp_path / "data")) as log:
        _produce(log, 24, 4)
    assert _export(spark, tmp_path, "n bigint, user string").rows == 4
    assert [r[:2] for r in _rows(_catalog(tmp_path).load_table("lake.j"))] == sorted(
        (i % 2, i // 2) for i in range(28)
    )


def test_kill_between_files_and_commit_then_resume(spark: Any, tmp_path: Path) -> None:
    """kill -9 of the export right before its commit (the test hook pauses it there): the data
    files are written but no snapshot names them; the next run lands the same records once."""
    from loglake.spark.iceberg import PAUSE_ENV

    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 10)
    assert _export(spark, tmp_path, "n bigint, user string").rows == 10
    with loglake.open(str(tmp_path / "data")) as log:
        _produce(log, 10, 10)
    marker = tmp_path / "paused.json"
    cmd = [
        str(LOGLAKE_BIN),
        "pipeline",
        "export",
        "--path",
        str(tmp_path / "data"),
        "--topic",
        "j",
        "--format",
        "iceberg",
        "--catalog-uri",
        f"sqlite:///{tmp_path}/catalog.db",
        "--table",
        "lake.j",
        "--to",
        str(tmp_path / "warehouse"),
        "--value-schema",
        "n bigint, user string",
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
    ]
    env = {**os.environ, "PYTHONPATH": SRC, PAUSE_ENV: str(marker)}
    errors = tmp_path / "child.err"
    with errors.open("wb") as err:
        child = subprocess.Popen(cmd, env=env, stdout=err, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + CHILD_WAIT_S
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), (child.poll(), errors.read_text()[-3000:])
        time.sleep(0.3)  # the marker is written in one call; let it be closed
        written = json.loads(marker.read_text())
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    assert written and all(Path(p.removeprefix("file:")).exists() for p in written)
    table = _catalog(tmp_path).load_table("lake.j")
    assert len(table.snapshots()) == 1  # the killed batch committed nothing
    live = {t.file.file_path for t in table.scan().plan_files()}
    assert not live & set(written)  # its files are orphans no reader sees
    assert len(_rows(table)) == 10

    resumed = _export(spark, tmp_path, "n bigint, user string")
    assert resumed.rows == 10
    rows = _rows(_catalog(tmp_path).load_table("lake.j"))
    assert [r[:2] for r in rows] == sorted((i % 2, i // 2) for i in range(20))


def test_tiered_topic_into_an_s3_warehouse(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    """A topic whose older segments the broker moved to a cold store on S3 (moto), exported by
    the command into a warehouse in the same bucket, with the s3.* options of the source."""
    from loglake.store.s3 import register

    register()
    cold = s3kit.store_url(moto_endpoint, bucket, "cold")
    values = [f"v{i:04d}".encode() * 30 for i in range(150)]
    with loglake.open(str(tmp_path / "data"), cold_store=cold) as log:
        log.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "1", "retention.ms": "-1"})
        for i, v in enumerate(values):
            log.produce("t", v, timestamp=T0 + i * 1000)
        log.flush()
        assert log.engine.wait_relocations()
        log.flush()
        tiers = [s.tier for s in log.engine.segments("t", 0)]
        assert "cold" in tiers and tiers[-1] == "hot"
    s3_opts = {"s3.endpoint_url": moto_endpoint, "s3.region": s3kit.REGION, "s3.path_style": "true"}
    cmd = [
        str(LOGLAKE_BIN),
        "pipeline",
        "export",
        "--path",
        str(tmp_path / "data"),
        "--topic",
        "t",
        "--format",
        "iceberg",
        "--catalog-uri",
        f"sqlite:///{tmp_path}/catalog.db",
        "--table",
        "lake.t",
        "--to",
        f"s3://{bucket}/warehouse",
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        "-o",
        f"coldPath=s3://{bucket}/cold",
        *(x for k, v in s3_opts.items() for x in ("-o", f"{k}={v}")),
    ]
    env = {**os.environ, **s3kit.DUMMY_ENV, "PYTHONPATH": SRC, "PYSPARK_PYTHON": sys.executable}
    outputs = []
    for _ in range(2):  # the second run finds everything landed, from the table alone (no Spark)
        child = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CHILD_WAIT_S)
        assert child.returncode == 0, child.stderr[-3000:]
        outputs.append(child.stdout)
    assert "export done: 150 rows" in outputs[0]
    assert outputs[1].startswith("export: nothing new to land: lake.t already holds t up to the log's end")
    from loglake.spark.iceberg import open_catalog

    table = open_catalog(f"sqlite:///{tmp_path}/catalog.db", None, s3_opts).load_table("lake.t")
    assert table.location().startswith(f"s3://{bucket}/warehouse")
    data = table.scan().to_arrow().sort_by("offset")
    assert data.column("offset").to_pylist() == list(range(150))
    assert data.column("value").to_pylist() == values
    assert len(table.snapshots()) == 1


def test_racing_exports_land_a_batch_once(tmp_path: Path) -> None:
    """Two exports that read the table at the same offsets: the second commit sees the offsets
    moved and drops its batch (files deleted); a batch of another partition still lands, with
    both partitions' offsets. A stale append is refused, not retried blindly by pyiceberg."""
    import pyarrow as pa
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from loglake.spark.iceberg import _commit, committed_offsets, load_or_create_table

    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
        ]
    )
    catalog = _catalog(tmp_path)
    table = load_or_create_table(catalog, "lake.j", schema)
    assert table.properties["commit.retry.num-retries"] == "0"

    def files(partition: int, count: int) -> list[Any]:
        n = range(count)
        data = pa.table(
            {
                "key": [None] * count,
                "value": [f"{partition}-{i}".encode() for i in n],
                "topic": ["j"] * count,
                "partition": [partition] * count,
                "offset": list(n),
                "timestamp": [(T0 + i) * 1000 for i in n],
                "timestampType": [0] * count,
            },
            schema=schema,
        )
        return list(_dataframe_to_data_files(table.metadata, data, table.io))

    source = {"store": "test", "topic": "j"}
    first, second, other = files(0, 10), files(0, 10), files(1, 5)
    stale = catalog.load_table("lake.j")
    assert _commit(table, first, {}, {("j", 0): 10}, source, "lake.j") is not None
    assert _commit(table, second, {}, {("j", 0): 10}, source, "lake.j") is None
    assert not any(Path(f.file_path.removeprefix("file:")).exists() for f in second)
    assert _commit(table, other, {}, {("j", 1): 5}, source, "lake.j") is not None
    table = catalog.load_table("lake.j")
    assert committed_offsets(table) == ({("j", 0): 10, ("j", 1): 5}, source)
    assert sorted(
        zip(*(table.scan().to_arrow().column(c).to_pylist() for c in ("partition", "offset")), strict=True)
    ) == sorted([(0, i) for i in range(10)] + [(1, i) for i in range(5)])
    tx = stale.transaction()
    with tx.update_snapshot().fast_append() as app:
        for f in files(0, 3):
            app.append_data_file(f)
    with pytest.raises(CommitFailedException):
        tx.commit_transaction()
    assert len(catalog.load_table("lake.j").snapshots()) == 2


def test_cli_export_under_another_catalog_name_registers_once_and_skips_a_no_op(tmp_path: Path) -> None:
    """`--catalog-name` is the name the SQL catalog files the table under, so a reader that names
    its catalog so (pyiceberg's SqlCatalog(name, ...), Spark's spark.sql.catalog.<name>) sees it
    and one under the default name does not. The export registers the source once (no WARN
    line), and a run with nothing new to land answers from the table without a JVM."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 10)
    uri = f"sqlite:///{tmp_path}/catalog.db"
    export = [
        str(LOGLAKE_BIN), "pipeline", "export", "--path", str(tmp_path / "data"), "--topic", "j",
        "--format", "iceberg", "--catalog-uri", uri, "--table", "lake.j", "--to", str(tmp_path / "warehouse"),
        "--catalog-name", "lakehouse",
    ]  # fmt: skip
    spark_flags = ["--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    env = {**os.environ, "PYTHONPATH": SRC}
    run = subprocess.run(
        [*export, *spark_flags], capture_output=True, text=True, env=env, timeout=CHILD_WAIT_S
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "export done: 10 rows in 1 micro-batches" in run.stdout
    assert "replaced a previously registered data source" not in run.stderr

    table = SqlCatalog("lakehouse", uri=uri).load_table("lake.j")
    assert table.scan().to_arrow().num_rows == 10
    with pytest.raises(NoSuchTableError):
        SqlCatalog("loglake", uri=uri).load_table("lake.j")

    no_java = {**env, "JAVA_HOME": "/nonexistent-java-home-of-loglake-tests"}  # Spark cannot start
    again = subprocess.run([*export, *spark_flags], capture_output=True, text=True, env=no_java, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.startswith(
        "export: nothing new to land: lake.j already holds j up to the log's end (next offset by partition: 0=5, 1=5)"
    )
    compact = [str(LOGLAKE_BIN), "pipeline", "compact-table", "--catalog-uri", uri, "--table", "lake.j"]
    done = subprocess.run(
        [*compact, "--catalog-name", "lakehouse"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "compact-table:" in done.stdout, done.stderr[-3000:]
    missing = subprocess.run(compact, capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 1 and "no table lake.j in the catalog" in missing.stderr
