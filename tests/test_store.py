"""Object stores: LocalStore (on the real filesystem) and MemoryStore behave the same."""

from __future__ import annotations

import errno
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from loglake.errors import ConfigError, LoglakeError, StorageError
from loglake.fs.base import BytesLike
from loglake.fs.faulty import FaultyFileSystem
from loglake.fs.os_fs import OsFileSystem
from loglake.store import (
    STORE_URL_FORMS,
    InvalidObjectKeyError,
    LocalStore,
    MemoryStore,
    ObjectNotFoundError,
    ObjectStore,
    accepted_store_urls,
    drop_memory_store,
    open_store,
    parse_segment_key,
    partition_prefix,
    register_scheme,
    segment_key,
    topic_prefix,
)
from loglake.store.local import _temp_started_ms


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    s: ObjectStore = (
        LocalStore(str(tmp_path / "root"), OsFileSystem()) if request.param == "local" else MemoryStore()
    )
    yield s
    s.close()


def test_put_get_roundtrip_with_mixed_parts(store: ObjectStore) -> None:
    parts: list[BytesLike] = [b"head", bytearray(b"-middle-"), memoryview(b"xxtailxx")[2:6], b""]
    store.put("a/b/c.seg", parts)
    assert store.get("a/b/c.seg") == b"head-middle-tail"
    assert store.head("a/b/c.seg") == 16
    store.put("empty", [])
    assert store.get("empty") == b""
    assert store.head("empty") == 0


def test_put_replaces_whole_object(store: ObjectStore) -> None:
    store.put("k", [b"long old content"])
    store.put("k", [b"new"])
    assert store.get("k") == b"new"


def test_get_range_bounds(store: ObjectStore) -> None:
    store.put("x/obj", [bytes(range(100))])
    assert store.get_range("x/obj", 0, 10) == bytes(range(10))
    assert store.get_range("x/obj", 95, 10) == bytes(range(95, 100))  # short only at the end
    assert store.get_range("x/obj", 100, 5) == b""
    assert store.get_range("x/obj", 500, 5) == b""
    assert store.get_range("x/obj", 10, 0) == b""
    with pytest.raises(ValueError):
        store.get_range("x/obj", -1, 5)
    with pytest.raises(ValueError):
        store.get_range("x/obj", 0, -5)
    with pytest.raises(ObjectNotFoundError):
        store.get_range("x/missing", 0, 5)


def test_get_tail(store: ObjectStore) -> None:
    store.put("t", [bytes(range(50))])
    assert store.get_tail("t", 10) == (bytes(range(40, 50)), 50)
    assert store.get_tail("t", 500) == (bytes(range(50)), 50)
    with pytest.raises(ObjectNotFoundError):
        store.get_tail("nope", 10)


def test_missing_objects(store: ObjectStore) -> None:
    assert store.head("no/such") is None
    with pytest.raises(ObjectNotFoundError) as info:
        store.get("no/such")
    assert isinstance(info.value, LoglakeError)
    store.delete("no/such")  # idempotent
    store.put("dir/obj", [b"1"])
    # A "directory" (key prefix) is not an object.
    assert store.head("dir") is None
    with pytest.raises(ObjectNotFoundError):
        store.get("dir")


def test_delete_idempotent(store: ObjectStore) -> None:
    store.put("p/q", [b"data"])
    store.delete("p/q")
    store.delete("p/q")
    assert store.head("p/q") is None
    assert store.list("") == []


