"""The cluster fault tests' history checker (tests/logcheck.py) on hand-made histories: a good
one passes, and each kind of damage a broken cluster could do is caught and named."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from logcheck import History, value_for

T = "t"


def good_history(n: int = 10, partitions: int = 2) -> History:
    """`n` records per partition, all acked at offsets 0..n-1, read back in full, consumed by a
    group that committed everything."""
    h = History()
    for p in range(partitions):
        log = []
        for i in range(n):
            v = value_for(f"p{p}", i)
            h.acked(h.attempt(T, v), p, i)
            log.append((i, v))
            h.consume("g", T, p, i, v)
        h.commit("g", T, p, n // 2)
        h.commit("g", T, p, n)
        h.final_read(T, p, log)
    return h


def test_a_good_history_passes() -> None:
    rep = good_history().check()
    assert rep.ok, str(rep)
    assert rep.stats["acked"] == 20 and rep.stats["final_records"] == 20


def test_unknown_and_failed_outcomes_are_allowed_when_not_contradicted() -> None:
    h = History()
    a, b, c, d = (value_for("x", i) for i in range(4))
    h.acked(h.attempt(T, a), 0, 0)
    h.unknown(h.attempt(T, b), "timed out")  # landed
    h.unknown(h.attempt(T, c), "timed out")  # did not land
    h.failed(h.attempt(T, d), "INVALID_RECORD")
    h.final_read(T, 0, [(0, a), (1, b)])
    rep = h.check()
    assert rep.ok, str(rep)
    assert rep.stats["unknown"] == 2 and rep.stats["unknown_present"] == 1


def test_lost_acked_record_is_caught() -> None:
    h = good_history()
    h.final[(T, 1)].pop(9)  # the last acked record of partition 1 vanished
    rep = h.check()
    assert rep.kinds() == {"lost"}, str(rep)
    assert rep.anomalies["lost"][0].partition == 1 and rep.anomalies["lost"][0].offset == 9


def test_partition_never_read_counts_as_lost() -> None:
    h = good_history()
    del h.final[(T, 0)]
    rep = h.check()
    assert "lost" in rep.kinds() and rep.counts["lost"] == 10


def test_duplicate_is_caught_for_idempotent_producers_only() -> None:
    h = History()
    a, b = value_for("x", 0), value_for("x", 1)
    h.acked(h.attempt(T, a), 0, 0)
    h.unknown(h.attempt(T, b), "request timed out")
    h.final_read(T, 0, [(0, a), (1, b), (2, b)])  # the retried record landed twice
    assert h.check().kinds() == {"duplicate"}
    relaxed = h.check(idempotent=False)
    assert relaxed.ok and relaxed.stats["retry_duplicate"] == 1


def test_offset_mismatch_is_caught() -> None:
    h = History()
    a, b = value_for("x", 0), value_for("x", 1)
    h.acked(h.attempt(T, a), 0, 0)
    h.acked(h.attempt(T, b), 0, 1)
    h.final_read(T, 0, [(0, b), (1, a)])  # both present, each at the other's offset
    rep = h.check()
    assert rep.kinds() == {"moved"} and rep.counts["moved"] == 2


def test_two_acks_at_one_offset_are_caught() -> None:
    h = History()
    a, b = value_for("old-leader", 0), value_for("new-leader", 0)
    h.acked(h.attempt(T, a), 0, 5)
    h.acked(h.attempt(T, b), 0, 5)
    h.final_read(T, 0, [(5, b)])
    rep = h.check()
    assert {"double_ack", "lost"} <= rep.kinds(), str(rep)


def test_an_ack_without_offset_is_counted_and_still_held_to_the_log() -> None:
    """librdkafka's implicit acks carry no offset: legal, but the record must be there once."""
    h = History()
    a, b, c, d = (value_for("x", i) for i in range(4))
    h.acked(h.attempt(T, a), 0, 0)
    h.acked(h.attempt(T, b), 0, None)  # present once: fine
    h.final_read(T, 0, [(0, a), (1, b)])
    rep = h.check()
    assert rep.ok, str(rep)
    assert rep.stats["acked_no_offset"] == 1

    h.acked(h.attempt(T, c), 0, None)  # absent: lost
    h.acked(h.attempt(T, d), 0, None)  # present twice: duplicate
    h.final_read(T, 0, [(0, a), (1, b), (2, d), (3, d)])
    rep = h.check()
    assert rep.kinds() == {"lost", "duplicate"}, str(rep)
    assert value_for("x", 2).decode() in str(rep.anomalies["lost"][0])


