"""tests/brokerkit.py's `InProcessBroker`: configured as `loglake serve` configures itself from the
same flags and environment, each broker's log holds its own lines only, a stop leaves no thread
and releases the data directory, a traceback of any of its threads lands in its log, and a
start that fails says why as a process broker's does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from loglake.cli.serve import config_of

from brokerkit import InProcessBroker, serving_in_process, start_on_port

LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]


def _broker_threads() -> set[str]:
    """Names of the threads a broker runs (the engine's, the executors', the loop's)."""
    return {t.name for t in threading.enumerate() if t.name.startswith(("broker-", "wal-", "loglake-", "asyncio_"))}


def _wait_for(b: InProcessBroker, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in b.log_text():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{b.log_text()[-3000:]}"
        time.sleep(0.05)


def test_the_flags_and_environment_mean_what_they_mean_to_serve(tmp_path: Path) -> None:
    conf = tmp_path / "broker.toml"
    conf.write_text('max_connections = 77\n\n[topic_defaults]\n"segment.ms" = "7200000"\n')
    args = [
        "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--listen", "SASL_PLAINTEXT://127.0.0.1:0",
        "--default-partitions", "3", "--no-auto-create-topics", "--config", str(conf),
    ]
    env = {**os.environ, "LOGLAKE_IDLE_TIMEOUT_MS": "1234"}
    printed = subprocess.run(
        [*LOGLAKE, "serve", *args, "--print-config"], capture_output=True, text=True, timeout=60, env=env, check=True
    ).stdout
    config = config_of(args, env)
    assert config.describe() == printed
    assert (config.default_partitions, config.auto_create_topics, config.idle_timeout_ms, config.max_connections) == (3, False, 1234, 77)
    assert not (tmp_path / "data").exists()  # nothing opened


def test_two_brokers_keep_their_own_logs_and_leave_nothing_running(tmp_path: Path) -> None:
    before = _broker_threads()
    a = InProcessBroker(tmp_path / "a").start()
    b = InProcessBroker(tmp_path / "b", log_level="DEBUG").start()
    try:
        assert a.port != b.port and a.ports == [a.port]
        admin = AdminClient({"bootstrap.servers": a.bootstrap})
        admin.create_topics([NewTopic("only-on-a", 1)])["only-on-a"].result(30)
        _wait_for(a, "created topic only-on-a")
        AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=15)
        _wait_for(b, "DEBUG loglake.broker: connection 127.0.0.1:")
        assert "only-on-a" not in b.log_text()
        assert "DEBUG" not in a.log_text()  # a runs at INFO although b runs at DEBUG
    finally:
        assert b.stop() == 0
        assert a.stop() == 0
    assert not a.running and not b.running
    assert _broker_threads() == before
    assert "shutdown complete" in a.log_text() and "shutdown complete" in b.log_text()
    # The data directory was released: the same broker starts again on it and has the topic.
    with serving_in_process(tmp_path / "a") as again:
        topics = AdminClient({"bootstrap.servers": again.bootstrap}).list_topics(timeout=15).topics
        assert "only-on-a" in topics
    assert _broker_threads() == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_traceback_in_any_of_its_threads_fails_serving(tmp_path: Path) -> None:
    def fail_in_a_thread_of_the_broker() -> None:
        threading.Thread(target=lambda: 1 / 0, name="doomed").start()

    # serving_in_process checks the log when it is left
    with pytest.raises(AssertionError, match="ZeroDivisionError"), serving_in_process(tmp_path / "data") as b:
        assert b._loop is not None
        b._loop.call_soon_threadsafe(fail_in_a_thread_of_the_broker)
        _wait_for(b, "uncaught exception in thread doomed")
    assert "Traceback" in b.log_text() and not b.running


def test_a_port_in_use_is_refused_and_releases_the_data_directory(tmp_path: Path) -> None:
    before = _broker_threads()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=r"(?i)broker did not start: .*address already in use"):
            InProcessBroker(tmp_path / "data", ["--listen", f"127.0.0.1:{port}"]).start()
        assert _broker_threads() == before
    b = InProcessBroker(tmp_path / "data", ["--listen", f"127.0.0.1:{port}"])
    start_on_port(b, port)  # the lock was released, the port is free now
    assert b.stop() == 0
