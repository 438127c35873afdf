"""Why `loglake serve` could not start, as one line, a hint and a distinct exit code.

The broker's start-up failures are mostly the operating system's (an address in use, a data
directory that is a file, a read-only or full disk). `explain` turns each into a `StartupFailure`;
`loglake serve` prints ``error: <line>`` and ``hint: <hint>`` on stderr and exits with the code.
The traceback goes to the log at DEBUG only.

Exit codes (also in README.md, "The broker"):

    1  any other operating error          5  a host name does not resolve
    2  usage error (a bad flag)           6  permission denied / read-only filesystem
    3  invalid configuration              7  the data directory is not a directory
    4  address in use / not on this host  8  no space left on the device
                                          9  the data directory is in use by another process
   10  acknowledged records are missing  11  the metadata is damaged

2 is also a listener that does not authenticate clients bound to a non-loopback address without
--allow-unauthenticated-public-listener (`UnsafeListenerError`; docs/SECURITY.md, "Safe by default").
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import socket
from typing import NamedTuple

from loglake.errors import (
    AcknowledgedDataLossError,
    ConfigError,
    CorruptionError,
    DataDirLockedError,
    EtcdUnavailableError,
    ListenError,
    LoglakeError,
    MetadataDamagedError,
    StorageError,
    UnsafeListenerError,
)
from loglake.extras import missing_extra

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_ADDRESS = 4
EXIT_RESOLVE = 5
EXIT_PERMISSION = 6
EXIT_NOT_A_DIRECTORY = 7
EXIT_NO_SPACE = 8
EXIT_LOCKED = 9
EXIT_DATA_LOSS = 10
EXIT_META_DAMAGED = 11

log = logging.getLogger("loglake.serve")
MIB = 1024 * 1024

#: What to do when etcd does not answer at start-up (cluster mode).
ETCD_HINT = (
    "start etcd there, or point --cluster (env LOGLAKE_CLUSTER) at the etcd endpoints that run "
    "(etcd://HOST:PORT[,HOST:PORT...]/PREFIX; docs/CLUSTER.md)"
)
#: How long the start-up check waits for a TCP connection to one etcd endpoint.
ETCD_PROBE_S = 2.0


def etcd_reachable(endpoints: list[tuple[str, int]]) -> None:
    """EtcdUnavailableError at once when no etcd endpoint accepts a TCP connection (refused, no
    route, no answer within ETCD_PROBE_S), instead of the metadata store's retries for its whole
    deadline (15 s) followed by the same error."""
    reasons = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=ETCD_PROBE_S):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or type(exc).__name__}")
    raise EtcdUnavailableError(f"etcd unreachable: no endpoint accepts connections ({'; '.join(reasons)})")


class StartupFailure(NamedTuple):
    exit_code: int
    message: str
    hint: str | None = None


def _os_error(exc: OSError, data_dir: str) -> StartupFailure | None:
    where = exc.filename if exc.filename is not None else data_dir
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM):
        return StartupFailure(EXIT_PERMISSION, f"permission denied: {where}", "run as a user that may write the data directory, or pick another --data-dir")
    if code == errno.EROFS:
        return StartupFailure(EXIT_PERMISSION, f"read-only filesystem: {where}", "the data directory must be on a writable filesystem")
    if code in (errno.ENOTDIR, errno.EEXIST):
        return StartupFailure(EXIT_NOT_A_DIRECTORY, f"not a directory: {where}", "--data-dir must name a directory (it is created when missing)")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return StartupFailure(EXIT_NO_SPACE, f"no space left on the device of {where}", "free space there; the WAL preallocates its files (engine setting wal_file_bytes)")
    return None


def _space(path: str) -> tuple[int, int] | None:
    """(bytes an unprivileged writer may still use, total bytes) on the filesystem of `path` (or
    of its nearest existing parent); None when that cannot be told."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return None  # opening says "read-only filesystem", which is the real problem
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _own_filesystem(data_dir: str, wal: str) -> bool:
    """Is `wal` (an existing directory) on another filesystem than the data directory: a mount
    point, or a symlink to one (docs/OPERATIONS.md, "The WAL on a device of its own")?"""
    try:
        return os.path.isdir(wal) and os.stat(wal).st_dev != os.stat(data_dir).st_dev
    except OSError:
        return False


