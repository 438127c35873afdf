"""Every example in README.md and docs/*.md runs as written.

Fenced blocks are tagged: ``sh``/``bash`` commands run in a shell, ``python`` runs (with a
SparkSession when the example uses ``spark``), ``toml`` is checked with ``loglake serve
--print-config``; ``text`` and ``json`` are layouts and output, not commands. A block that cannot
run here says why on the line before it: ``<!-- doctest: skip REASON -->``.

Where an example talks to a broker (``127.0.0.1:9092``, ``localhost:9092``, ``broker:9092``) it
gets a real one started for this module; ``loglake serve`` and ``make run`` start their own on a
free port and are stopped when the block is done (every ``--listen`` of a ``loglake serve`` gets a
free port of its own, and the block's later commands are pointed at it); ``--follow`` runs until a
short timeout. ``etcd`` starts a real member (its 127.0.0.1 client and peer ports moved to free
ones in its block), waited on until healthy and stopped after the block's brokers. A document is
one shell session: its blocks run in order, in one working directory, and an ``export`` or a
variable assignment (``SSL="-X ..."``) holds for the rest of it; a here-document (``python -
<<'PY'``) is one command; ``make test`` and ``. .venv/bin/activate`` are what this suite already
is and has. A command's comment may say what it does: ``# prints WORD`` (its output holds WORD)
or ``# refused`` (it exits non-zero); any other command must exit 0. A shell block that runs
Spark (``loglake pipeline``) runs with the Spark tests, apart.
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


def test_the_shell_session_reads_commands_as_a_shell_would() -> None:
    """What test_shell_example relies on: here-documents stay whole (a `#` in them is no comment),
    a trailing comment says what a command does, and every --listen gets a port of its own."""
    code = "A='x # y'  # prints x\npython - <<'PY'\n# a comment in Python\nprint(1)\nPY\n# alone\nls \\\n  -l  # refused: no\n"
    assert _commands(code) == [
        "A='x # y'  # prints x",
        "python - <<'PY'\n# a comment in Python\nprint(1)\nPY",
        "ls    -l  # refused: no",
    ]
    assert _split_comment("A='x # y'  # prints x") == ("A='x # y'", "prints x")
    assert Expect.of("prints hi (no group)") == Expect(prints="hi")
    assert Expect.of("refused: no client certificate") == Expect(refused=True)
    assert Expect.of("lag per partition") == Expect()
    ports: dict[str, str] = {}
    served = _listen_on_free_ports("loglake serve --listen 127.0.0.1:9092 --listen SASL_SSL://127.0.0.1:9094", ports)
    assert set(ports) == {"127.0.0.1:9092", "127.0.0.1:9094"} and len(set(ports.values())) == 2
    assert served == f"loglake serve --listen {ports['127.0.0.1:9092']} --listen SASL_SSL://{ports['127.0.0.1:9094']}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with serving_broker(tmp_path_factory.mktemp("docs-broker") / "data") as b:
        yield b


def _substitute(code: str, bootstrap: str) -> str:
    for address in BROKER_ADDRESSES:
        code = code.replace(address, bootstrap)
    return code


_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _commands(code: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, a here-document kept with its
    command, comments and blank lines dropped (a command's own trailing comment stays)."""
    out: list[str] = []
    pending = ""
    lines = iter(code.splitlines())
    for raw in lines:
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        heredoc = _HEREDOC.search(_split_comment(line)[0])
        if heredoc:
            body = []
            for more in lines:
                body.append(more)
                if more.strip() == heredoc.group(1):
                    break
            line = "\n".join([line, *body])
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def _split_comment(command: str) -> tuple[str, str]:
    """A command line and its trailing comment (a `#` starting a word outside quotes)."""
    quote = ""
    for i, ch in enumerate(command):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip(), command[i + 1 :].strip()
    return command, ""


@dataclass(frozen=True)
class Expect:
    """What a command's comment says it does: `prints WORD` or `refused`."""

    prints: str | None = None
    refused: bool = False

    @classmethod
    def of(cls, comment: str) -> Expect:
        words = comment.split()
        if words[:1] == ["prints"] and len(words) > 1:
            return cls(prints=words[1])
        return cls(refused=bool(words) and words[0].rstrip(":") == "refused")


def _listen_on_free_ports(command: str, ports: dict[str, str]) -> str:
    """Each `--listen [PROTO://]HOST:PORT` of a server command on a free port; `ports` maps the
    written HOST:PORT to the one it got, for the commands after it."""

    def rewrite(m: re.Match[str]) -> str:
        proto, host, port = m.group(2) or "", m.group(3), m.group(4)
        new = f"{host}:{free_port()}"
        ports[f"{host}:{port}"] = new
        return f"{m.group(1)}{proto}{new}"

    return re.sub(r"(--listen[ =])((?:[A-Z_]+://)?)([\w.-]+|\[[\w:]+\]):(\d+)", rewrite, command)


