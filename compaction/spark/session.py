"""Building a SparkSession: called by `jobs/`, the CLI and the test fixture, never at import time.

Logging: a session this module launches hands Spark's JVM kcompact's log4j2 configuration
(`conf/log4j2.properties`: WARN and above, known noise at ERROR) before the JVM starts, so a run's stderr
opens with kcompact's own lines rather than Spark's start-up banner. Under spark-submit the JVM is already
running when Python starts: there the configuration is spark-submit's to pass (`conf/spark-defaults.conf`).
One JVM line stays: "WARNING: Using incubator modules: jdk.incubator.vector". Spark's launcher always adds
`--add-modules=jdk.incubator.vector` to the driver's command line, and the JVM prints that warning for any
resolved incubator module, with no option to turn it off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from compaction.spark import cds, delta

REQUIRED: dict[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}
"""What kcompact's data path relies on (Arrow transfers, UTC, reused Python workers), set in every session."""

WORKER_HUGE_PAGES = "spark.executorEnv.NUMPY_MADVISE_HUGEPAGE"
NO_HUGE_PAGE_REQUESTS = "0"
"""The Python workers' numpy does not ask the kernel for transparent huge pages (numpy's default is to `madvise`
every array of 4 MiB or more). Where the kernel's THP mode is `madvise` (Debian's and Ubuntu's default), each such
request made every fault of a fresh array take and zero a whole 2 MiB page, and the run's short-lived arrays (a
segment's decoded columns, a fold's table) were faulted again after each was freed: on a 2-core VM, a compaction of
one 537 MB partition faulted 7 GB of huge pages and spent more time in the kernel than in its own code; without the
requests its stage took 16-18 s instead of 29-31 s, the other shapes measured took 15-55% less (BENCHMARKS.md, P10).
Where the kernel's mode is `always` the kernel still uses huge pages as it decides; only the explicit requests go."""

DAEMON_MODULE = "spark.python.daemon.module"
"""The daemon forking the Python workers: pyspark's, importing pyspark from its installed package rather than from the
zip of its sources Spark puts first on the workers' path (`compaction.spark.daemon`)."""

LOCAL_DEFAULTS: dict[str, str] = {
    **REQUIRED,
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    WORKER_HUGE_PAGES: NO_HUGE_PAGE_REQUESTS,
    DAEMON_MODULE: "compaction.spark.daemon",
}
"""A session this module launches itself (local mode, notebooks): sized for one machine. Under spark-submit only
`REQUIRED` applies, so the sizing and UI of `--conf` / `--properties-file` (conf/spark-defaults.conf) stand."""

LOG4J2_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "log4j2.properties"
"""kcompact's log4j2 configuration, in the checkout's `conf/` (absent from an install without it: see below)."""

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
LOG4J2_PROPERTY = "-Dlog4j2.configurationFile="

QUICK_JIT = "-XX:TieredStopAtLevel=1"
"""The driver JVM of `kcompact compact` compiles with C1 alone: what a compaction asks of the driver's JVM (moving
Arrow buffers, the one job's plan, a shuffle of folds for a hot partition) never runs long enough for C2's compiles
to pay back the CPU they take from a 2-core machine while it starts. Measured (docs/operating.md, "Bytecode"): a
fresh compaction of P2K 8.7 s against 10.0 s; the hot partition's stage, the shape that moves most through the JVM,
unchanged in session. Notebooks and the other commands keep the JVM's default."""


def build_session(
    master: str | None = None,
    app_name: str = "kcompact",
    conf: Mapping[str, str] | None = None,
    log4j2_config: Path | None = LOG4J2_CONFIG,
    driver_options: str = "",
) -> SparkSession:
    """Get or create the SparkSession; `master` defaults to local[2] unless launched by spark-submit.

    Workers must run this interpreter (pyarrow, numba and kcompact live in its environment), so
    PYSPARK_PYTHON defaults to `sys.executable`.

    Args:
        master: Spark master URL; None keeps spark-submit's, or local[2] outside spark-submit.
        app_name: the application's name.
        conf: Spark settings, applied over `LOCAL_DEFAULTS` (under spark-submit: over `REQUIRED` only, so that
            spark-submit's own settings are kept).
        log4j2_config: the log4j2 file for a JVM this call launches (default: `conf/log4j2.properties`);
            None, a missing file, or a `-Dlog4j2.configurationFile` already in `conf`'s
            spark.driver.extraJavaOptions leave Spark's logging as configured elsewhere. Ignored when the
            JVM already runs (spark-submit, or an earlier session of this process).
        driver_options: JVM options added to a driver JVM this call launches (e.g. `QUICK_JIT`); ignored under
            spark-submit and when a session already runs.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_MASTER" in os.environ
    if master or not under_submit:  # spark-submit passes its --master through the gateway: keep it
        builder = builder.master(master or "local[2]")
    settings = {**(REQUIRED if under_submit else LOCAL_DEFAULTS), **(conf or {})}
    if not under_submit and log4j2_config is not None and log4j2_config.is_file():
        settings[DRIVER_JAVA_OPTIONS] = with_log4j2_config(settings.get(DRIVER_JAVA_OPTIONS, ""), log4j2_config)
    if not under_submit:
        settings = delta.local_options(settings)
    if not under_submit and SparkSession.getActiveSession() is None:
        if driver_options:
            settings[DRIVER_JAVA_OPTIONS] = f"{settings.get(DRIVER_JAVA_OPTIONS, '')} {driver_options}".strip()
        options = cds.session_options(settings.get(DRIVER_JAVA_OPTIONS, ""))
        if options:
            settings[DRIVER_JAVA_OPTIONS] = options
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def with_log4j2_config(java_options: str, config: Path) -> str:
    """`java_options` plus `-Dlog4j2.configurationFile=<config as a file: URI>`, unless it names one already.

    A URI needs no quoting in Spark's option string, whatever characters the path holds.
    """
    if LOG4J2_PROPERTY in java_options:
        return java_options
    return f"{java_options} {LOG4J2_PROPERTY}{config.resolve().as_uri()}".strip()
