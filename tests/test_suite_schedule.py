"""tests/conftest.py's schedule of `make test`: the groups it times exist, and the order puts
the long groups first."""

from __future__ import annotations

from pathlib import Path

from conftest import GROUP_SECONDS, SPARK_GROUP, schedule_order

ROOT = Path(__file__).resolve().parent.parent


def test_every_timed_group_names_a_test_module_that_exists() -> None:
    for group in GROUP_SECONDS:
        assert group == SPARK_GROUP or (ROOT / group).is_file(), (
            f"GROUP_SECONDS names {group}, which is no test module (refresh it: scripts/test_groups.py)"
        )


def test_timed_groups_go_out_longest_first_then_the_rest_by_test_count() -> None:
    longest, second = sorted(GROUP_SECONDS, key=lambda g: -GROUP_SECONDS[g])[:2]
    counts = {"tests/test_new_a.py": 3, second: 1, "tests/test_new_b.py": 40, longest: 2}
    assert schedule_order(counts) == [longest, second, "tests/test_new_b.py", "tests/test_new_a.py"]
