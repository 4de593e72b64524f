"""Small driver-side tables as DataFrames, built on the JVM.

`SparkSession.createDataFrame` of a Python list pickles the rows through a Python task (an RDD map run by Python
workers) before the JVM reads them; in a fresh application that job forks new Python workers, a large part of a
run's fixed cost when it happens per call. Handed an Arrow table instead, Spark reads the Arrow stream in the
JVM: no Python task at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: str | StructType) -> DataFrame:
    """`rows` (tuples in `schema`'s column order) as a DataFrame, converted through Arrow on the driver."""
    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    assert isinstance(struct, StructType)
    arrow = to_arrow_schema(struct)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in struct.fields]
    table = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, arrow, strict=True)], schema=arrow)
    return spark.createDataFrame(table, struct)


__all__ = ["local_frame"]