def test_list_prefix_sorted(store: ObjectStore) -> None:
    keys = ["a/b/2", "a/b/1", "a/bc/x", "a-c", "a/b-z/0", "b/0", "a/b/10"]
    for k in keys:
        store.put(k, [k.encode()])
    assert store.list("") == sorted(keys)
    assert store.list("a/b/") == ["a/b/1", "a/b/10", "a/b/2"]
    assert store.list("a/b") == sorted(["a/b/2", "a/b/1", "a/bc/x", "a/b-z/0", "a/b/10"])
    assert store.list("a/b/1") == ["a/b/1", "a/b/10"]
    assert store.list("a") == sorted(k for k in keys if k.startswith("a"))
    assert store.list("zzz/") == []
    assert store.list("a/b/2/") == []


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/abs",
        "a//b",
        "a/",
        "./a",
        "a/./b",
        "../x",
        "a/../b",
        "a\\b",
        "a\x00b",
        "seg.tmp",
        "a/b.tmp",
        "..",
    ],
)
def test_key_validation(store: ObjectStore, key: str) -> None:
    for op in (
        lambda: store.put(key, [b"x"]),
        lambda: store.get(key),
        lambda: store.head(key),
        lambda: store.delete(key),
        lambda: store.get_range(key, 0, 1),
    ):
        with pytest.raises(InvalidObjectKeyError) as info:
            op()
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, LoglakeError)


def test_bad_prefixes(store: ObjectStore) -> None:
    for prefix in ("/x", "a//", "../", "a/.."):
        with pytest.raises(InvalidObjectKeyError):
            store.list(prefix)


# ---- LocalStore specifics ---------------------------------------------------------------------


def test_local_layout_url_and_local_path(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "r"), OsFileSystem())
    assert store.url == "file://" + str(tmp_path / "r")
    store.put("t-1/0/00.seg", [b"abc"])
    path = store.local_path("t-1/0/00.seg")
    assert path == str(tmp_path / "r" / "t-1" / "0" / "00.seg")
    assert Path(path).read_bytes() == b"abc"
    assert MemoryStore().local_path("t-1/0/00.seg") is None
    assert sorted(os.listdir(tmp_path / "r" / "t-1" / "0")) == ["00.seg"]  # no temp left behind


def test_local_ignores_and_cleans_temp_leftovers(tmp_path: Path) -> None:
    fs = OsFileSystem()
    store = LocalStore(str(tmp_path), fs)
    store.put("p/0/1.seg", [b"whole"])
    # A crash mid-put leaves only the temp file: the object is absent, list ignores it.
    (tmp_path / "p" / "0" / "2.seg.tmp").write_bytes(b"partial")
    (tmp_path / "p" / "3.seg.tmp").write_bytes(b"partial")
    assert store.list("") == ["p/0/1.seg"]
    assert store.list("p/0/2") == []
    assert store.head("p/0/2.seg") is None
    # Retrying the put publishes through a temp file of its own: the leftover could be another
    # writer's upload in flight (brokers sharing a folder), so only delete_stale_temps removes it.
    store.put("p/0/2.seg", [b"retried"])
    assert store.get("p/0/2.seg") == b"retried"
    assert store.list("") == ["p/0/1.seg", "p/0/2.seg"]
    assert store.delete_stale_temps() == 2
    assert not (tmp_path / "p" / "0" / "2.seg.tmp").exists()
    assert not (tmp_path / "p" / "3.seg.tmp").exists()
    assert store.list("") == ["p/0/1.seg", "p/0/2.seg"]
    assert store.delete_stale_temps() == 0


class _FailingFs(OsFileSystem):
    """Raises an OSError on rename (after the temp file was written): a failed publish."""

    def __init__(self, err: int) -> None:
        self.err = err

    def rename(self, src: str, dst: str) -> None:
        raise OSError(self.err, os.strerror(self.err), src)


@pytest.mark.parametrize(
    ("err", "retriable"), [(errno.ENOSPC, False), (errno.EIO, False), (errno.EAGAIN, True)]
)
def test_local_failed_put_publishes_nothing(tmp_path: Path, err: int, retriable: bool) -> None:
    store = LocalStore(str(tmp_path), _FailingFs(err))
    with pytest.raises(StorageError) as info:
        store.put("t/0/5.seg", [b"data"])
    assert info.value.retriable is retriable
    assert info.value.op == "put"
    assert store.head("t/0/5.seg") is None
    assert store.list("") == []
    assert os.listdir(tmp_path / "t" / "0") == []  # temp removed on failure


