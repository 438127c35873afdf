"""Figures of the long runs (make test-long) for docs/RELIABILITY.md.

A long test calls `record(section, figures)`; the figures are merged into the JSON file named by
LOGLAKE_LONG_REPORT (nothing happens without it). `make test-long` points it, and the fuzz,
canary and overload reports, at build/long-run/ and then regenerates the document's long-run
table from them (scripts/reliability_report.py). Figures are what the run measured, never typed.
"""

from __future__ import annotations

import json
import os
from typing import Any

REPORT_ENV = "LOGLAKE_LONG_REPORT"


def record(section: str, figures: dict[str, Any]) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    entry = doc.get(section, {})
    for key, value in figures.items():  # counters add up over parametrized runs, the rest is replaced
        entry[key] = entry.get(key, 0) + value if key.endswith("_total") else value
    doc[section] = entry
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
