"""Building a SparkSession: called by `jobs/`, the CLI and the test fixture, never at import time."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
}


def build_session(
    master: str | None = None, app_name: str = "kcompact", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create the SparkSession; `master` defaults to local[2] unless launched by spark-submit.

    Workers must run this interpreter (pyarrow, numba and kcompact live in its environment), so
    PYSPARK_PYTHON defaults to `sys.executable`.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_MASTER" in os.environ
    if master or not under_submit:  # spark-submit passes its --master through the gateway: keep it
        builder = builder.master(master or "local[2]")
    for key, value in {**LOCAL_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
