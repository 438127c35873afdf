"""py-spy on the broker of benchmarks/broker.py while a producer sends as fast as it can: the
functions the broker's threads spend their samples in (self and inclusive), for the "profile"
section of its JSON and table."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchkit import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
produce_throughput = load_benchmark("broker_client").produce_throughput


def parse_raw_profile(path: Path, top: int = 20) -> dict[str, Any]:
    """py-spy --format raw: one collapsed stack per line, "frame;frame;...;leaf count"."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        self_counts[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            total_counts[frame] += count
    return {
        "samples": samples,
        "top_self": [(f, c, 100.0 * c / samples) for f, c in self_counts.most_common(top)] if samples else [],
        "top_total": [(f, c, 100.0 * c / samples) for f, c in total_counts.most_common(top)]
        if samples
        else [],
    }


def _short(frame: str) -> str:
    """'func (path/to/module.py:123)' -> 'func (module.py)' — lines vary within a function."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{name} ({file})" if file else name


def profile_produce(
    bootstrap: str, topic: str, broker_pid: int, seconds: int, out: Path, count: int, size: int
) -> dict[str, Any]:
    pyspy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    if not Path(pyspy).exists():
        return {"error": "py-spy not found"}
    cmd = [
        pyspy,
        "record",
        "--pid",
        str(broker_pid),
        "--duration",
        str(seconds),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
    ]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    produced = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and spy.poll() is None:
            produce_throughput(bootstrap, topic, size, count, broker_pid)
            produced += count
    finally:
        try:
            _, err = spy.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            spy.send_signal(signal.SIGINT)
            _, err = spy.communicate()
    if spy.returncode != 0 or not out.exists():
        return {"error": f"py-spy exited {spy.returncode}: {err.strip()[-500:]}"}
    return {
        "seconds": seconds,
        "record_bytes": size,
        "records_produced": produced,
        "raw_file": str(out),
        **parse_raw_profile(out),
    }
