"""The delta-spark reader tests run from `make delta-readers-test` only (KCOMPACT_DELTA_READERS_TEST=1).

They need .venv-delta and .delta-jars (`scripts/delta_readers_runtime.sh`: pyspark 4.2.0 and delta-spark apart
from the project venv, whose pyspark 4.3 no delta-spark supports, and ~700 MB of jars), so `make test` leaves
them out (skipped, with the reason) and `.ci/run` runs them as a step of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from compaction.spark.session import build_session
from tests.moto_s3 import FAKE_AWS_ENV, UNSET_AWS_ENV
from tests.opt_in import skip_unless_enabled


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_unless_enabled(items, env="KCOMPACT_DELTA_READERS_TEST", folder="delta_readers",
                        why="reads with delta-spark from .venv-delta: run `make delta-readers-test`")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The project's Spark (pyspark 4.3), which writes the tables; its workers see fake AWS credentials only."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in FAKE_AWS_ENV.items():
            env.setenv(name, value)
        for name in UNSET_AWS_ENV:
            env.delenv(name, raising=False)
        session = build_session("local[2]", "kcompact-delta-readers", {"spark.driver.memory": "1g"})
        yield session
        session.stop()