class _PartialWriteFs(OsFileSystem):
    """Simulates a crash in the middle of writing the temp file."""

    def write_file_atomic(
        self, path: str, parts: Sequence[BytesLike], *, tmp: str | None = None, replace: bool = True
    ) -> None:
        with self.open(tmp or path + ".tmp", write=True, create=True) as f:
            f.pwrite(0, parts[0])
        raise OSError(errno.EIO, "crashed")


def test_local_crash_mid_write_leaves_nothing_visible(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path), _PartialWriteFs())
    with pytest.raises(StorageError):
        store.put("k/obj", [b"first part", b"second part"])
    reader = LocalStore(str(tmp_path), OsFileSystem())
    assert reader.head("k/obj") is None
    assert reader.list("") == []


def test_local_wraps_read_errors(tmp_path: Path) -> None:
    class BrokenFs(OsFileSystem):
        def listdir(self, path: str) -> list[str]:
            raise OSError(errno.EIO, "io error")

    store = LocalStore(str(tmp_path), BrokenFs())
    with pytest.raises(StorageError) as info:
        store.list("")
    assert info.value.retriable is False


# ---- several writers of one key (brokers sharing a folder) -----------------------------------


def test_put_if_absent_publishes_only_the_first(store: ObjectStore) -> None:
    assert store.put_if_absent("a/k", [b"first"]) is True
    assert store.put_if_absent("a/k", [b"second", b"!"]) is False
    assert store.get("a/k") == b"first"
    store.put("a/k", [b"replaced"])  # a plain put still replaces
    assert store.get("a/k") == b"replaced"
    assert store.list("a/") == ["a/k"]


