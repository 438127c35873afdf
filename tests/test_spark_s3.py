"""Reading segments from S3 (moto) through the `loglake` source, s3.* options in the store URL.

Spark runs in a child process: the Python workers Spark starts inherit the environment of its
JVM, which for the shared test session was fixed before moto's dummy credentials existed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
s3kit = pytest.importorskip("s3kit")

import sparkkit  # noqa: E402
from loglake.fs.os_fs import OsFileSystem  # noqa: E402
from loglake.store import open_store  # noqa: E402
from loglake.store.s3 import register  # noqa: E402

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket

CHILD = """
import json, os, sys
sys.path.insert(0, os.environ["TESTS_DIR"])
from pyspark.sql import SparkSession
import loglake.spark, sparkkit
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
loglake.spark.register(spark)
df = (spark.read.format("loglake").option("path", sys.argv[1]).option("s3.endpoint_url", sys.argv[2])
      .option("s3.region", sys.argv[3]).option("s3.path_style", "true")
      .option("subscribe", "events").option("includeHeaders", "true").load())
rows = sparkkit.spark_rows(df)
def enc(v):
    if isinstance(v, bytes):
        return {"b": v.hex()}
    if isinstance(v, (list, tuple)):
        return [enc(x) for x in v]
    return v
print("ROWS " + json.dumps([enc(r) for r in rows]))
spark.stop()
"""


def _dec(v: object) -> object:
    if isinstance(v, dict):
        return bytes.fromhex(v["b"])
    if isinstance(v, list):
        return [_dec(x) for x in v]
    return v


def test_read_from_s3(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    register()
    log = sparkkit.make_data(tmp_path / "data")
    try:
        local = open_store(str(tmp_path / "data" / "segments"), OsFileSystem())
        remote = open_store(s3kit.store_url(moto_endpoint, bucket, "lake"), OsFileSystem())
        for key in local.list(""):
            remote.put(key, [local.get(key)])
        env = {
            **os.environ,
            **s3kit.DUMMY_ENV,
            "PYSPARK_PYTHON": sys.executable,
            "TESTS_DIR": str(Path(__file__).parent),
        }
        child = subprocess.run(
            [sys.executable, "-c", CHILD, f"s3://{bucket}/lake", moto_endpoint, s3kit.REGION],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
        assert child.returncode == 0, child.stderr[-3000:]
        line = next(x for x in child.stdout.splitlines() if x.startswith("ROWS "))
        rows: list[tuple[Any, ...]] = [tuple(_dec(x) for x in r) for r in json.loads(line[5:])]
        want = sparkkit.expected(log, ["events"])
        assert [r[:7] for r in rows] == [r[:7] for r in want]
        assert [None if r[7] is None else [tuple(h) for h in r[7]] for r in rows] == [r[7] for r in want]
    finally:
        log.close()
