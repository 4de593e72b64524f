"""A session from `build_session` starts quietly: Spark's JVM prints no banner and no WARN lines on stderr.

The shared test session cannot show it (its JVM is already running, with the test process's stderr), so a
fresh interpreter builds one, counts a range and stops, and the test reads that process's stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from compaction.spark.session import build_session
spark = build_session()
print(spark.range(10).count())
spark.stop()
"""
# Spark's launcher always adds --add-modules=jdk.incubator.vector; the JVM then prints this, unconditionally.
INCUBATOR_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"


@pytest.mark.spark
def test_a_built_session_logs_no_banner_and_no_warnings() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY") and k != "SPARK_MASTER"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "10"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert not any("Using Spark's default log4j profile" in line for line in lines), done.stderr
    assert not any("Setting default log level" in line for line in lines), done.stderr
    assert not any(" WARN " in line or " INFO " in line for line in lines), done.stderr
    assert [line for line in lines if line != INCUBATOR_WARNING] == [], done.stderr
