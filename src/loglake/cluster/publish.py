"""A cluster's metadata copied into its bucket, so Spark and exports plan from the bucket alone.

In cluster mode the metadata log lives in etcd, which Spark executors and `loglake pipeline
export` do not reach. One broker — the lowest live node id, the same one that sweeps — writes
the whole state as a metadata checkpoint (docs/FORMAT.md, "Checkpoint files": the file a
single-node broker publishes, byte format unchanged) under ``loglake-<cluster id>/meta/`` every
`interval_ms` in which the state moved. `loglake.meta.publish.read_remote_state` reads it as it
reads a single-node broker's copy, so the planner needs no second reader.

Why whole checkpoints and not the single-node publisher's log pieces: a broker that starts
publishing (the previous publisher died) has no local log to continue from, and etcd skips
records that do not apply (a fenced commit) without telling watchers, so pieces would have gaps
a reader refuses. A checkpoint is exact at its seq whatever happened before. The cost is one PUT
of the state (a few hundred bytes per partition plus its unmerged ranges) per interval while
the cluster changes, plus one LIST; nothing while it is idle.

Two brokers that both think they publish (their views of the live set differ for a moment)
write checkpoints of the same deterministic state; a reader takes the newest seq. The newest
CHECKPOINTS_KEPT stay, so a reader that listed just before a publish still finds its object.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from loglake.errors import LoglakeError
from loglake.meta.checkpoint import capture, encode_checkpoint
from loglake.meta.log import checkpoint_name
from loglake.meta.publish import META_PUBLISH_INTERVAL_MS_DEFAULT, meta_prefix
from loglake.store.base import ObjectStore

__all__ = ["CHECKPOINTS_KEPT", "ClusterMetaPublisher"]

log = logging.getLogger(__name__)

#: Published checkpoints kept (newest first); older ones are deleted after each publish. A
#: reader lists, then GETs the newest: three intervals is the time it has between the two.
CHECKPOINTS_KEPT = 3
#: Longest wait between tries after a failed publish (doubling from the interval).
PUBLISH_RETRY_S_MAX = 30.0


class ClusterMetaPublisher:
    """Copies the etcd metadata into the bucket while `is_publisher()` says this broker does."""

    def __init__(
        self,
        etcd: Any,  # loglake.cluster.etcd.EtcdMetaStore (read(fn) under its lock)
        store: ObjectStore,
        is_publisher: Callable[[], bool],
        *,
        interval_ms: int = META_PUBLISH_INTERVAL_MS_DEFAULT,
    ) -> None:
        self.etcd = etcd
        self.store = store
        self.is_publisher = is_publisher
        self.interval_s = interval_ms / 1000.0
        self._published_seq: int | None = None
        self._failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.puts = 0  # checkpoints written (tests count them)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loglake-cluster-publish", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a publisher leaving copies the newest state once more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        try:
            self.publish_once()
        except LoglakeError as exc:
            log.info("publishing the metadata at stop failed: %s", exc)

    def _run(self) -> None:
        delay = self.interval_s
        while not self._stop.wait(delay):
            try:
                self.publish_once()
            except LoglakeError as exc:
                # the bucket away: the copy lags, nothing else does; one line per outage
                self._failures += 1
                if self._failures == 1:
                    log.warning("publishing the cluster metadata to the bucket failed, retrying: %s", exc)
                delay = min(self.interval_s * 2**self._failures, PUBLISH_RETRY_S_MAX)
                continue
            if self._failures:
                log.warning(
                    "publishing the cluster metadata works again (after %d failed tries)", self._failures
                )
                self._failures = 0
            delay = self.interval_s

    def publish_once(self) -> bool:
        """Write a checkpoint of the current state if this broker publishes and it moved."""
        if not self.is_publisher():
            self._published_seq = None  # another broker publishes: start afresh if it comes back
            return False
        seq, cluster_id = self.etcd.read(lambda s: (s.seq, s.cluster_id))
        if not cluster_id or seq < 0 or seq == self._published_seq:
            return False
        image = self.etcd.read(capture)  # a copy under the lock, encoded outside it
        prefix = meta_prefix(cluster_id)
        self.store.put(prefix + checkpoint_name(image.seq), encode_checkpoint(image))
        self.puts += 1
        self._published_seq = image.seq
        self._trim(prefix)
        return True

    def _trim(self, prefix: str) -> None:
        keys = sorted(k for k in self.store.list(prefix) if k[len(prefix) :].startswith("checkpoint-"))
        for key in keys[:-CHECKPOINTS_KEPT]:  # the names sort by seq (20 digits)
            try:
                self.store.delete(key)
            except LoglakeError as exc:
                log.info("could not delete old metadata checkpoint %s: %s", key, exc)
