#!/usr/bin/env python3
"""Seconds per xdist group of a `make test` run, as tests/conftest.py's GROUP_SECONDS table.

    .venv/bin/pytest -q -m "not long" -n 2 --dist loadgroup --junitxml=build/suite.xml
    python scripts/test_groups.py build/suite.xml            # prints the table to paste

A group is what tests/conftest.py's `xdist_group` says (a module, or "spark"); its time is the
sum of its tests' times in the junit XML (setup, call and teardown). Groups under --min seconds
are left out (the scheduler orders those by test count). Take the figures from a quiet machine:
they order the run, and a loaded run's figures are inflated unevenly.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import xdist_group


def nodeid(classname: str, name: str) -> str:
    """The pytest node id of a junit test case (classname "tests.test_x" or "tests.test_x.Class")."""
    parts = classname.split(".")
    cut = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1) + 1
    return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])


def group_seconds(xml: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        group = xdist_group(nodeid(case.get("classname", ""), case.get("name", "")))
        seconds[group] = seconds.get(group, 0.0) + float(case.get("time") or 0.0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", type=Path, help="pytest --junitxml output of a make test run")
    parser.add_argument("--min", type=float, default=30.0, help="leave out groups shorter than this")
    args = parser.parse_args()
    seconds = group_seconds(args.xml)
    print(f"# {sum(seconds.values()):.0f} s over {len(seconds)} groups")
    print("GROUP_SECONDS: dict[str, float] = {")
    for group, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if s >= args.min:
            print(f'    "{group}": {s:.0f},')
    print("}")


if __name__ == "__main__":
    main()