def check_space(
    data_dir: str,
    wal_shards: int,
    wal_file_bytes: int,
    meta_log_file_bytes: int,
    min_free_bytes: int = 0,
    min_free_percent: float = 0.0,
) -> StartupFailure | None:
    """Is there room for what the broker preallocates (a WAL file per shard and a metadata log
    file) on top of the free-space reserve (`storage_min_free_bytes` / `storage_min_free_percent`,
    below which produce is refused)? A new data directory without it cannot take a single write:
    a StartupFailure. A data directory that already holds data still serves reads, so there it
    is one warning line. A WAL directory on a filesystem of its own is checked for the WAL files,
    the data directory's for the metadata log, each against its own reserve."""
    wal_dir = os.path.join(data_dir, "wal")
    wal_needs = wal_shards * wal_file_bytes
    wal_text = f"{wal_shards} WAL file(s) of {wal_file_bytes // MIB} MiB (wal_shards x wal_file_bytes)"
    meta_text = f"a {meta_log_file_bytes // MIB} MiB metadata log file"
    if _own_filesystem(data_dir, wal_dir):
        places = [(data_dir, meta_log_file_bytes, meta_text), (wal_dir, wal_needs, wal_text)]
    else:
        places = [(data_dir, wal_needs + meta_log_file_bytes, f"{wal_text} and {meta_text}")]
    for path, preallocated, what_text in places:
        space = _space(path)
        if space is None:
            continue
        free, total = space
        reserve = max(min_free_bytes, int(total * min_free_percent / 100.0))
        if free >= preallocated + reserve:
            continue
        what = (
            f"{free // MIB} MiB free on the filesystem of {path}; the broker preallocates "
            f"{what_text}, and keeps a free-space reserve of "
            f"{reserve // MIB} MiB (max of storage_min_free_bytes and storage_min_free_percent of "
            f"{total // MIB} MiB) below which produce is refused"
        )
        hint = (
            "free space, or lower [engine] wal_file_bytes / wal_shards (e.g. LOGLAKE_ENGINE__WAL_FILE_BYTES=8388608) "
            "or the reserve (LOGLAKE_STORAGE_MIN_FREE_BYTES, LOGLAKE_STORAGE_MIN_FREE_PERCENT)"
        )
        if not os.path.isdir(os.path.join(data_dir, "meta")):
            return StartupFailure(EXIT_NO_SPACE, f"not enough space: {what}", hint)
        log.warning("not enough space: %s; writes fail with KAFKA_STORAGE_ERROR until there is room (%s)", what, hint)
    return None


def _restore_hint(exc: MetadataDamagedError) -> str:
    """How to get the metadata back: from the cold store's copy (an empty `meta/` and the same
    --cold-store: recovery restores it, keeping the segments and WAL that are still here), or
    from a backup when no store holds one."""
    see = 'docs/RELIABILITY.md, "Damaged metadata"'
    if exc.cold_store is None or exc.copy_found is False:
        where = "no cold store (--cold-store) is configured" if exc.cold_store is None else f"the cold store {exc.cold_store} holds no copy of it"
        return f"{where}, so there is no copy to restore it from: restore the data directory from a backup ({see})"
    meta = shlex.quote(exc.meta_dir)
    data_dir = shlex.quote(os.path.dirname(exc.meta_dir))
    holds = "holds a copy of it" if exc.copy_found else "may hold a copy of it (this could not be checked)"
    return (
        f"the cold store {exc.cold_store} {holds} (at most meta_publish_interval_ms, 1 s by default, behind): move "
        f"the damaged metadata aside and start again with the same --cold-store to restore it from there, keeping "
        f"the segments and WAL here: mv {meta} {meta}.damaged && loglake serve --data-dir {data_dir} --cold-store "
        f"{shlex.quote(exc.cold_store)} (with your other flags; {see})"
    )


