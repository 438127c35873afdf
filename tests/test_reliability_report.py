"""The long-run table of docs/RELIABILITY.md is generated from the long runs' JSON reports."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import reliability_report as rr  # noqa: E402

import longreport  # noqa: E402


def _reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(longreport.REPORT_ENV, str(tmp_path / "soak.json"))
    for _seed in range(3):  # parametrized runs add up their *_total counters
        longreport.record("crash_sweep_torn", {"seeds_total": 1, "points_total": 120, "lost_total": 0})
    longreport.record("kill9_cycles", {"cycles": 200, "acked": 51234, "lost": 0})
    (tmp_path / "fuzz.json").write_text(json.dumps({"long": {"seed": 7, "seconds": 600.5, "cases": 1_000_000, "failures": 0,
                                                             "targets": {"requests": {"cases": 900_000}, "wal": {"cases": 100_000}}}}))
    (tmp_path / "canaries.json").write_text(json.dumps({"canaries": {"skip_crc_check": {"caught": True}, "skip_wal_fsync": {"caught": False}},
                                                        "control": {"passed": True}}))
    return tmp_path


def test_table_comes_from_the_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = rr.load(_reports(tmp_path, monkeypatch))
    text = rr.render(doc, datetime(2026, 11, 24, tzinfo=UTC), "abc1234")
    assert "commit abc1234" in text and "2026-11-24 00:00 UTC" in text
    assert "360 crash points over 3 seeds, 0 acknowledged records lost" in text
    assert "200 kill -9 cycles, 51,234 acknowledged records, 0 lost" in text
    assert "1,000,000 cases (seed 7, 600.5 s), 0 failures: requests 900,000, wal 100,000" in text
    assert "1 of 2 caught (skip_crc_check); NOT caught: skip_wal_fsync; control run without canaries passed" in text
    assert text.count("no report in this run") == 4  # threaded, compaction, broker fuzz, overload
    assert text.count("\n| ") == len(rr.SCENARIOS) + 1


def test_the_document_section_is_replaced_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reports = _reports(tmp_path, monkeypatch)
    doc_path = tmp_path / "RELIABILITY.md"
    original = (ROOT / "docs" / "RELIABILITY.md").read_text()
    doc_path.write_text(original)
    assert rr.main([str(reports), "--write", str(doc_path)]) == 0
    updated = doc_path.read_text()
    head, _ = original.split(rr.BEGIN)
    _, tail = original.split(rr.END)
    assert updated.startswith(head) and updated.endswith(tail)
    assert "200 kill -9 cycles" in updated
    assert rr.main([str(tmp_path / "nothing-here")]) == 1
