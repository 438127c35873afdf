"""An in-memory, deterministic, fault-injecting `FileSystem` for crash-point sweeps.

Model
-----
Every file inode keeps two contents: ``current`` (what the running process reads) and
``durable`` (what survives a crash), plus the list of mutations made since its last
``datasync``/``sync``. Syncing replays that list onto ``durable``.

Every directory inode keeps two entry tables: ``current`` and ``durable``. ``open(create=True)``,
``rename``, ``unlink`` and ``rmdir`` change only the current table of the directories involved;
``fsync_dir(d)`` copies d's current table to its durable one (a rename *into* d also drops the
source name from its old directory's durable table, so a synced rename is atomic).
``makedirs`` is durable on return.

``crash()`` builds a new filesystem from the durable tables and durable contents only. With
``torn=True`` every inode that has unsynced mutations gets a seeded-random prefix of them applied
on top of its durable content, the last applied write cut short at a random byte half the time.

Every mutating call is counted (``mutating_calls``). With ``crash_after=k`` the k-th mutating
call does not happen: it raises `SimulatedCrash`, and every later call on this filesystem or
its open files, from any thread, raises it too. ``fail_after`` injects an error (ENOSPC by
default) into one mutating call without performing it; ``set_full(True)`` makes every call that
grows a file fail with ENOSPC; ``fail_path(fragment, op)`` makes reads, writes or syncs of the
files whose path contains `fragment` fail (EIO by default) until ``clear_path_faults()``.

Mutating calls: pwrite, pwritev (one call), truncate, allocate, datasync, sync,
open(create=True) (whether or not the file existed), rename, rename_noreplace, unlink, rmdir, makedirs,
fsync_dir. Not mutating: reads, size, exists, is_dir, listdir, lock, close.
"""

from __future__ import annotations

import errno
import random
import threading
from collections.abc import Iterator, Sequence

from loglake.fs.base import File, FileLock, FileSystem
from loglake.fs.faulty_file import (
    ExcFactory,
    FaultyFile,
    SimulatedCrash,
    _apply,
    _Dir,
    _display,
    _eio,
    _enospc,
    _Inode,
    _Lock,
    _Node,
    _PathFault,
    _split,
)

__all__ = ["FaultyFile", "FaultyFileSystem", "SimulatedCrash"]


