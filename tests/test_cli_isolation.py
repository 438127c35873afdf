"""`loglake consume --isolation read_committed|read_uncommitted`, as real processes.

A broker (`loglake serve`) takes a committed transaction, an aborted one and one left open
(confluent-kafka's transactional producer), with plain records between them. Through the broker
(`--bootstrap-server`, librdkafka's isolation.level) and then on the stopped data directory
(the embedded engine), read_committed prints exactly the plain and committed records below the
open transaction, read_uncommitted every record, and neither a transaction marker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Producer

from brokerkit import serving_broker

WAIT_S = 60.0
COMMITTED = ["plain-0", "c-0", "c-1", "plain-1"]
EVERYTHING = ["plain-0", "c-0", "c-1", "a-0", "a-1", "plain-1", "o-0", "plain-2"]


def cli(args: Sequence[str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOGLAKE_BOOTSTRAP_SERVER", "LOGLAKE_DATA_DIR")}
    done = subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _send(p: Producer, *values: str) -> None:
    for v in values:
        p.produce("tx", value=v.encode())
    assert p.flush(WAIT_S) == 0


def test_consume_isolation_through_the_broker_and_on_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving_broker(data) as b:
        cli(["topics", "create", "tx", "--partitions", "1", "--bootstrap-server", b.bootstrap])
        plain = Producer({"bootstrap.servers": b.bootstrap})
        txn = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "cli-isolation"})
        txn.init_transactions(WAIT_S)
        _send(plain, "plain-0")
        txn.begin_transaction()
        _send(txn, "c-0", "c-1")
        txn.commit_transaction(WAIT_S)
        txn.begin_transaction()
        _send(txn, "a-0", "a-1")
        txn.abort_transaction(WAIT_S)
        _send(plain, "plain-1")
        held = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "cli-isolation-open"})
        held.init_transactions(WAIT_S)
        held.begin_transaction()
        _send(held, "o-0")  # left open: the last stable offset stays at its first offset
        _send(plain, "plain-2")

        remote = ["consume", "tx", "--bootstrap-server", b.bootstrap]
        assert cli([*remote, "--isolation", "read_committed"]) == COMMITTED
        assert cli([*remote, "--isolation-level", "read_committed", "--from", "latest"]) == []
        assert cli([*remote, "--isolation-level", "read_uncommitted"]) == EVERYTHING
        assert cli(remote) == EVERYTHING
        del held, txn, plain
    # the broker is stopped; its open transaction is still open in the data directory
    local = ["consume", "tx", "--data-dir", str(data)]
    assert cli([*local, "--isolation", "read_committed"]) == COMMITTED
    assert cli([*local, "--isolation-level=read_committed", "--from", "latest"]) == []
    assert cli([*local, "--isolation", "read_uncommitted"]) == EVERYTHING
    assert cli(local) == EVERYTHING
    offsets = [line.split('"offset": ')[1].split(",")[0] for line in cli([*local, "--format", "json"])]
    assert offsets == ["0", "1", "2", "4", "5", "7", "8", "9"]  # markers at 3 and 6, never printed


def test_bad_isolation_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", "consume", "t", "--data-dir", str(tmp_path), "--isolation", "dirty"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "read_committed" in done.stderr