def explain(exc: BaseException, data_dir: str) -> StartupFailure | None:
    """The failure to report for `exc`, or None when it is not a start-up failure we know (a bug:
    the caller lets it propagate with its traceback)."""
    if isinstance(exc, ListenError):
        cause = exc.cause
        if isinstance(cause, socket.gaierror):
            return StartupFailure(EXIT_RESOLVE, f"{exc.setting} {exc.address}: the host name does not resolve", "use an IP address or a name this machine resolves")
        if cause.errno == errno.EADDRINUSE:
            return StartupFailure(EXIT_ADDRESS, str(exc), f"another process listens there; stop it or choose another port with {exc.setting}")
        if cause.errno == errno.EADDRNOTAVAIL:
            return StartupFailure(EXIT_ADDRESS, f"{exc.setting} {exc.address}: not an address of this machine", "listen on one of this machine's addresses, or 0.0.0.0 for all")
        if cause.errno in (errno.EACCES, errno.EPERM):
            return StartupFailure(EXIT_PERMISSION, f"{exc.setting} {exc.address}: permission denied", "ports below 1024 need privileges; choose a higher port")
        return StartupFailure(EXIT_ADDRESS, str(exc))
    if isinstance(exc, DataDirLockedError):
        return StartupFailure(EXIT_LOCKED, str(exc))
    if isinstance(exc, MetadataDamagedError):
        return StartupFailure(EXIT_META_DAMAGED, str(exc), _restore_hint(exc))
    wal_damage = isinstance(exc, CorruptionError) and f"{os.sep}wal{os.sep}" in exc.path
    if isinstance(exc, AcknowledgedDataLossError) or wal_damage:
        return StartupFailure(
            EXIT_DATA_LOSS,
            str(exc),
            "acknowledged records are gone (damaged storage, not a crash). Restore the data directory from a "
            "copy if you have one; or start once with --accept-data-loss to go on without them (their offsets "
            "stay reserved, consumers skip them, the loss is logged)",
        )
    missing = missing_extra(exc, "loglake serve")
    if missing is not None:
        return StartupFailure(EXIT_CONFIG, str(missing), missing.hint)
    if isinstance(exc, UnsafeListenerError):
        return StartupFailure(EXIT_USAGE, str(exc))
    if isinstance(exc, ConfigError):
        return StartupFailure(EXIT_CONFIG, str(exc))
    if isinstance(exc, StorageError) and isinstance(exc.cause, OSError):
        found = _os_error(exc.cause, exc.path)
        if found is not None:
            return found
    if isinstance(exc, OSError):
        return _os_error(exc, data_dir)
    if isinstance(exc, EtcdUnavailableError):
        return StartupFailure(EXIT_ERROR, str(exc), ETCD_HINT)
    if isinstance(exc, LoglakeError):
        hint = getattr(exc, "hint", None)  # an S3 store's error says what to do when it can tell
        return StartupFailure(EXIT_ERROR, str(exc), hint if isinstance(hint, str) else None)
    return None


__all__ = [
    "EXIT_ADDRESS",
    "EXIT_CONFIG",
    "EXIT_DATA_LOSS",
    "EXIT_ERROR",
    "EXIT_LOCKED",
    "EXIT_META_DAMAGED",
    "EXIT_NOT_A_DIRECTORY",
    "EXIT_NO_SPACE",
    "EXIT_PERMISSION",
    "EXIT_RESOLVE",
    "EXIT_USAGE",
    "StartupFailure",
    "check_space",
    "explain",
]