class FaultyFileSystem(FileSystem):
    """See the module docstring.

    `seed` drives every random choice (torn writes). `crash_after=k` crashes at the k-th
    mutating call (1-based, counted from construction). `fail_after=k` makes the k-th
    mutating call raise `fail_with()` (default: ENOSPC) without performing it.
    """

    def __init__(
        self,
        seed: int = 0,
        crash_after: int | None = None,
        *,
        fail_after: int | None = None,
        fail_with: ExcFactory | None = None,
        _generation: int = 0,
    ) -> None:
        self._mu = threading.RLock()
        self.seed = seed
        self.generation = _generation
        self._rng = random.Random(f"loglake-faulty:{seed}:{_generation}")
        self._crash_after = crash_after
        self._calls = 0
        self._dead = False
        self._full = False
        #: What `disk_space` answers (tests set it to drive the free-space reserve); None: unknown.
        self.space: tuple[int, int] | None = None
        self._failures: dict[int, ExcFactory] = {}
        self._path_faults: list[_PathFault] = []
        if fail_after is not None:
            self._failures[fail_after] = fail_with or _enospc
        self._next_ino = 1
        self._root = _Dir(ino=0)
        self._locks: set[str] = set()

    # ---- fault control --------------------------------------------------------------------

    @property
    def mutating_calls(self) -> int:
        with self._mu:
            return self._calls

    @property
    def crash_after(self) -> int | None:
        return self._crash_after

    @crash_after.setter
    def crash_after(self, k: int | None) -> None:
        """Crash at the k-th mutating call, counted from construction (not from now)."""
        with self._mu:
            self._crash_after = k

    @property
    def dead(self) -> bool:
        with self._mu:
            return self._dead

    def fail_after(self, k: int, exc_factory: ExcFactory | None = None) -> None:
        """Make the k-th mutating call *from now* (1 = the next one) raise `exc_factory()`."""
        if k < 1:
            raise ValueError(f"fail_after needs k >= 1, got {k}")
        with self._mu:
            self._failures[self._calls + k] = exc_factory or _enospc

    def fail_path(self, fragment: str, op: str, exc_factory: ExcFactory | None = None, *, times: int | None = None) -> None:
        """Make `op` ("read": pread; "write": pwrite/pwritev; "sync": datasync/sync) on every file
        whose path contains `fragment` raise `exc_factory()` (default EIO) without performing it,
        `times` times or until `clear_path_faults()`. A failed write or sync still counts as a
        mutating call (and may be the crash point)."""
        if op not in ("read", "write", "sync"):
            raise ValueError(f"fail_path op must be read, write or sync, not {op!r}")
        with self._mu:
            self._path_faults.append(_PathFault(fragment, op, exc_factory or _eio, times))

    def clear_path_faults(self) -> int:
        """Stop every `fail_path` fault; returns how many calls they failed in all."""
        with self._mu:
            hits = sum(f.hits for f in self._path_faults)
            self._path_faults.clear()
            return hits

    def set_full(self, full: bool) -> None:
        """While set, every write, allocate or truncate that grows a file raises ENOSPC."""
        with self._mu:
            self._full = full

    def disk_space(self, path: str) -> tuple[int, int] | None:
        return self.space

    def crash(self, torn: bool = False) -> FaultyFileSystem:
        """Kill this filesystem and return a new one holding only what was durable."""
        with self._mu:
            self._dead = True
            new = FaultyFileSystem(seed=self.seed, _generation=self.generation + 1)
            copies: dict[int, _Node] = {}
            # Decide torn prefixes in inode order so a given seed and history are reproducible.
            torn_contents: dict[int, bytearray] = {}
            if torn:
                for inode in sorted(self._durable_inodes(), key=lambda n: n.ino):
                    if inode.pending:
                        torn_contents[inode.ino] = self._torn(inode)

            def copy(node: _Node) -> _Node:
                done = copies.get(node.ino)
                if done is not None:
                    return done
                if isinstance(node, _Inode):
                    content = torn_contents.get(node.ino, node.durable)
                    fresh_file = _Inode(ino=node.ino, current=bytearray(content), durable=bytearray(content))
                    copies[node.ino] = fresh_file
                    return fresh_file
                fresh_dir = _Dir(ino=node.ino)
                copies[node.ino] = fresh_dir
                for name, child in node.durable.items():
                    c = copy(child)
                    fresh_dir.current[name] = c
                    fresh_dir.durable[name] = c
                return fresh_dir

            root = copy(self._root)
            if not isinstance(root, _Dir):  # pragma: no cover - root is always a directory
                raise TypeError("root is not a directory")
            new._root = root
            new._next_ino = self._next_ino
            return new

    def _durable_inodes(self) -> Iterator[_Inode]:
        seen: set[int] = set()
        stack: list[_Dir] = [self._root]
        while stack:
            d = stack.pop()
            for child in d.durable.values():
                if child.ino in seen:
                    continue
                seen.add(child.ino)
                if isinstance(child, _Dir):
                    stack.append(child)
                else:
                    yield child

    def _torn(self, inode: _Inode) -> bytearray:
        content = bytearray(inode.durable)
        n = self._rng.randint(0, len(inode.pending))
        for i, op in enumerate(inode.pending[:n]):
            kind, pos, data = op
            if i == n - 1 and kind == "w" and data and self._rng.random() < 0.5:
                # The last write that reached the disk was torn: only a prefix of it landed.
                op = (kind, pos, data[: self._rng.randrange(len(data))])
            _apply(content, op)
        return content

    # ---- inspection for tests -------------------------------------------------------------

    def snapshot_tree(self) -> dict[str, bytes]:
        """Every file of the current view, path -> content."""
        with self._mu:
            self._check_alive()
            return self._tree(durable=False)

    def durable_tree(self) -> dict[str, bytes]:
        """Every file that would survive a (non-torn) crash now, path -> content."""
        with self._mu:
            return self._tree(durable=True)

    def _tree(self, *, durable: bool) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        stack: list[tuple[str, _Dir]] = [("", self._root)]
        seen: set[int] = set()
        while stack:
            prefix, d = stack.pop()
            if d.ino in seen:
                continue
            seen.add(d.ino)
            entries = d.durable if durable else d.current
            for name, child in entries.items():
                p = f"{prefix}/{name}"
                if isinstance(child, _Dir):
                    stack.append((p, child))
                else:
                    out[p] = bytes(child.durable if durable else child.current)
        return dict(sorted(out.items()))

    # ---- internals --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead:
            raise SimulatedCrash(f"filesystem crashed (after {self._calls} mutating calls)")

    def _mutating(self) -> None:
        """Count one mutating call; crash or inject a failure if it is the chosen one."""
        self._check_alive()
        n = self._calls + 1
        if self._crash_after is not None and n >= self._crash_after:
            self._dead = True
            raise SimulatedCrash(f"simulated crash at mutating call {n}")
        self._calls = n
        factory = self._failures.pop(n, None)
        if factory is not None:
            raise factory()

    def _path_fault(self, op: str, path: str) -> None:
        for fault in self._path_faults:
            if fault.op == op and fault.fragment in path and (fault.times is None or fault.hits < fault.times):
                fault.hits += 1
                raise fault.factory()

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def _lookup(self, parts: Sequence[str], path: str) -> _Node:
        node: _Node = self._root
        for part in parts:
            if not isinstance(node, _Dir):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            child = node.current.get(part)
            if child is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            node = child
        return node

    def _parent(self, parts: Sequence[str], path: str) -> _Dir:
        if not parts:
            raise OSError(errno.EBUSY, "Cannot operate on the root directory", path)
        node = self._lookup(parts[:-1], path)
        if not isinstance(node, _Dir):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
        return node

    def _find(self, path: str) -> _Node | None:
        try:
            return self._lookup(_split(path), path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    # ---- FileSystem -------------------------------------------------------------------------

    def open(self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False) -> File:
        with self._mu:
            self._check_alive()
            parts = _split(path)
            if create:
                self._mutating()
                parent = self._parent(parts, path)
                node = parent.current.get(parts[-1])
                if node is None:
                    node = _Inode(ino=self._new_ino())
                    parent.current[parts[-1]] = node
                elif exclusive:
                    raise FileExistsError(errno.EEXIST, "File exists", path)
            else:
                node = self._lookup(parts, path)
            if isinstance(node, _Dir):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            return FaultyFile(self, path, node, write)

    def exists(self, path: str) -> bool:
        with self._mu:
            self._check_alive()
            return self._find(path) is not None

    def is_dir(self, path: str) -> bool:
        with self._mu:
            self._check_alive()
            return isinstance(self._find(path), _Dir)

    def listdir(self, path: str) -> list[str]:
        with self._mu:
            self._check_alive()
            node = self._lookup(_split(path), path)
            if not isinstance(node, _Dir):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            return sorted(node.current)

    def makedirs(self, path: str) -> None:
        with self._mu:
            self._check_alive()
            self._mutating()
            node: _Dir = self._root
            for part in _split(path):
                child = node.current.get(part)
                if child is None:
                    child = _Dir(ino=self._new_ino())
                    node.current[part] = child
                    node.durable[part] = child
                elif not isinstance(child, _Dir):
                    raise FileExistsError(errno.EEXIST, "File exists", path)
                node = child

    def rename(self, src: str, dst: str) -> None:
        with self._mu:
            self._check_alive()
            self._mutating()
            sparts, dparts = _split(src), _split(dst)
            sparent = self._parent(sparts, src)
            node = sparent.current.get(sparts[-1])
            if node is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
            dparent = self._parent(dparts, dst)
            if sparts == dparts:
                return
            if isinstance(node, _Dir) and dparts[: len(sparts)] == sparts:
                raise OSError(errno.EINVAL, "Cannot move a directory into itself", dst)
            old = dparent.current.get(dparts[-1])
            if old is not None:
                if isinstance(old, _Dir) and not isinstance(node, _Dir):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory", dst)
                if isinstance(node, _Dir) and not isinstance(old, _Dir):
                    raise NotADirectoryError(errno.ENOTDIR, "Not a directory", dst)
                if isinstance(old, _Dir) and old.current:
                    raise OSError(errno.ENOTEMPTY, "Directory not empty", dst)
            del sparent.current[sparts[-1]]
            dparent.current[dparts[-1]] = node
            node.moved_from.append((sparent, sparts[-1]))

    def rename_noreplace(self, src: str, dst: str) -> None:
        with self._mu:
            self._check_alive()
            dparts = _split(dst)
            if self._parent(dparts, dst).current.get(dparts[-1]) is not None:
                raise FileExistsError(errno.EEXIST, "File exists", dst)
            # one mutating call, like the os's link + unlink pair seen from outside
            self.rename(src, dst)

    def unlink(self, path: str) -> None:
        with self._mu:
            self._check_alive()
            self._mutating()
            parts = _split(path)
            parent = self._parent(parts, path)
            node = parent.current.get(parts[-1])
            if node is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            if isinstance(node, _Dir):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            del parent.current[parts[-1]]

    def rmdir(self, path: str) -> None:
        with self._mu:
            self._check_alive()
            self._mutating()
            parts = _split(path)
            parent = self._parent(parts, path)
            node = parent.current.get(parts[-1])
            if node is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            if not isinstance(node, _Dir):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            if node.current:
                raise OSError(errno.ENOTEMPTY, "Directory not empty", path)
            del parent.current[parts[-1]]

    def fsync_dir(self, path: str) -> None:
        with self._mu:
            self._check_alive()
            self._mutating()
            node = self._lookup(_split(path or "."), path)
            if not isinstance(node, _Dir):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            node.durable = dict(node.current)
            # A rename into this directory is now durable: drop the source name too.
            for child in node.current.values():
                for src_dir, name in child.moved_from:
                    if src_dir.durable.get(name) is child and src_dir.current.get(name) is not child:
                        del src_dir.durable[name]
                child.moved_from.clear()

    def lock(self, path: str) -> FileLock:
        with self._mu:
            self._check_alive()
            parts = _split(path)
            parent = self._parent(parts, path)
            node = parent.current.get(parts[-1])
            if node is None:
                parent.current[parts[-1]] = _Inode(ino=self._new_ino())
            elif isinstance(node, _Dir):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            key = _display(parts)
            if key in self._locks:
                raise BlockingIOError(errno.EWOULDBLOCK, f"{path} is locked by another holder")
            self._locks.add(key)
            return _Lock(self, key)
