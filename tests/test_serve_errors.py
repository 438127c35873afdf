"""`loglake serve` start-up failures: one error line (plus one hint), no traceback, a distinct
exit code per cause (src/loglake/cli/startup.py), as a real subprocess."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fskit import mounted_tmpfs
from loglake.cli import startup
from loglake.cli.startup import (
    EXIT_ADDRESS,
    EXIT_CONFIG,
    EXIT_LOCKED,
    EXIT_NO_SPACE,
    EXIT_NOT_A_DIRECTORY,
    EXIT_PERMISSION,
    EXIT_RESOLVE,
)

from brokerkit import free_port, serving_broker

LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]
README = Path(__file__).resolve().parent.parent / "README.md"


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOGLAKE, "serve", *args], capture_output=True, text=True, timeout=60)


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len([x for x in lines if x.startswith("error: ")]) == 1, result.stderr
    assert all(x.startswith(("error: ", "hint: ")) for x in lines) and len(lines) <= 2, result.stderr
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_data_dir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    assert_one_line(serve("--data-dir", str(tmp_path / "file"), "--listen", "127.0.0.1:0"), EXIT_NOT_A_DIRECTORY, "not a directory", str(tmp_path / "file"))


def test_listen_port_in_use(tmp_path: Path, busy_port: int) -> None:
    result = serve("--data-dir", str(tmp_path / "d"), "--listen", f"127.0.0.1:{busy_port}")
    assert_one_line(result, EXIT_ADDRESS, "--listen", f"127.0.0.1:{busy_port}", "address already in use")


def test_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    result = serve("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{busy_port}")
    assert_one_line(result, EXIT_ADDRESS, "--metrics-listen", "address already in use")


def test_unresolvable_listen_host(tmp_path: Path) -> None:
    result = serve("--data-dir", str(tmp_path / "d"), "--listen", "no-such-host.invalid:9092")
    assert_one_line(result, EXIT_RESOLVE, "--listen", "does not resolve")


def test_foreign_listen_address(tmp_path: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this machine.
    result = serve("--data-dir", str(tmp_path / "d"), "--listen", "192.0.2.77:9092", "--allow-unauthenticated-public-listener")
    assert_one_line(result, EXIT_ADDRESS, "--listen", "not an address of this machine")


def test_malformed_listen_value(tmp_path: Path) -> None:
    assert_one_line(serve("--data-dir", str(tmp_path / "d"), "--listen", "nonsense"), EXIT_CONFIG, "--listen", "HOST:PORT")


def test_data_dir_in_use_by_a_running_broker(tmp_path: Path) -> None:
    with serving_broker(tmp_path / "d"):
        result = serve("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0")
    assert_one_line(result, EXIT_LOCKED, "in use by another loglake process")


@pytest.fixture
def small_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs mounted with the options the test names (`@pytest.mark.parametrize` indirect)."""
    target = tmp_path / "fs"
    target.mkdir()
    with mounted_tmpfs(target, request.param) as mounted:
        yield mounted


@pytest.mark.parametrize("small_fs", ["ro,size=1m"], indirect=True)
def test_read_only_data_dir(small_fs: Path) -> None:
    assert_one_line(serve("--data-dir", str(small_fs / "d"), "--listen", "127.0.0.1:0"), EXIT_PERMISSION, "read-only filesystem")


@pytest.mark.parametrize("small_fs", ["size=64m"], indirect=True)
def test_no_room_for_the_wal_preallocation(small_fs: Path) -> None:
    """A 64 MB filesystem cannot hold two 64 MiB WAL files: said at start-up, not at the first write."""
    result = serve("--data-dir", str(small_fs / "d"), "--listen", "127.0.0.1:0")
    assert_one_line(result, EXIT_NO_SPACE, "not enough space", "wal_shards x wal_file_bytes")
    assert "hint: " in result.stderr and "wal_file_bytes" in result.stderr
    # with smaller WAL files it fits, and takes writes
    # (and a free-space reserve that fits a 64 MB filesystem)
    env = {"LOGLAKE_ENGINE__WAL_FILE_BYTES": str(8 << 20), "LOGLAKE_STORAGE_MIN_FREE_BYTES": str(4 << 20)}
    with serving_broker(small_fs / "d", env=env) as broker:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        producer.produce("fits", b"x" * 1000)
        assert producer.flush(30) == 0


