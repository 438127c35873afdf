"""Every example in README.md and docs/*.md runs as written.

Fenced blocks are tagged: ``sh``/``bash`` commands run in a shell, ``python`` runs (with a
SparkSession when the example uses ``spark``), ``toml`` is checked with ``loglake serve
--print-config``; ``text`` and ``json`` are layouts and output, not commands. A block that cannot
run here says why on the line before it: ``<!-- doctest: skip REASON -->``.

Where an example talks to a broker (``127.0.0.1:9092``, ``localhost:9092``, ``broker:9092``) it
gets a real one started for this module; ``loglake serve`` and ``make run`` start their own on a
free port and are stopped when the block is done; ``--follow`` runs until a short timeout. The
address a block's ``loglake serve --listen`` names is moved to a free port everywhere in that
block, so its later commands reach that broker. ``etcd`` starts a real member (its 127.0.0.1
client and peer ports moved to free ones the same way), waited on until healthy and stopped after
the block's brokers. A document is one shell session: its blocks run in order, and an ``export``
holds for the rest of it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brokerkit import Broker, free_port, serving_broker

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("sh", "bash", "python", "toml")
DESCRIPTIVE = ("text", "json")
BIN = Path(sys.executable).parent
#: Addresses examples use for "the broker".
BROKER_ADDRESSES = ("127.0.0.1:9092", "localhost:9092", "broker:9092")
#: How long one command may run; a server command how long it may take to start listening.
COMMAND_TIMEOUT_S = 180
FOLLOW_TIMEOUT_S = 4
_SKIP = re.compile(r"<!--\s*doctest:\s*skip\s+(.+?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                lang = lines[i][3:].strip()
                start = i
                i += 1
                body = []
                while i < len(lines) and not lines[i].startswith("```"):
                    body.append(lines[i])
                    i += 1
                before = lines[start - 1] if start else ""
                skip = _SKIP.search(before)
                out.append(Block(path, start + 1, lang, "\n".join(body) + "\n", skip.group(1) if skip else None))
            i += 1
    return out


ALL = blocks()


def of(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in ALL if b.lang in langs]


def uses_spark(block: Block) -> bool:
    return block.path.name == "SPARK.md" or "spark" in block.code


def test_every_block_says_what_it_is() -> None:
    """Untagged blocks would silently escape this test: each is runnable or marked as a layout."""
    bad = [b.id for b in ALL if b.lang not in RUNNABLE + DESCRIPTIVE]
    assert not bad, f"tag these blocks with one of {RUNNABLE + DESCRIPTIVE}: {bad}"
    assert len([b for b in ALL if b.lang in RUNNABLE and b.skip is None]) >= 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with serving_broker(tmp_path_factory.mktemp("docs-broker") / "data") as b:
        yield b


def _substitute(code: str, bootstrap: str) -> str:
    for address in BROKER_ADDRESSES:
        code = code.replace(address, bootstrap)
    return code


def _commands(code: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    out: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def _env(exported: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGLAKE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **(exported or {})}


_EXPORTS: dict[Path, dict[str, str]] = {}


def _start_server(command: str, cwd: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        command, shell=True, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "loglake listening on" in line:
            return proc
        if time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGTERM)
    raise AssertionError(f"{command!r} did not start listening:\n{''.join(seen)}")


#: 127.0.0.1 ports of an example's etcd member (client, peer): moved to free ports in its block
ETCD_ADDRESSES = ("127.0.0.1:2379", "127.0.0.1:2380")


def _moved_addresses(code: str) -> str:
    """`code` with every address a `loglake serve --listen` or an `etcd` member of it binds
    replaced by 127.0.0.1 and a free port, wherever the block names it."""
    wanted = [*re.findall(r"--listen\s+(?:[A-Za-z_]+://)?([^\s,]+)", code)]
    if re.search(r"^\s*etcd\s", code, re.MULTILINE):
        wanted += [a for a in ETCD_ADDRESSES if a in code]
    for address in dict.fromkeys(wanted):
        code = re.sub(rf"(?<![\w.]){re.escape(address)}(?!\d)", f"127.0.0.1:{free_port()}", code)
    return code


def _start_etcd(command: str, cwd: Path) -> subprocess.Popen[str]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (Debian package etcd-server; .ci/run installs it)")
    clients = re.search(r"--listen-client-urls\s+(\S+)", command)
    assert clients, f"{command!r}: name --listen-client-urls so the test can wait for the member"
    proc = subprocess.Popen(
        command, shell=True, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{clients.group(1).split(',')[0]}/health", timeout=1.0) as resp:
                if b'"true"' in resp.read():
                    return proc
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    _stop(proc)
    raise AssertionError(f"{command!r} did not become healthy")


def _stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


@pytest.mark.parametrize("block", of("sh", "bash"))
def test_shell_example(block: Block, broker: Broker, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(block.skip)
    servers: list[subprocess.Popen[str]] = []
    # A document is read as one shell session: `export K=V` holds for its later blocks too.
    exported = _EXPORTS.setdefault(block.path, {})
    try:
        for command in _commands(_moved_addresses(_substitute(block.code, broker.bootstrap))):
            words = shlex.split(command, comments=True)
            if words[0] == "export":
                exported.update(w.split("=", 1) for w in words[1:] if "=" in w)  # type: ignore[misc]
                continue
            if words[:2] == ["make", "test"]:
                continue  # this suite is what `make test` runs
            if words[:2] == ["make", "run"]:
                port = free_port()
                servers.append(_start_server(f"make -s -C {ROOT} run LISTEN=127.0.0.1:{port} DATA_DIR={tmp_path / 'make-run-data'}", tmp_path))
                continue
            if words[:2] == ["loglake", "serve"]:
                servers.append(_start_server(command, tmp_path))
                continue
            if words[0] == "etcd":
                servers.append(_start_etcd(command, tmp_path))
                continue
            follow = "--follow" in words
            # its own session, so that a timeout stops the command and not only its shell
            proc = subprocess.Popen(
                command, shell=True, cwd=tmp_path, env=_env(exported), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True,
            )
            try:
                out, err = proc.communicate(timeout=FOLLOW_TIMEOUT_S if follow else COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.communicate(timeout=60)
                assert follow, f"{block.id}: {command!r} did not finish in {COMMAND_TIMEOUT_S} s"
                continue
            assert proc.returncode == 0, f"{block.id}: {command!r} exited {proc.returncode}:\n{out}\n{err}"
    finally:
        for proc in reversed(servers):  # brokers before the etcd they hand their partitions back through
            _stop(proc)


@pytest.mark.parametrize("block", [p for p in of("python") if not uses_spark(p.values[0])])
def test_python_example(block: Block, broker: Broker, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(block.skip)
    script = tmp_path / "example.py"
    script.write_text(_substitute(block.code, broker.bootstrap))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert result.returncode == 0, f"{block.id}:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("block", of("toml"))
def test_toml_example(block: Block, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(block.skip)
    (tmp_path / "broker.toml").write_text(block.code)
    result = subprocess.run(
        [str(BIN / "loglake"), "serve", "--config", str(tmp_path / "broker.toml"), "--print-config"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"{block.id}: {result.stderr}"


@pytest.mark.parametrize("block", [p for p in of("python") if uses_spark(p.values[0])])
def test_spark_example(block: Block, spark: Any, broker: Broker, tmp_path: Path) -> None:
    """Spark examples run in the suite's SparkSession, with `path`, `out`, `ckpt` and a `df` of ids
    defined, over a data directory holding the topics the examples name."""
    if block.skip:
        pytest.skip(block.skip)
    import loglake

    data = tmp_path / "data"
    with loglake.open(str(data)) as log:
        for topic in ("orders", "payments"):
            log.create_topic(topic, 2)
            for p in range(2):
                log.produce_batch(topic, [(None, f"{topic}-{p}-{i}".encode()) for i in range(1500)], partition=p)
        log.flush()
    code = _substitute(block.code, broker.bootstrap).replace("/var/lib/loglake", str(data))
    namespace: dict[str, Any] = {
        "spark": spark,
        "path": str(data),
        "out": str(tmp_path / "out"),
        "ckpt": str(tmp_path / "ckpt"),
        "df": spark.range(5),
    }
    exec(compile(code, block.id, "exec"), namespace)
    query = namespace.get("q")
    if query is not None:
        query.awaitTermination(COMMAND_TIMEOUT_S)
        assert query.exception() is None
    frame = namespace.get("df")
    if frame is not None and block.code.lstrip().startswith("import"):
        assert frame.count() > 0
