"""The canary switches themselves (loglake/canary.py): off by default, one flag per name, unknown
names refused, read from the environment at import, inherited by broker processes.

Whether the tests catch each canary is tests/test_long_canaries.py's job (make test-long).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loglake import canary

from brokerkit import Broker

FLAGS = {
    "skip_wal_fsync": "SKIP_WAL_FSYNC",
    "ack_before_wal_write": "ACK_BEFORE_WAL_WRITE",
    "skip_crc_check": "SKIP_CRC_CHECK",
    "skip_chain_check": "SKIP_CHAIN_CHECK",
    "delete_hot_before_cold_verified": "DELETE_HOT_BEFORE_COLD_VERIFIED",
}

_PRINT_FLAGS = (
    "import json; from loglake import canary; "
    f"print(json.dumps({{n: getattr(canary, f) for n, f in {FLAGS!r}.items()}}))"
)


def _python(code: str, value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != canary.ENV}
    if value is not None:
        env[canary.ENV] = value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_no_canary_is_on_by_default() -> None:
    assert os.environ.get(canary.ENV) is None, f"{canary.ENV} is set: the suite would run with safety checks broken"
    assert not canary.ACTIVE
    assert not any(getattr(canary, flag) for flag in FLAGS.values())
    assert not any(canary.active(name) for name in canary.NAMES)


def test_every_canary_has_a_flag() -> None:
    assert set(canary.NAMES) == set(FLAGS)
    for flag in FLAGS.values():
        assert getattr(canary, flag) is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, set()),
        ("", set()),
        (" , ", set()),
        ("skip_crc_check", {"skip_crc_check"}),
        (" skip_wal_fsync , ack_before_wal_write,", {"skip_wal_fsync", "ack_before_wal_write"}),
    ],
)
def test_parse(value: str | None, expected: set[str]) -> None:
    assert canary.parse(value) == expected


@pytest.mark.parametrize("value", ["skip_wal_fsink", "skip_crc_check,SKIP_CHAIN_CHECK", "all"])
def test_an_unknown_name_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="unknown canary"):
        canary.parse(value)
    with pytest.raises(ValueError, match="unknown canary"):
        canary.active(value)


def test_each_name_turns_on_its_flag_and_only_it() -> None:
    """Read from the environment at import, in a fresh interpreter per name."""
    for name, flag in FLAGS.items():
        got = _python(_PRINT_FLAGS, name)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == {n: n == name for n in FLAGS}, flag


def test_an_unknown_name_in_the_environment_stops_the_import() -> None:
    got = _python("import loglake", "skip_wal_fsync,skip_crc_chek")
    assert got.returncode != 0
    assert "unknown canary skip_crc_chek" in got.stderr


def test_a_broker_process_inherits_the_canary_and_warns(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "data", env={canary.ENV: "skip_crc_check"}).start()
    try:
        assert broker.stop() == 0
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop()
    text = broker.log_text()
    assert "CANARY MUTATIONS ACTIVE" in text and "skip_crc_check" in text, text[-3000:]


def test_an_engine_without_canaries_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import loglake

    with caplog.at_level("WARNING", logger="loglake.canary"), loglake.open(str(tmp_path / "d"), wal_shards=1):
        pass
    assert not [r for r in caplog.records if r.name == "loglake.canary"]