def test_every_exit_code_is_distinct_and_documented() -> None:
    """The EXIT_* table in loglake/cli/startup.py is the one owner; README's list and the module's
    own table name every code in it."""
    codes = {name: value for name, value in vars(startup).items() if name.startswith("EXIT_")}
    assert len(set(codes.values())) == len(codes), codes
    text = README.read_text()
    start = text.index("exits with a code that says why:")
    listed = text[start : text.index('"Safe by default"', start)]
    table = startup.__doc__ or ""
    for name, value in codes.items():
        assert re.search(rf"(?<![\w.]){value} [a-z`]", listed), f"README.md does not list exit code {value} ({name})"
        assert re.search(rf"(?m)(^|\s){value}  \S", table), f"startup.py's table does not list exit code {value} ({name})"


@pytest.mark.parametrize("url", ["s3:/bucket", "ftp://host/x"])
def test_a_cold_store_url_that_is_no_accepted_form(tmp_path: Path, url: str) -> None:
    """Issue 34, item 6: `s3:/bucket` used to tier into a local folder named `s3:`; `ftp://` listed
    every scheme but s3://."""
    result = subprocess.run(
        [*LOGLAKE, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--cold-store", url],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert_one_line(result, EXIT_CONFIG, url, "file:///abs/path", "s3://bucket", "plain directory path")
    assert not (tmp_path / "s3:").exists()


# ---- an unreachable bucket or etcd: one error line and one hint, no retry warnings (issue 34, item 8)


def _serve_env(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # no credentials from files or the instance metadata service of wherever the tests run
    base.update({"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                 "AWS_EC2_METADATA_DISABLED": "true"})
    return subprocess.run([*LOGLAKE, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=120, env={**base, **env})


def _hint(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), result.stderr
    return lines[1]


def test_s3_cold_store_without_credentials(tmp_path: Path) -> None:
    url = f"s3://bucket?endpoint_url=http://127.0.0.1:{free_port()}"
    result = _serve_env(tmp_path, {}, "--cold-store", url)
    assert_one_line(result, 1, "NoCredentialsError")
    assert "AWS_ACCESS_KEY_ID" in _hint(result) and "AWS_PROFILE" in _hint(result)


def test_s3_cold_store_endpoint_unreachable(tmp_path: Path) -> None:
    url = f"s3://bucket?endpoint_url=http://127.0.0.1:{free_port()}&retry_base_delay=0.01"
    result = _serve_env(tmp_path, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}, "--cold-store", url)
    assert_one_line(result, 1, "EndpointConnectionError")  # and no "attempt 1/6 failed ... retrying" line first
    assert "endpoint_url" in _hint(result) and "reachable" in _hint(result)


def test_etcd_unreachable(tmp_path: Path) -> None:
    # What the same command takes to fail at once (a bad cold store URL) on this machine now: a
    # loaded machine's start-up is seconds, so the bound below is relative to it.
    started = time.monotonic()
    quick = _serve_env(tmp_path, {}, "--cluster", "etcd://127.0.0.1:1/x", "--cold-store", "ftp://nowhere")
    assert quick.returncode != 0
    baseline = time.monotonic() - started
    started = time.monotonic()
    port = free_port()
    result = _serve_env(tmp_path, {}, "--cluster", f"etcd://127.0.0.1:{port}/x", "--cold-store", f"file://{tmp_path}/cold")
    assert_one_line(result, 1, "etcd unreachable", f"127.0.0.1:{port}")
    assert "--cluster" in _hint(result) and "LOGLAKE_CLUSTER" in _hint(result)
    # Not the metadata store's 15 s of retries first: a refused connection is the answer.
    assert time.monotonic() - started < baseline + 5, baseline
