"""The export pipeline on a real Spark standalone cluster: master and worker as separate processes
(bound to 127.0.0.1, random ports), driven by the `loglake pipeline` CLI in its own process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

import loglake  # noqa: E402

SPARK_HOME = os.path.dirname(pyspark.__file__)
CLI = [sys.executable, "-c", "from loglake.cli.pipeline import app; app()"]


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise RuntimeError(f"{pattern!r} not seen; log:\n{log.read_text(errors='replace')[-3000:]}")


@contextmanager
def standalone_cluster(tmp: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp / "master.log"
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append(master)
        url = _wait_for(master_log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master).group(1)
        worker_log = tmp / "worker.log"
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    "2",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(tmp / "work"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append(worker)
        _wait_for(worker_log, r"Successfully registered with master", worker)
        yield url
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def test_pipelines_on_standalone_cluster(tmp_path: Path) -> None:
    data_dir, out = tmp_path / "data", tmp_path / "table"
    with loglake.open(str(data_dir)) as log:
        log.create_topic("c", 3, {"retention.ms": "-1"})
        for i in range(300):
            log.produce("c", json.dumps({"i": i}).encode(), partition=i % 3)
            if i % 100 == 99:
                log.flush()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    with standalone_cluster(tmp_path) as master:
        common = [
            "--master",
            master,
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
        ]
        exported = subprocess.run(
            [
                *CLI,
                "export",
                "--path",
                str(data_dir),
                "--topic",
                "c",
                "--to",
                str(out),
                "--value-schema",
                "i int",
                *common,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
        assert exported.returncode == 0, exported.stderr[-3000:]
        assert "export done: 300 rows" in exported.stdout
        # (`pipeline verify` runs the same way; test_spark_pipeline.py checks it on local[2])
    import pyarrow.parquet as pq

    table = pq.read_table(str(out), columns=["i"])
    assert sorted(table.column("i").to_pylist()) == list(range(300))
