"""One local[2] SparkSession for the whole test session (chispa's habit): Spark costs seconds per session.

`new_store` gives the end-to-end tests their stores, once per backend: every test that takes it runs on a
local directory and again on S3 (the moto server of `tests/moto_s3.py`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.spark.session import build_session
from compaction.storage import ObjectStore, open_store
from tests.moto_s3 import FAKE_AWS_ENV, fresh_s3_store


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[2]", "kcompact-tests", {"spark.driver.memory": "1g"})
    yield session
    session.stop()


@contextlib.contextmanager
def fake_worker_credentials(spark: SparkSession) -> Iterator[None]:
    """Fake AWS credentials in the environment of the Spark Python workers started from now on (as on a
    cluster, where workers find real ones in theirs); the previous environment is restored afterwards."""
    env = spark.sparkContext.environment
    saved = {k: env.get(k) for k in FAKE_AWS_ENV}
    env.update(FAKE_AWS_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v


@pytest.fixture
def workers_see_fake_credentials(spark: SparkSession) -> Iterator[None]:
    """`fake_worker_credentials` for one test."""
    with fake_worker_credentials(spark):
        yield


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], ObjectStore]:
    """A fresh, empty store per call: a local directory, or a fresh prefix of the moto bucket."""
    if request.param == "local":
        n = itertools.count()
        return lambda: open_store(str(tmp_path / f"store-{next(n)}"))
    endpoint: str = request.getfixturevalue("moto_endpoint")
    request.getfixturevalue("fake_aws_env")
    request.getfixturevalue("workers_see_fake_credentials")
    return lambda: fresh_s3_store(endpoint)
