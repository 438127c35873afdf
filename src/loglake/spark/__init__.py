"""The PySpark data source of loglake (`pip install loglake[spark]`).

    import loglake.spark
    loglake.spark.register(spark)            # or spark.dataSource.register(LoglakeDataSource)
    df = spark.read.format("loglake").option("path", data_dir).option("subscribe", "t").load()

pyspark, pyarrow and numpy are imported only when the data source itself is used:
`loglake.spark.options` and `loglake.spark.plan` are plain Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loglake.spark.source import LoglakeDataSource

__all__ = ["LoglakeDataSource", "register"]


def register(spark: Any) -> None:
    """Register the `loglake` format on a SparkSession (once per session: calling it again does
    nothing)."""
    from loglake.spark.source import register as register_source

    register_source(spark)


def __getattr__(name: str) -> Any:
    if name == "LoglakeDataSource":
        from loglake.spark.source import LoglakeDataSource

        return LoglakeDataSource
    raise AttributeError(f"module 'loglake.spark' has no attribute {name!r}")
