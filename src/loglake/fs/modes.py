"""Who may read what loglake writes: its own user, nobody else.

The data directory holds every record (WAL, segments) and the metadata, which holds every SASL
user's SCRAM StoredKey and ServerKey and the ACLs; a `file://` cold store holds copies of both.
So every file loglake creates is `FILE_MODE` and every directory `DIR_MODE`, whatever the umask
(a umask only removes bits), and `narrow_tree` takes the group's and others' bits off what an
earlier release left open (its files were 0644 and its directories 0755 under the usual umask
022). docs/SECURITY.md, "Files on disk".

The one owner of these modes: tests/test_data_dir_modes.py fails on a mode spelled anywhere else
in src/.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

__all__ = ["DIR_MODE", "FILE_MODE", "SHARED_BITS", "Narrowed", "narrow_tree"]

#: A file loglake creates: read and write for its user only.
FILE_MODE = 0o600
#: A directory loglake creates: its user only.
DIR_MODE = 0o700
#: The permission bits of the group and of others: none of them on anything loglake keeps.
SHARED_BITS = 0o077


@dataclass
class Narrowed:
    """What `narrow_tree` did."""

    #: (path, mode before) of every file and directory whose group and other bits it removed
    changed: list[tuple[str, int]] = field(default_factory=list)
    #: paths others may still read that it could not change (another user's, unreadable)
    left: list[str] = field(default_factory=list)
    #: the root is a shared directory (sticky bit, as /tmp): nothing was looked at or changed
    shared_root: bool = False


def narrow_tree(root: str) -> Narrowed:
    """Remove the group and other permission bits from `root` and everything under it.

    Symbolic links to directories are followed (the WAL directory may be one, to a device of its
    own: docs/OPERATIONS.md), each directory once. A root that others cannot enter shields what
    it holds, so when it and the directories linked from it are the owner's only there is nothing
    to walk (a start costs a few stats, not one per segment); the root is narrowed last, so a walk
    cut short by a crash is done again. A root with the sticky bit is a directory shared with
    other users (/tmp): narrowing it, or other users' files in it, would break them, so it is left
    alone and `shared_root` says so. A missing root is nothing to do."""
    out = Narrowed()
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return out
    if st.st_mode & stat.S_ISVTX:
        out.shared_root = True
        return out
    if not stat.S_ISDIR(st.st_mode):
        _narrow(root, st, out)
        return out
    if not st.st_mode & SHARED_BITS and not _open_links(root):
        return out
    seen = {(st.st_dev, st.st_ino)}
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except PermissionError:
            out.left.append(directory)
            continue
        for entry in entries:
            try:
                est = entry.stat()  # the target of a link: its mode is what others get
            except FileNotFoundError:
                continue  # a dangling link, or gone since the listing
            _narrow(entry.path, est, out)
            if stat.S_ISDIR(est.st_mode) and (est.st_dev, est.st_ino) not in seen:
                seen.add((est.st_dev, est.st_ino))
                stack.append(entry.path)
    _narrow(root, st, out)
    return out


def _open_links(root: str) -> bool:
    """Whether a directory linked from `root` (not shielded by it) is open to others."""
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.is_symlink() and entry.is_dir() and stat.S_IMODE(entry.stat().st_mode) & SHARED_BITS:
                    return True
    except (FileNotFoundError, PermissionError):
        return True  # walk, and let the walk say what it could not do
    return False


def _narrow(path: str, st: os.stat_result, out: Narrowed) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if not mode & SHARED_BITS:
        return
    try:
        os.chmod(path, mode & ~SHARED_BITS)
    except FileNotFoundError:
        return
    except PermissionError:
        out.left.append(path)
        return
    out.changed.append((path, mode))
