"""tests/conftest.py's schedule of `make test`: the groups it names exist, and the order puts
the long groups first."""

from __future__ import annotations

from pathlib import Path

from conftest import GROUP_SECONDS, SPARK_GROUP, SPARK_JOB_GROUP, SPARK_JOB_TESTS, schedule_order, xdist_group

ROOT = Path(__file__).resolve().parent.parent


def test_every_timed_group_and_spark_job_names_a_test_module_that_exists() -> None:
    for group in GROUP_SECONDS:
        assert group in (SPARK_GROUP, SPARK_JOB_GROUP) or (ROOT / group).is_file(), (
            f"GROUP_SECONDS names {group}, which is no test module (refresh it: scripts/test_groups.py)"
        )
    for prefix in SPARK_JOB_TESTS:
        module = prefix.partition("::")[0]
        assert (ROOT / module).is_file(), f"SPARK_JOB_TESTS names {module}, which does not exist"


def test_spark_jobs_and_session_tests_are_two_groups() -> None:
    assert xdist_group("tests/test_spark_read.py::test_x") == SPARK_GROUP
    assert xdist_group("tests/test_docs.py::test_spark_example[docs/SPARK.md:24]") == SPARK_GROUP
    assert xdist_group("tests/test_docs.py::test_spark_shell_example[docs/SPARK.md:403]") == SPARK_JOB_GROUP
    assert xdist_group("tests/test_spark_cluster.py::test_x") == SPARK_JOB_GROUP
    assert xdist_group("tests/test_docs.py::test_shell_example[README.md:1]") == "tests/test_docs.py"


def test_timed_groups_go_out_longest_first_then_the_rest_by_test_count() -> None:
    longest, second = sorted(GROUP_SECONDS, key=lambda g: -GROUP_SECONDS[g])[:2]
    counts = {"tests/test_new_a.py": 3, second: 1, "tests/test_new_b.py": 40, longest: 2}
    assert schedule_order(counts) == [longest, second, "tests/test_new_b.py", "tests/test_new_a.py"]
