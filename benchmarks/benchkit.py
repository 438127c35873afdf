"""What the benchmark scripts share: loading a sibling benchmark as a module (their helpers, such
as the disk limits and percentiles of disk_limits.py, are reused rather than copied), and how a
report goes out (`emit`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent


def load_benchmark(name: str) -> Any:
    """benchmarks/<name>.py as a module (registered as `loglake_<name>_bench`)."""
    module_name = f"loglake_{name}_bench"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def emit(doc: dict[str, Any], json_out: str | None, table: Callable[[dict[str, Any]], str]) -> None:
    """A benchmark's report: its JSON document on stdout (and in `json_out` when given), then its
    table on stderr after a blank line."""
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if json_out:
        Path(json_out).write_text(text + "\n")
    print("", file=sys.stderr, flush=True)
    print(table(doc), file=sys.stderr, flush=True)