def _env(exported: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGLAKE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **(exported or {})}


_EXPORTS: dict[Path, dict[str, str]] = {}


def _start_server(command: str, cwd: Path, exported: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        command, shell=True, cwd=cwd, env=_env(exported), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
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


_SESSIONS: dict[tuple[Path, bool], Path] = {}


def runs_spark(block: Block) -> bool:
    """A shell block that starts Spark (a `loglake pipeline` job, pyspark): it runs with the Spark
    tests (tests/conftest.py's Spark group), so that no two JVMs run at once."""
    return "loglake pipeline" in block.code or "pyspark" in block.code


@pytest.mark.parametrize("block", [p for p in of("sh", "bash") if not runs_spark(p.values[0])])
def test_shell_example(block: Block, broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.skip:
        pytest.skip(block.skip)
    _run_shell_block(block, _substitute(block.code, broker.bootstrap), tmp_path_factory)


@pytest.mark.parametrize("block", [p for p in of("sh", "bash") if runs_spark(p.values[0])])
def test_spark_shell_example(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Spark's shell blocks: on the Spark tests' worker, in a working directory of their own (the
    rest of their document may run on another worker), so each stands alone, with no broker."""
    if block.skip:
        pytest.skip(block.skip)
    assert not any(a in block.code for a in BROKER_ADDRESSES), f"{block.id}: a Spark shell block gets no broker"
    _run_shell_block(block, block.code, tmp_path_factory)


def _run_shell_block(block: Block, code: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    servers: list[subprocess.Popen[str]] = []
    # A document is read as one shell session: `export K=V` holds for its later blocks too, and
    # they share a working directory (a recipe goes on with the files an earlier one made).
    exported = _EXPORTS.setdefault(block.path, {})
    session = (block.path, runs_spark(block))
    if session not in _SESSIONS:
        _SESSIONS[session] = tmp_path_factory.mktemp(block.path.stem)
    cwd = _SESSIONS[session]
    ports: dict[str, str] = {}
    try:
        for line in _commands(_moved_addresses(code)):
            first, newline, heredoc = line.partition("\n")
            command, comment = _split_comment(first)
            command += newline + heredoc
            for written, got in ports.items():
                command = command.replace(written, got)
            words = shlex.split(command.split("\n", 1)[0], comments=True)
            if words[0] == "export" or (len(words) == 1 and _ASSIGNMENT.match(words[0])):
                exported.update(w.split("=", 1) for w in words[words[0] == "export" :] if "=" in w)  # type: ignore[misc]
                continue
            if words[0] in (".", "source") and words[1:] == [".venv/bin/activate"]:
                continue  # the venv's bin is first on every command's PATH here (_env)
            if words[:2] == ["make", "test"]:
                continue  # this suite is what `make test` runs
            if words[:2] == ["make", "run"]:
                port = free_port()
                servers.append(_start_server(f"make -s -C {ROOT} run LISTEN=127.0.0.1:{port} DATA_DIR={cwd / 'make-run-data'}", cwd))
                continue
            if words[:2] == ["loglake", "serve"]:
                servers.append(_start_server(_listen_on_free_ports(command, ports), cwd, exported))
                continue
            if words[0] == "etcd":
                servers.append(_start_etcd(command, cwd))
                continue
            _run(block, command, Expect.of(comment), cwd, exported, follow="--follow" in words)
    finally:
        for proc in reversed(servers):  # brokers before the etcd they hand their partitions back through
            _stop(proc)


def _run(block: Block, command: str, expect: Expect, cwd: Path, exported: dict[str, str], follow: bool) -> None:
    # its own session, so that a timeout stops the command and not only its shell
    proc = subprocess.Popen(
        command, shell=True, cwd=cwd, env=_env(exported), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=FOLLOW_TIMEOUT_S if follow else COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
        assert follow, f"{block.id}: {command!r} did not finish in {COMMAND_TIMEOUT_S} s"
        return
    if expect.refused:
        assert proc.returncode != 0, f"{block.id}: {command!r} says it is refused, but exited 0:\n{out}\n{err}"
        return
    assert proc.returncode == 0, f"{block.id}: {command!r} exited {proc.returncode}:\n{out}\n{err}"
    if expect.prints is not None:
        assert expect.prints in out.split(), f"{block.id}: {command!r} should print {expect.prints!r}:\n{out}\n{err}"


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
