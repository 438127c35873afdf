"""Figures of the long runs (make test-long) for docs/RELIABILITY.md.

A long test calls `record(section, figures)`; the figures are merged into the JSON file named by
LOGLAKE_LONG_REPORT (nothing happens without it). `make test-long` points it, and the fuzz,
canary and overload reports, at build/long-run/ and then regenerates the document's long-run
table from them (scripts/reliability_report.py). Figures are what the run measured, never typed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

REPORT_ENV = "LOGLAKE_LONG_REPORT"


def update_report(env: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the JSON document in the file named by environment variable `env` (a
    missing or unreadable file starts empty); nothing happens when `env` is not set."""
    path = os.environ.get(env)
    if not path:
        return
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    change(doc)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)


def record(section: str, figures: dict[str, Any]) -> None:
    def change(doc: dict[str, Any]) -> None:
        entry = doc.setdefault(section, {})
        for key, value in figures.items():  # counters add up over parametrized runs, the rest is replaced
            entry[key] = entry.get(key, 0) + value if key.endswith("_total") else value

    update_report(REPORT_ENV, change)
