"""One configuration schema for flags, LOGLAKE_* environment variables and the TOML file: types and
ranges checked at start-up, errors that name setting, value, source and the allowed range, and
`loglake serve --print-config` showing where every value came from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loglake.broker.config import BrokerConfig
from loglake.cli.startup import EXIT_CONFIG
from loglake.errors import ConfigError

LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]


def serve(tmp_path: Path, *args: str, toml: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*LOGLAKE, "serve", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0"]
    if toml is not None:
        (tmp_path / "broker.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "broker.toml")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOGLAKE_")}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, env={**clean, **(env or {})})


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('default_partitions = "3"\n', ["default_partitions='3'", "broker.toml:1", "expected an integer"]),
        ("# the port\nlisten = 29110\n", ["listen=29110", "broker.toml:2", "expected a list of strings"]),
        ('[engine]\nmemory_budget_bytes = "1GB"\n', ["engine.memory_budget_bytes='1GB'", "broker.toml:2", "expected an integer"]),
        ("max_connections = -5\n", ["max_connections=-5", "broker.toml:1", "allowed [1, 2147483647]"]),
        ("idle_timeout_ms = 0\n", ["idle_timeout_ms=0", "allowed [1000,"]),
        ("no_such_setting = 1\n", ["broker.toml:1", "unknown setting 'no_such_setting'"]),
        ("[engine]\nmemory_budget_bytes = 1000\n", ["memory_budget_bytes must be at least 4 MiB", "broker.toml:2"]),
    ],
)
def test_bad_file_values_are_one_line_naming_setting_value_and_place(tmp_path: Path, toml: str, words: list[str]) -> None:
    result = serve(tmp_path, toml=toml)
    assert result.returncode == EXIT_CONFIG, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"LOGLAKE_MAX_CONNECTIONS": "-5"}, ["max_connections='-5'", "LOGLAKE_MAX_CONNECTIONS", "allowed [1, 2147483647]"]),
        ({"LOGLAKE_AUTO_CREATE_TOPICS": "maybe"}, ["LOGLAKE_AUTO_CREATE_TOPICS", "true or false"]),
        ({"LOGLAKE_MEMORY_BUDGET_BYTES": "1GB"}, ["engine.memory_budget_bytes='1GB'", "LOGLAKE_MEMORY_BUDGET_BYTES", "an integer"]),
        ({"LOGLAKE_ENGINE__NO_SUCH": "1"}, ["LOGLAKE_ENGINE__NO_SUCH", "unknown engine setting"]),
    ],
)
def test_bad_environment_values(tmp_path: Path, env: dict[str, str], words: list[str]) -> None:
    result = serve(tmp_path, env=env)
    assert result.returncode == EXIT_CONFIG, result.stderr
    (line,) = result.stderr.strip().splitlines()
    for w in words:
        assert w in line, (w, line)


def test_print_config_shows_every_source_and_the_precedence(tmp_path: Path) -> None:
    toml = 'max_connections = 50\nidle_timeout_ms = 5000\ndefault_partitions = 2\n[engine]\nseal_threads = 3\n[topic_defaults]\n"retention.ms" = "60000"\n'
    env = {"LOGLAKE_IDLE_TIMEOUT_MS": "7000", "LOGLAKE_DEFAULT_PARTITIONS": "4", "LOGLAKE_MEMORY_BUDGET_BYTES": "67108864", "LOGLAKE_ENGINE__WAL_SHARDS": "3"}
    result = serve(tmp_path, "--default-partitions", "6", "--cold-store", f"file://{tmp_path}/bucket", "--print-config", toml=toml, env=env)
    assert result.returncode == 0, result.stderr
    lines = set(result.stdout.splitlines())
    assert "max_connections = 50  # " + str(tmp_path / "broker.toml") + ":1" in lines  # file
    assert "idle_timeout_ms = 7000  # LOGLAKE_IDLE_TIMEOUT_MS" in lines  # env beats file
    assert "default_partitions = 6  # --default-partitions" in lines  # flag beats env and file
    assert "node_id = 0  # default" in lines
    assert "seal_threads = 3  # " + str(tmp_path / "broker.toml") + ":5" in lines
    assert "memory_budget_bytes = 67108864  # LOGLAKE_MEMORY_BUDGET_BYTES" in lines  # no longer ignored
    assert "wal_shards = 3  # LOGLAKE_ENGINE__WAL_SHARDS" in lines
    assert f'cold_store_url = "file://{tmp_path}/bucket"  # cold_store, --cold-store' in lines
    assert '"retention.ms" = "60000"  # ' + str(tmp_path / "broker.toml") + ":7" in lines
    assert not (tmp_path / "data").exists()  # printing the configuration opens nothing


def test_load_checks_types_from_every_source() -> None:
    assert BrokerConfig.load(env={"LOGLAKE_MAX_CONNECTIONS": "12"}).max_connections == 12
    assert BrokerConfig.load(env={}, max_connections=13).sources["max_connections"] == "--max-connections"
    with pytest.raises(ConfigError, match=r"group_min_session_timeout_ms=9000 is above"):
        BrokerConfig.load(env={"LOGLAKE_GROUP_MIN_SESSION_TIMEOUT_MS": "9000", "LOGLAKE_GROUP_MAX_SESSION_TIMEOUT_MS": "8000"})
    with pytest.raises(ConfigError, match=r"expected an integer, got bool"):
        BrokerConfig.load(env={}, default_partitions=True)


def test_share_group_session_and_heartbeat_settings_are_checked_against_their_ranges() -> None:
    # Kafka's GroupCoordinatorConfig checks: group.share.session.timeout.ms within its min/max, ...
    with pytest.raises(ConfigError, match=re.escape("group.share.min.session.timeout.ms <= group.share.session.timeout.ms")):
        BrokerConfig.load(env={"LOGLAKE_GROUP_SHARE_SESSION_TIMEOUT_MS": "10000"})
    with pytest.raises(ConfigError, match=re.escape("group.share.min.heartbeat.interval.ms <= group.share.heartbeat")):
        BrokerConfig.load(env={"LOGLAKE_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": "1000"})
    # ... and the interval below the timeout
    with pytest.raises(ConfigError, match=re.escape("heartbeat.interval.ms must be below group.share.session.timeout.ms")):
        BrokerConfig.load(env={"LOGLAKE_GROUP_SHARE_MIN_SESSION_TIMEOUT_MS": "2000", "LOGLAKE_GROUP_SHARE_SESSION_TIMEOUT_MS": "2000",
                               "LOGLAKE_GROUP_SHARE_MIN_HEARTBEAT_INTERVAL_MS": "2000", "LOGLAKE_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": "2000"})
    lowered = BrokerConfig.load(env={"LOGLAKE_GROUP_SHARE_MIN_SESSION_TIMEOUT_MS": "10000", "LOGLAKE_GROUP_SHARE_SESSION_TIMEOUT_MS": "10000"})
    assert lowered.group_share_session_timeout_ms == 10_000
