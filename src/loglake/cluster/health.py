"""Whether a cluster broker can reach etcd and the bucket: what gates its leadership.

A broker may lead a partition only while it can write it: the flush object goes to the bucket and
its range is committed in etcd. `ClusterHealth` tracks when each last answered:

* etcd: the last answer to any of this broker's etcd requests (`EtcdClient.last_answer`; the
  membership follower reads the live set every second, so a reachable etcd answers at least that
  often);
* the bucket: the last successful flush PUT or probe. A prober thread lists a prefix nothing uses
  every `release_s / 4` unless a flush PUT succeeded meanwhile (a busy broker costs no extra
  request). While the broker does not stand for leadership, the probe writes and deletes a small
  object instead: credentials that may list but not write must not win leadership back.

A side is *down* once it has not answered for `release_s` (`cluster_unreachable_release_ms`), or —
the bucket — once flush PUTs have failed for that long with none succeeding (a LIST may still
work). Never answered since the start counts as down at once: a broker started without its
credentials never stands for leadership. While a side is down the broker leads nothing
(loglake.cluster.view), /readyz answers 503 with `not_ready()`'s lines, and one warning with what to
check is logged when it goes down (another when it comes back; repeats of a flapping side are
summarised by the rate limiter, never one line per round).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from loglake.engine.telemetry import Family, HistogramFamily
from loglake.logsafe import RateLimitedLog

__all__ = ["PROBES_PER_RELEASE", "ClusterHealth", "probe_prefix"]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: Bucket probes per `release_s` while nothing else shows the bucket answering (a LIST costs about
#: as much as a PUT: at the 5 s default an idle broker lists 0.8 times a second).
PROBES_PER_RELEASE = 4
#: What the write probe puts (and deletes at once).
PROBE_OBJECT = b"loglake health probe\n"


def probe_prefix(cluster_id: str) -> str:
    """The bucket prefix the start probe lists and the health probe writes under (nothing else uses it)."""
    return f"loglake-{cluster_id}/start-probe/"


@dataclass
class _Side:
    """When one side (etcd, the bucket) last answered, and since when its writes fail."""

    name: str
    hint: str
    last_ok: float | None = None
    writes_failing_since: float | None = None
    last_error: str = ""
    down: bool = False  # as last reported (one line per change)


class ClusterHealth:
    def __init__(
        self,
        node_id: int,
        release_s: float,
        *,
        bucket_url: str,
        etcd_url: str,
        probe_list: Callable[[], object],
        probe_write: Callable[[], None],
        etcd_answered: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`probe_list` / `probe_write`: one request to the bucket each (raise when it fails);
        `etcd_answered`: monotonic time of etcd's last answer to this broker."""
        self.node_id = node_id
        self.release_s = release_s
        self._probe_list = probe_list
        self._probe_write = probe_write
        self._etcd_answered = etcd_answered
        self._clock = clock
        self.started = clock()
        self.bucket = _Side(
            f"bucket {bucket_url}",
            "check the cold store's endpoint and credentials (--cold-store; AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) and that they may list, put and delete",
        )
        self.etcd = _Side(f"etcd {etcd_url}", "check that etcd runs and this host reaches it (--cluster)")
        #: standing for leadership, as the view last decided (the probe writes while it does not)
        self.standing = False
        self.probes = 0
        self.probe_failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._probed = threading.Event()  # the prober's first probe is done
        self._thread: threading.Thread | None = None

    # ---- what the bucket's users report ------------------------------------------------------------

    def bucket_answered(self, *, write: bool) -> None:
        """A request to the bucket succeeded (`write`: a PUT, which clears a failing-writes streak)."""
        with self._lock:
            self.bucket.last_ok = self._clock()
            if write:
                self.bucket.writes_failing_since = None

    def bucket_failed(self, error: BaseException, *, write: bool, probe: bool = False) -> None:
        """A request to the bucket failed after its retries (`probe`: the prober's own, which
        does not wake the prober: a failure that comes at once must not become a busy loop)."""
        with self._lock:
            self.bucket.last_error = f"{type(error).__name__}: {error}"
            if write and self.bucket.writes_failing_since is None:
                self.bucket.writes_failing_since = self._clock()
        if not probe:
            self._wake.set()  # look now rather than at the next interval

    # ---- the verdict -------------------------------------------------------------------------------

    def _etcd_side(self) -> _Side:
        with self._lock:
            self.etcd.last_ok = self._etcd_answered()
            return self.etcd

    def down_for(self, side: _Side, now: float) -> float | None:
        """How long `side` has been down (None: it is not down)."""
        with self._lock:
            last, failing = side.last_ok, side.writes_failing_since
        if last is None:
            return now - self.started
        silent = now - last
        if silent >= self.release_s:
            return silent
        if failing is not None and now - failing >= self.release_s:
            return now - failing
        return None

    def check(self) -> tuple[bool, bool]:
        """(etcd usable, bucket usable) now; logs one line when either changes."""
        now = self._clock()
        etcd = self._report(self._etcd_side(), now)
        bucket = self._report(self.bucket, now)
        return etcd, bucket

    def _report(self, side: _Side, now: float) -> bool:
        gone = self.down_for(side, now)
        down = gone is not None
        if down != side.down:
            side.down = down
            if down:
                _limited.warning(
                    ("down", side.name),
                    "node %d cannot reach %s (%.1f s without an answer%s): it leads no partition and /readyz "
                    "says not ready until it answers again; %s",
                    self.node_id, side.name, gone, f"; last error: {side.last_error}" if side.last_error else "",
                    side.hint,
                )  # fmt: skip
            else:
                _limited.warning(
                    ("up", side.name), "node %d reaches %s again: it stands for leadership", self.node_id, side.name
                )
        return not down

    def not_ready(self) -> list[str]:
        """One line per side that is down, with what to check (empty: both answer)."""
        now = self._clock()
        out = []
        for side in (self._etcd_side(), self.bucket):
            gone = self.down_for(side, now)
            if gone is not None:
                error = f" (last error: {side.last_error})" if side.last_error else ""
                out.append(
                    f"cannot reach {side.name} for {gone:.1f} s{error}: this broker leads no partition; {side.hint}"
                )
        return out

    # ---- the prober ----------------------------------------------------------------------------------

    @property
    def probe_interval_s(self) -> float:
        return self.release_s / PROBES_PER_RELEASE

    def start(self, first_wait_s: float) -> bool:
        """Start the prober, whose first probe is at once; wait up to `first_wait_s` for it (a
        bucket that holds requests unanswered must not hold the start). True if it answered."""
        self._thread = threading.Thread(target=self._run, name="loglake-cluster-health", daemon=True)
        self._thread.start()
        self._probed.wait(first_wait_s)
        with self._lock:
            return self.bucket.last_ok is not None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def probe_now(self) -> None:
        """Probe on the prober's thread at once (an acquire or a flush failed)."""
        self._wake.set()

    def probe(self) -> bool:
        """One probe of the bucket: a write (PUT and DELETE) while not standing for leadership,
        else a LIST. True when it answered."""
        write = not self.standing
        self.probes += 1
        try:
            (self._probe_write if write else self._probe_list)()
        except Exception as exc:  # whatever the store raises: it did not answer as it must
            self.probe_failures += 1
            self.bucket_failed(exc, write=write, probe=True)
            return False
        self.bucket_answered(write=write)
        return True

    def _run(self) -> None:
        self.probe()
        self._probed.set()
        while not self._stop.is_set():
            woken = self._wake.wait(self.probe_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                last = self.bucket.last_ok
            fresh = last is not None and self._clock() - last < self.probe_interval_s
            if fresh and self.standing and not woken:
                continue  # a flush PUT answered meanwhile
            self.probe()

    # ---- /metrics ---------------------------------------------------------------------------------

    def families(self) -> list[Family | HistogramFamily]:
        now = self._clock()
        out: list[Family | HistogramFamily] = []
        for key, side in (("etcd", self._etcd_side()), ("bucket", self.bucket)):
            with self._lock:
                last = side.last_ok
            out.append(Family.gauge(
                f"loglake_cluster_{key}_reachable",
                f"1 while this broker reaches {key} (it answered within cluster_unreachable_release_ms), else 0.",
                0 if self.down_for(side, now) is not None else 1,
            ))  # fmt: skip
            out.append(Family.gauge(
                f"loglake_cluster_{key}_silent_seconds",
                f"Seconds since {key} last answered this broker (since the start when it never did).",
                now - (last if last is not None else self.started),
            ))  # fmt: skip
        out.append(Family.counter("loglake_cluster_bucket_probes_total", "Health probes of the bucket.", self.probes))
        out.append(Family.counter(
            "loglake_cluster_bucket_probe_failures_total", "Health probes of the bucket that failed.", self.probe_failures
        ))  # fmt: skip
        return out