def test_an_offset_read_as_two_records_is_caught() -> None:
    h = good_history()
    h.read(T, 0, 3, value_for("p1", 3))  # a reader saw partition 1's record at partition 0's offset 3
    rep = h.check()
    assert rep.kinds() == {"conflict"}, str(rep)


def test_failed_record_present_and_phantom_are_caught() -> None:
    h = History()
    a, b = value_for("x", 0), value_for("x", 1)
    h.acked(h.attempt(T, a), 0, 0)
    h.failed(h.attempt(T, b), "fenced")
    h.final_read(T, 0, [(0, a), (1, b), (2, b"never-produced")])
    assert h.check().kinds() == {"failed_present", "phantom"}


def test_gap_in_the_log_is_caught() -> None:
    h = History()
    a, b = value_for("x", 0), value_for("x", 1)
    h.acked(h.attempt(T, a), 0, 0)
    h.acked(h.attempt(T, b), 0, 2)
    h.final_read(T, 0, [(0, a), (2, b)])
    rep = h.check()
    assert rep.kinds() == {"gap"} and rep.anomalies["gap"][0].offset == 1


def test_consumers_not_resuming_at_their_commit_are_caught() -> None:
    h = good_history()
    h.consumed["g"][(T, 0)].discard(4)  # a consumer restarted past an offset nobody handled
    rep = h.check()
    assert rep.kinds() == {"consumer_gap"} and rep.anomalies["consumer_gap"][0].offset == 4
    h2 = good_history()
    h2.commit("g", T, 1, 3)  # progress went backwards
    assert h2.check().kinds() == {"commit_regress"}


def test_values_must_be_unique() -> None:
    h = History()
    h.attempt(T, b"same")
    h.attempt(T, b"same")
    with pytest.raises(ValueError, match="unique"):
        h.check()


def test_report_keeps_examples_bounded_and_counts_exact() -> None:
    h = History()
    for i in range(500):
        h.acked(h.attempt(T, value_for("x", i)), 0, i)
    h.final_read(T, 0, [])
    rep = h.check()
    assert rep.counts == {"lost": 500} and len(rep.anomalies["lost"]) == 20
    assert "500 x lost" in str(rep)


def test_recording_from_many_threads() -> None:
    h = History()

    def producer(name: str) -> None:
        for i in range(200):
            op = h.attempt(T, value_for(name, i))
            h.unknown(op, "x")

    threads = [threading.Thread(target=producer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.check().stats["unknown"] == 800


def test_a_real_history_from_a_single_node_broker_checks_clean(tmp_path: Path) -> None:
    """The checker is not stricter than a correct log: two idempotent confluent-kafka producers
    and a group of three consumers against one single-node broker check clean."""
    from confluent_kafka.admin import AdminClient, NewTopic

    import clusterload

    from brokerkit import serving_in_process

    with serving_in_process(tmp_path / "data") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("t", 4, 1)])["t"].result(30)
        h = History()
        with clusterload.Load(h, b.bootstrap, "t", producers=2, consumers=3, rate=400) as load:
            load.wait_acked(2000, 60)
            load.stop_producers()
            load.drain_consumers(60)
        clusterload.final_read(h, b.bootstrap, "t", 4)
    rep = h.check()
    assert rep.ok, str(rep)
    assert rep.stats["acked"] >= 2000 and rep.stats["final_records"] == rep.stats["acked"]
    assert sum(len(v) for v in h.commits["g"].values()) > 0
