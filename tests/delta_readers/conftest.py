"""delta-spark reads kcompact's tables in `make test`: pyspark 4.2 with delta-spark is the project's own runtime,
its jars resolved by `make delta` into .delta-jars. The writing side uses the shared session of tests/spark/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.moto_s3 import FAKE_AWS_ENV, UNSET_AWS_ENV
from tests.spark.conftest import fake_worker_credentials, spark  # noqa: F401


@pytest.fixture(scope="module")
def fake_aws_everywhere(spark: SparkSession) -> Iterator[None]:  # noqa: F811
    """Fake AWS credentials (and no AWS config files) in this process and in the Spark Python workers started
    from now on, for a module's writes to the moto server; both environments are restored afterwards."""
    with pytest.MonkeyPatch.context() as patch, fake_worker_credentials(spark):
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        for name in UNSET_AWS_ENV:
            patch.delenv(name, raising=False)
        yield
