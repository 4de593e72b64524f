"""The test session lent to the CLI, which stops the session it builds: one that must outlive the call."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


class BorrowedSession:
    """Forwards everything to the shared test SparkSession except `stop`, which does nothing."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def stop(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)
