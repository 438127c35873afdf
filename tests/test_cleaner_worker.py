"""The cleaner's worker process (loglake.engine.cleaner_worker) when the broker that started it
is gone: killed with kill -9, the broker leaves its worker writing an answer into a pipe nobody
reads. The worker ends quietly (exit 0, nothing on stderr), not with a BrokenPipeError traceback
per killed broker (make test-long's compaction kill loop printed one each cycle)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from loglake.engine.cleaner_job import _LEN


def test_a_worker_whose_broker_is_gone_ends_quietly() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "loglake.engine.cleaner_worker", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert worker.stdin is not None and worker.stdout is not None and worker.stderr is not None
    worker.stdout.close()  # the broker's end of the answer pipe: gone, as after a kill -9
    job = pickle.dumps("not a job")  # fails at once, so the worker answers (an error) straight away
    worker.stdin.write(_LEN.pack(len(job)) + job)
    worker.stdin.flush()
    assert worker.wait(timeout=60) == 0
    err = worker.stderr.read()
    worker.stdin.close()
    worker.stderr.close()
    assert err == b"", err.decode()
