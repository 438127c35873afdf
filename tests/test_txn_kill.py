"""Exactly-once under kill -9: a consume-transform-produce application (confluent-kafka,
send_offsets_to_transaction) is killed at random moments, and so is the broker; each is started
again. At the end every input record is in the output exactly once (read_committed) and the
group's offsets cover every input."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from brokerkit import consume_to_end, free_port, serving_broker, start_on_port

PARTITIONS = 3
INPUTS = 3000
WAIT_S = 120.0

APP = r'''
import os
import sys
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, src, dst, group, total, parts = sys.argv[1:7]
total, parts = int(total), int(parts)
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
              "enable.auto.commit": False})
start = c.committed([TopicPartition(src, p) for p in range(parts)], timeout=60)
c.assign([TopicPartition(src, tp.partition, max(tp.offset, 0)) for tp in start])
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ctp-kill-" + group,
              "transaction.timeout.ms": 3000})
p.init_transactions(60)
# A partition's position is invalid (-1001) until a record of it was consumed: keep the
# committed start for those, or a partition finished by an earlier instance never counts.
pos = {tp.partition: max(tp.offset, 0) for tp in start}
done = sum(pos.values())
while done < total:
    msgs = [m for m in c.consume(10, 0.5) if not m.error()]  # small transactions: many of them
    if not msgs:
        continue
    p.begin_transaction()
    for m in msgs:
        p.produce(dst, value=b"out-" + m.value(), partition=m.partition())
    positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
    p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 60)
    p.commit_transaction(60)
    pos.update((tp.partition, tp.offset) for tp in positions)
    done = sum(pos.values())
    # One write per line: under PYTHONUNBUFFERED, print() writes "progress", " " and the number
    # separately, and a kill -9 between them left a line with no number.
    sys.stdout.write(f"progress {done}\n")
    sys.stdout.flush()
print("done", flush=True)
# Everything is committed: leave without librdkafka's teardown (it may wait on the broker).
os._exit(0)
'''


def read_committed(bootstrap: str, topic: str, want: int) -> list[bytes]:
    return consume_to_end(bootstrap, topic, PARTITIONS, "read_committed", want, WAIT_S)


def test_consume_transform_produce_survives_kill_9(tmp_path: Path) -> None:
    rng = random.Random(7)
    port = free_port()
    app_file = tmp_path / "ctp_app.py"
    app_file.write_text(APP)
    env = {"LOGLAKE_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "200"}
    args = ["--listen", f"127.0.0.1:{port}", "--default-partitions", str(PARTITIONS)]
    src, dst, group = "ctp-in", "ctp-out", "ctp-group"
    with serving_broker(tmp_path / "data", args, env=env) as b:
        plain = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(INPUTS):
            plain.produce(src, value=b"in-%d" % i, partition=i % PARTITIONS)
        plain.flush(WAIT_S)
        argv = [sys.executable, str(app_file), b.bootstrap, src, dst, group, str(INPUTS), str(PARTITIONS)]
        kills_mid_run = 0
        for round_ in range(8):
            app = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            time.sleep(rng.uniform(0.5, 2.5))  # a random moment, not an expectation
            if app.poll() is None:
                app.send_signal(signal.SIGKILL)
            app.wait()
            assert app.stdout is not None
            lines = app.stdout.read().split("\n")[:-1]  # the text after the last newline may be cut by the kill
            progress = [int(line.split()[1]) for line in lines if line.startswith("progress ")]
            kills_mid_run += bool(progress) and progress[-1] < INPUTS
            if round_ % 3 == 2:  # the broker too, sometimes while the application runs
                app = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                time.sleep(rng.uniform(0.5, 2.0))
                b.stop(signal.SIGKILL)
                app.send_signal(signal.SIGKILL)
                app.wait()
                start_on_port(b, port)
        assert kills_mid_run > 0  # at least one kill landed between committed transactions
        try:
            final = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        except subprocess.TimeoutExpired as exc:
            tail = f"{str(exc.stdout)[-500:]}\n{str(exc.stderr)[-3000:]}"
            raise AssertionError(f"application did not finish: {tail}\n{b.log_text()[-3000:]}") from None
        assert final.returncode == 0 and "done" in final.stdout, final.stderr[-3000:]
        out = read_committed(b.bootstrap, dst, INPUTS)
        assert len(out) == INPUTS and sorted(out) == sorted(b"out-in-%d" % i for i in range(INPUTS))
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
        try:
            committed = c.committed([TopicPartition(src, p) for p in range(PARTITIONS)], timeout=60)
        finally:
            c.close()
        assert sum(tp.offset for tp in committed) == INPUTS
