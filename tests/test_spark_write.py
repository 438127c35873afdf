"""Writing through the `loglake` sink to a running broker (Kafka protocol), read back with the source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("confluent_kafka")

from sparkkit import reader, spark_rows

from brokerkit import running_broker


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def test_write_round_trip(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

    import loglake.spark

    loglake.spark.register(spark)
    data_dir = tmp_path / "data"
    src_dir = tmp_path / "src"
    with loglake.open(str(src_dir)) as src:
        src.create_topic("in", 2)
        src.produce_batch("in", [(f"s{i}".encode(), f"streamed-{i}".encode()) for i in range(20)])
        src.flush()
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            ),
        ]
    )
    rows = [
        (
            None if i % 4 == 0 else f"k{i}",
            f"value-{i}".encode(),
            i % 2,
            [("h", f"{i}".encode())] if i % 3 == 0 else None,
        )
        for i in range(50)
    ]
    with running_broker(data_dir) as broker:
        _create_topic(broker.bootstrap, "w", 2)
        _create_topic(broker.bootstrap, "ws", 1)
        df = spark.createDataFrame(rows, schema).repartition(2)
        df.write.format("loglake").option("kafka.bootstrap.servers", broker.bootstrap).option(
            "topic", "w"
        ).mode("append").save()
        # a streaming write: loglake source -> loglake sink
        q = (
            spark.readStream.format("loglake")
            .option("path", str(src_dir))
            .option("subscribe", "in")
            .load()
            .selectExpr("key", "value")
            .writeStream.format("loglake")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", "ws")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        with pytest.raises(Exception, match="needs a `value` column"):
            spark.createDataFrame([("x",)], "key string").write.format("loglake").option(
                "kafka.bootstrap.servers", broker.bootstrap
            ).option("topic", "w").mode("append").save()
    with loglake.open(str(data_dir)) as log:  # seal whatever the broker had not sealed yet
        log.flush()
    got = spark_rows(reader(spark, data_dir, subscribe="w", includeHeaders="true"))
    assert len(got) == 50
    for key, value, _topic, partition, _offset, _ts, _tt, headers in got:
        i = int(value.decode().split("-")[1])
        assert key == (None if i % 4 == 0 else f"k{i}".encode())
        assert partition == i % 2
        assert headers == ([("h", f"{i}".encode())] if i % 3 == 0 else None)
    streamed = sorted(bytes(r["value"]) for r in reader(spark, data_dir, subscribe="ws").collect())
    assert streamed == sorted(f"streamed-{i}".encode() for i in range(20))
