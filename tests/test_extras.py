"""Optional dependencies (issue 34, item 9): a feature whose extra is not installed ends with one
`error:` line and one `hint:` line naming `pip install 'loglake[EXTRA]'`, never a
ModuleNotFoundError traceback; which module each extra installs is one table
(loglake.extras.EXTRA_OF_MODULE), checked here against pyproject.toml.

The subprocesses run the real `loglake` command with the module hidden: a sitecustomize on
PYTHONPATH puts None in sys.modules for it, which makes every import of it fail as an absent one
does (ModuleNotFoundError; importlib.util.find_spec answers None).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from loglake.cli.startup import EXIT_CONFIG
from loglake.extras import EXTRA_OF_MODULE, MissingExtraError, install_command, missing_extra

ROOT = Path(__file__).resolve().parents[1]
LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]

SITECUSTOMIZE = """\
import os, sys
for name in os.environ.get("LOGLAKE_TEST_HIDDEN_MODULES", "").split(","):
    if name:
        sys.modules[name] = None
"""


def run_without(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hide), env.get("PYTHONPATH", "")) if p)
    env["LOGLAKE_TEST_HIDDEN_MODULES"] = module
    return subprocess.run([*LOGLAKE, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def assert_names_the_extra(result: subprocess.CompletedProcess[str], code: int, module: str, extra: str) -> None:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "ModuleNotFoundError" not in result.stderr, result.stderr
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("error: ") and f"needs the {module} package (the '{extra}' extra)" in lines[0], lines
    assert lines[1] == f"hint: install it with: pip install 'loglake[{extra}]'", lines


def test_serve_cluster_without_the_cluster_extra(tmp_path: Path) -> None:
    result = run_without(
        "etcd3gw", tmp_path, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
        "--cluster", "etcd://127.0.0.1:1/x", "--cold-store", f"file://{tmp_path}/cold",
    )
    assert_names_the_extra(result, EXIT_CONFIG, "etcd3gw", "cluster")
    assert "cluster mode (--cluster)" in result.stderr


def test_serve_s3_cold_store_without_the_s3_extra(tmp_path: Path) -> None:
    result = run_without("boto3", tmp_path, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--cold-store", "s3://bucket")
    assert_names_the_extra(result, EXIT_CONFIG, "boto3", "s3")


def test_serve_uvloop_without_the_fast_extra(tmp_path: Path) -> None:
    result = run_without("uvloop", tmp_path, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--event-loop", "uvloop")
    assert_names_the_extra(result, EXIT_CONFIG, "uvloop", "fast")


def test_verify_s3_cold_store_without_the_s3_extra(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    result = run_without("boto3", tmp_path, "verify", "--data-dir", str(tmp_path / "d"), "--cold-store", "s3://bucket")
    assert_names_the_extra(result, 1, "boto3", "s3")


def test_pipeline_without_the_spark_extra(tmp_path: Path) -> None:
    # A data directory with something to land: what can be told without Spark (a path with no
    # loglake data, nothing new to land) is told first, with or without the extra.
    import loglake

    data = tmp_path / "data"
    with loglake.open(str(data)) as log:
        log.create_topic("t", 1)
        log.produce("t", b"v")
    result = run_without("pyspark", tmp_path, "pipeline", "export", "--path", str(data), "--topic", "t", "--to", str(tmp_path / "out"))
    assert_names_the_extra(result, 1, "pyspark", "spark")


def test_serve_schema_registry_without_the_registry_extra(tmp_path: Path) -> None:
    result = run_without(
        "fastavro", tmp_path, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
        "--schema-registry-listen", "127.0.0.1:0",
    )
    assert_names_the_extra(result, EXIT_CONFIG, "fastavro", "registry")
    assert "--schema-registry-listen" in result.stderr


def test_the_table_matches_pyproject_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    offered = set(extras) - {"test"}
    assert set(EXTRA_OF_MODULE.values()) == offered  # every extra has its modules here, and no other
    for module, extra in EXTRA_OF_MODULE.items():
        requirements = " ".join(extras[extra])
        # botocore comes with boto3; protobuf's module is google.protobuf; PyJWT installs jwt
        dist = {"botocore": "boto3", "google": "protobuf", "proto_schema_parser": "proto-schema-parser", "jwt": "pyjwt"}.get(
            module, module
        )
        assert re.search(rf"(^|\s){re.escape(dist)}\b", requirements), (module, extra, requirements)


def test_missing_extra_finds_the_module_in_the_cause_chain() -> None:
    try:
        try:
            raise ModuleNotFoundError("No module named 'etcd3gw.client'", name="etcd3gw.client")
        except ImportError as inner:
            raise RuntimeError("while composing") from inner
    except RuntimeError as outer:
        found = missing_extra(outer, "x")
    assert isinstance(found, MissingExtraError) and (found.module, found.extra) == ("etcd3gw", "cluster")
    assert missing_extra(ModuleNotFoundError("No module named 'nope'", name="nope"), "x") is None


def test_the_install_command_is_spelled_once() -> None:
    """One owner: messages get `pip install 'loglake[...]'` from loglake.extras, nowhere else."""
    spelled = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "src" / "loglake").rglob("*.py")
        if "pip install 'loglake[" in path.read_text() and path.name != "extras.py"
    ]
    assert spelled == []
    assert install_command("s3") == "pip install 'loglake[s3]'"


@pytest.mark.parametrize("module", sorted(EXTRA_OF_MODULE))
def test_every_module_of_the_table_names_its_extra(module: str) -> None:
    err = MissingExtraError("a feature", module)
    assert err.extra == EXTRA_OF_MODULE[module] and err.hint == f"install it with: {install_command(err.extra)}"