def _race_create(root: str, key: str, payload: bytes, start: Any, out: Any) -> None:
    """Child process: wait at the barrier, then try to create `key`; report whether it won."""
    store = LocalStore(root, OsFileSystem())
    start.wait()
    out.put((payload[:8], store.put_if_absent(key, [payload[: len(payload) // 2], payload[len(payload) // 2 :]])))


#: writers per race and races per test: processes, as brokers on one host are
RACERS = 6
RACES = 5


def test_local_racing_creates_of_one_key_exactly_one_wins(tmp_path: Path) -> None:
    """Writers in separate processes create one key at once: exactly one is told it won, the
    object is that writer's bytes, whole, and no temp file stays behind."""
    ctx = multiprocessing.get_context("fork")
    root = str(tmp_path / "shared")
    reader = LocalStore(root, OsFileSystem())
    for race in range(RACES):
        key = f"loglake-c/t-0/0/{race:020d}.seg"
        # 2 MiB each: bigger than a write-behind chunk, so the writes overlap in time
        payloads = {i: bytes([i]) * 8 + os.urandom(2 * 1024 * 1024) for i in range(RACERS)}
        start, out = ctx.Barrier(RACERS), ctx.Queue()
        procs = [ctx.Process(target=_race_create, args=(root, key, payloads[i], start, out)) for i in range(RACERS)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        winners = [tag for tag, won in results if won]
        assert len(winners) == 1, results
        assert reader.get(key) == payloads[winners[0][0]]
    assert [n for n in os.listdir(Path(root) / "loglake-c" / "t-0" / "0") if n.endswith(".tmp")] == []


def _overwrite(root: str, key: str, tag: int, rounds: int, start: Any) -> None:
    store = LocalStore(root, OsFileSystem())
    start.wait()
    for r in range(rounds):
        store.put(key, [bytes([tag, r]) * (256 * 1024)])


def test_local_concurrent_puts_of_one_key_never_publish_a_torn_object(tmp_path: Path) -> None:
    """Processes replacing one key over and over (S3's last-writer-wins PutObject): every read
    in between sees one writer's whole object, never a mix or a truncated one."""
    ctx = multiprocessing.get_context("fork")
    root = str(tmp_path / "shared")
    reader = LocalStore(root, OsFileSystem())
    key = "loglake-c/meta/checkpoint-00000000000000000007.bin"
    writers, rounds = 4, 30
    start = ctx.Barrier(writers)
    procs = [ctx.Process(target=_overwrite, args=(root, key, t, rounds, start)) for t in range(writers)]
    for p in procs:
        p.start()
    seen = 0
    while any(p.is_alive() for p in procs):
        try:
            data = reader.get(key)
        except ObjectNotFoundError:
            continue
        assert len(data) == 512 * 1024 and data == data[:2] * (256 * 1024)
        seen += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert seen > 0 and reader.list("") == [key]


def test_local_delete_abandoned_uploads_goes_by_the_start_time_in_the_temp_name(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path), OsFileSystem())
    store.put("c/flush/1/s/1.lfo", [b"whole"])
    folder = tmp_path / "c" / "flush" / "1" / "s"
    old = folder / f"2.lfo.{1_000}-{'a' * 16}.tmp"
    new = folder / f"3.lfo.{5_000}-{'b' * 16}.tmp"
    legacy = folder / "4.lfo.tmp"  # an older version's temp name: no start time, left alone
    elsewhere = tmp_path / "d" / f"5.lfo.{1_000}-{'c' * 16}.tmp"
    for p in (old, new, legacy, elsewhere):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"partial")
    assert store.delete_abandoned_uploads("c/", started_before_ms=5_000) == 1
    assert not old.exists() and new.exists() and legacy.exists() and elsewhere.exists()
    assert store.list("") == ["c/flush/1/s/1.lfo"]
    assert MemoryStore().delete_abandoned_uploads("c/", started_before_ms=5_000) == 0

    class Capture(OsFileSystem):
        tmps: list[str] = []

        def write_file_atomic(
            self, path: str, parts: Sequence[BytesLike], *, tmp: str | None = None, replace: bool = True
        ) -> None:
            assert tmp is not None
            self.tmps.append(tmp)
            super().write_file_atomic(path, parts, tmp=tmp, replace=replace)

    fs = Capture()
    before = int(time.time() * 1000)
    LocalStore(str(tmp_path), fs).put("c/x", [b"1"])
    started = _temp_started_ms(os.path.basename(fs.tmps[0]))  # what a killed put would leave
    assert started is not None and before <= started <= int(time.time() * 1000)


def test_rename_noreplace_refuses_an_existing_name(tmp_path: Path) -> None:
    for fs, base in ((OsFileSystem(), str(tmp_path)), (FaultyFileSystem(), "/r")):
        fs.makedirs(base)
        for name, data in (("a", b"A"), ("b", b"B"), ("c", b"C")):
            with fs.open(f"{base}/{name}", write=True, create=True) as f:
                f.pwrite(0, data)
        fs.rename_noreplace(f"{base}/a", f"{base}/new")
        assert not fs.exists(f"{base}/a") and fs.read_file(f"{base}/new") == b"A"
        with pytest.raises(FileExistsError):
            fs.rename_noreplace(f"{base}/b", f"{base}/c")
        assert fs.read_file(f"{base}/b") == b"B" and fs.read_file(f"{base}/c") == b"C"


def test_local_put_if_absent_is_durable_on_return() -> None:
    """On the model filesystem, a crash right after put_if_absent returned keeps the object and
    every directory above it (the entries were fsynced before it returned)."""
    fs = FaultyFileSystem()
    store = LocalStore("/bucket", fs)
    assert store.put_if_absent("loglake-c/flush/1/s/0001.lfo", [b"acked"])
    assert fs.durable_tree() == {"/bucket/loglake-c/flush/1/s/0001.lfo": b"acked"}


# ---- MemoryStore specifics --------------------------------------------------------------------


def test_memory_counts_calls_and_injects_faults() -> None:
    store = MemoryStore("t")
    store.put("a", [b"1"])
    store.get("a")
    store.get_range("a", 0, 1)
    store.get_range("a", 0, 1)
    store.head("a")
    assert store.calls == {"put": 1, "get": 1, "get_range": 2, "head": 1}
    err = StorageError("get", "a", "injected", retriable=True)
    store.fail("get", err, times=2)
    for _ in range(2):
        with pytest.raises(StorageError):
            store.get("a")
    assert store.get("a") == b"1"


def test_memory_thread_safe() -> None:
    store = MemoryStore()

    def worker(n: int) -> None:
        for i in range(200):
            store.put(f"w{n}/{i}", [b"x" * i])
            assert store.get(f"w{n}/{i}") == b"x" * i

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.list("")) == 800
    assert store.calls["put"] == 800


# ---- open_store -------------------------------------------------------------------------------


def test_open_store_urls(tmp_path: Path) -> None:
    fs = OsFileSystem()
    s1 = open_store(f"file://{tmp_path}", fs)
    assert isinstance(s1, LocalStore) and s1.root == str(tmp_path)
    s2 = open_store(str(tmp_path / "plain"), fs)
    assert isinstance(s2, LocalStore) and s2.url == f"file://{tmp_path}/plain"
    m1 = open_store("memory://shared", fs)
    m1.put("k", [b"v"])
    assert open_store("memory://shared", fs) is m1
    assert open_store("memory://other", fs) is not m1
    drop_memory_store("shared")
    assert open_store("memory://shared", fs).head("k") is None
    for bad in ("ftp://x", ""):
        with pytest.raises(ConfigError) as info:
            open_store(bad, fs)
        if bad:
            assert "file://" in str(info.value) and "s3://" in str(info.value)
    for bad in ("file://relative/path", "memory://", "memory://a/b"):
        with pytest.raises(ConfigError):
            open_store(bad, fs)


def test_register_scheme() -> None:
    made = MemoryStore("custom")
    register_scheme("custom", lambda url, fs: made)
    assert open_store("custom://anything", OsFileSystem()) is made


# ---- segment keys -----------------------------------------------------------------------------


def test_segment_key_layout_and_parse() -> None:
    key = segment_key("c1", "orders-eu.v2", "0f3a9b", 7, 1234)
    assert key == "loglake-c1/orders-eu.v2-0f3a9b/7/00000000000000001234.seg"
    assert parse_segment_key(key) == ("orders-eu.v2", "0f3a9b", 7, 1234, 0)
    rewritten = segment_key("c1", "orders-eu.v2", "0f3a9b", 7, 1234, generation=3)
    assert rewritten == "loglake-c1/orders-eu.v2-0f3a9b/7/00000000000000001234-g3.seg"
    assert parse_segment_key(rewritten) == ("orders-eu.v2", "0f3a9b", 7, 1234, 3)
    for bad in ("00000000000000001234-g0.seg", "00000000000000001234-g.seg", "00000000000000001234-g03.seg", "00000000000000001234-x3.seg"):
        with pytest.raises(InvalidObjectKeyError):
            parse_segment_key("loglake-c1/t-id/0/" + bad)
    prefixed = segment_key("c1", "t", "id", 0, 0, prefix="/bucket/pre/")
    assert prefixed == "bucket/pre/loglake-c1/t-id/0/00000000000000000000.seg"
    assert parse_segment_key(prefixed).base_offset == 0
    assert key.startswith(partition_prefix("c1", "orders-eu.v2", "0f3a9b", 7))
    assert partition_prefix("c1", "t", "id", 3).endswith("/3/")
    assert topic_prefix("c1", "t", "id") == "loglake-c1/t-id/"
    # Zero padding makes string order = offset order.
    keys = [segment_key("c", "t", "i", 0, off) for off in (10, 9, 100, 2**62)]
    assert sorted(keys) == [segment_key("c", "t", "i", 0, off) for off in (9, 10, 100, 2**62)]


@pytest.mark.parametrize(
    "args",
    [
        ("c", "t", "id-x", 0, 0),
        ("c", "a/b", "id", 0, 0),
        ("c/d", "t", "id", 0, 0),
        ("c", "t", "id", -1, 0),
        ("c", "t", "id", 0, -1),
    ],
)
def test_segment_key_rejects_bad_parts(args: tuple[str, str, str, int, int]) -> None:
    with pytest.raises(InvalidObjectKeyError):
        segment_key(*args)


@pytest.mark.parametrize(
    "key",
    [
        "x.seg",
        "loglake-c/t-i/0/123.seg",
        "loglake-c/t-i/0/0000000000000000012a.seg",
        "loglake-c/ti/0/00000000000000000001.seg",
        "loglake-c/t-i/x/00000000000000000001.seg",
        "loglake-c/t-i/01/00000000000000000001.seg",
        "other/t-i/0/00000000000000000001.seg",
        "loglake-c/t-i/0/00000000000000000001.dat",
    ],
)
def test_parse_segment_key_rejects(key: str) -> None:
    with pytest.raises(InvalidObjectKeyError):
        parse_segment_key(key)


# ---- store URLs: the accepted forms, one list (issue 34, item 6) --------------------------------


@pytest.mark.parametrize("bad", ["s3:/bucket", "s3:bucket", "file:/tmp/x", "S3:/bucket/prefix", "memory:/x"])
def test_a_malformed_url_is_refused_not_taken_for_a_directory(bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        open_store(bad, OsFileSystem())
    message = str(info.value)
    assert "not a well-formed URL" in message and accepted_store_urls() in message
    assert list(tmp_path.iterdir()) == []  # no local folder named "s3:" (or anything else)


def test_a_malformed_url_names_the_url_meant() -> None:
    for bad, meant in (("s3:/bucket", "s3://bucket"), ("file:/tmp/x", "file:///tmp/x")):
        with pytest.raises(ConfigError, match=f"did you mean '{meant}'"):
            open_store(bad, OsFileSystem())


def test_an_unknown_scheme_lists_every_accepted_form() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("ftp://host/x", OsFileSystem())
    message = str(info.value)
    assert set(STORE_URL_FORMS) == {"file", "s3"}
    for form in STORE_URL_FORMS.values():
        assert form in message
    assert "plain directory path" in message


def test_a_malformed_s3_url_is_told_as_such_before_boto3_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    import loglake.store as store

    monkeypatch.setattr(store, "_schemes", {k: v for k, v in store._schemes.items() if k != "s3"})
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if the s3 extra were not installed
    with pytest.raises(ConfigError, match="expected s3://bucket"):
        open_store("s3:///no-bucket", OsFileSystem())


def test_plain_paths_and_well_formed_urls_still_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fs = OsFileSystem()
    assert isinstance(open_store("cold", fs), LocalStore)
    assert isinstance(open_store("./odd:name", fs), LocalStore)  # a ':' later in a path is a path
    assert isinstance(open_store(f"file://{tmp_path}/c", fs), LocalStore)


def test_every_cold_store_option_names_the_accepted_forms_from_the_one_list() -> None:
    """One owner: the help of each --cold-store option is made from STORE_URL_FORMS."""
    import typer.main

    from loglake.cli.main import app

    found = 0

    def walk(command: Any, ctx: Any) -> None:  # typer's own click: duck-typed
        nonlocal found
        for param in command.params:
            if "--cold-store" in getattr(param, "opts", ()):
                found += 1
                assert accepted_store_urls() in (param.help or ""), (command.name, param.help)
        if hasattr(command, "list_commands"):  # a group: its subcommands load when asked for
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                walk(sub, sub.make_context(name, [], parent=ctx, resilient_parsing=True))

    top = typer.main.get_command(app)
    walk(top, top.make_context("loglake", [], resilient_parsing=True))
    assert found >= 2  # serve and verify
