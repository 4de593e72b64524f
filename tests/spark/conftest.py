"""One local[2] SparkSession for the whole test session (chispa's habit): Spark costs seconds per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from compaction.spark.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[2]", "kcompact-tests", {"spark.driver.memory": "1g"})
    yield session
    session.stop()
