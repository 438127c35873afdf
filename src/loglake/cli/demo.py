"""`loglake demo`: a few thousand records through an embedded log in its own directory."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from loglake.cli.common import CliError, open_log, plural, stdout_console

DEMO_TOPIC = "demo"
DEMO_PARTITIONS = 3
DEMO_CHUNK = 2_000
#: The demo's own data directory: never the broker's (`loglake serve`, `make run`) by default.
DEMO_DATA_DIR = "./loglake-demo"


def demo(
    records: Annotated[int, typer.Option("--records", "-n", min=1, help="Records to produce with produce_batch.")] = 10_000,
    data_dir: Annotated[
        str, typer.Option("--data-dir", "-d", help="Data directory of the demo (not LOGLAKE_DATA_DIR's).")
    ] = DEMO_DATA_DIR,
) -> None:
    """Produce and consume a few thousand records on topic 'demo' of an embedded log in its own
    directory (./loglake-demo: no broker, and not `make run`'s data); re-runnable."""
    started = time.perf_counter()
    console = stdout_console()
    with open_log(data_dir, must_exist=False) as log:
        recovery = log.recovery_report
        if not log.engine.has_topic(DEMO_TOPIC):
            log.create_topic(DEMO_TOPIC, partitions=DEMO_PARTITIONS)
            console.print(f"created topic {DEMO_TOPIC} ({plural(DEMO_PARTITIONS, 'partition')})", markup=False)
        before = {p.partition: p.high_watermark for p in log.describe_topic(DEMO_TOPIC).partitions}
        run = int(time.time())
        produced: dict[int, int] = {}
        t0 = time.perf_counter()
        for start in range(0, records, DEMO_CHUNK):
            batch: list[tuple[bytes | None, bytes | None]] = [
                (f"user-{i % 97}".encode(), f'{{"run": {run}, "seq": {i}, "event": "click"}}'.encode())
                for i in range(start, min(records, start + DEMO_CHUNK))
            ]
            for md in log.produce_batch(DEMO_TOPIC, batch):
                produced[md.partition] = produced.get(md.partition, 0) + 1
        for i in range(3):
            md1 = log.produce(
                DEMO_TOPIC, f"hello {i} from run {run}".encode(), key=b"greeting", headers=[("source", b"loglake demo")]
            )
            produced[md1.partition] = produced.get(md1.partition, 0) + 1
        produce_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        consumed: dict[int, list[int]] = {}
        for rec in log.consume(DEMO_TOPIC, start=before):
            consumed.setdefault(rec.partition, []).append(rec.offset)
        consume_s = time.perf_counter() - t0
        total_produced = sum(produced.values())
        total_consumed = sum(len(v) for v in consumed.values())
        table = Table(title=f"topic {DEMO_TOPIC}: this run", title_justify="left")
        for col in ("partition", "produced", "consumed", "offsets", "log start", "high watermark"):
            table.add_column(col, justify="right")
        for p in log.describe_topic(DEMO_TOPIC).partitions:
            offsets = consumed.get(p.partition, [])
            table.add_row(
                str(p.partition),
                str(produced.get(p.partition, 0)),
                str(len(offsets)),
                f"{offsets[0]}..{offsets[-1]}" if offsets else "-",
                str(p.log_start_offset),
                str(p.high_watermark),
            )
        console.print(table)
        console.print(
            f"produced {plural(total_produced, 'record')} in {produce_s:.2f}s, consumed {total_consumed} in {consume_s:.2f}s",
            markup=False,
        )
        if recovery is not None:
            console.print(f"open: {recovery.summary()}", markup=False)
        log.flush()
    if total_consumed != total_produced:
        raise CliError(f"demo consumed {plural(total_consumed, 'record')} but produced {total_produced}")
    console.print(f"demo done in {time.perf_counter() - started:.2f}s (data in {data_dir})", markup=False)
