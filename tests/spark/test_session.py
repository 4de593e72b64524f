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
from pyspark.sql import SparkSession

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


CDS_SCRIPT = """
import sys
from compaction.spark.session import build_session
spark = build_session()
pid = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getPid()
with open(f"/proc/{pid}/maps") as maps:
    mapped = sys.argv[1] in maps.read()
print(spark.range(10).count(), mapped)
spark.stop()
"""


@pytest.mark.spark
def test_a_built_session_starts_its_jvm_from_the_class_data_sharing_archive() -> None:
    """The archive `make cds` writes (written here if missing) is mapped by the JVM a session launches, and not
    with KCOMPACT_CDS=0; the session works either way and says nothing about it on stderr."""
    from compaction.prebuild.cds import build
    from compaction.spark import cds

    archive = build()
    assert archive is not None and archive.is_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY") and k not in (
        "SPARK_MASTER", cds.ENABLED)}
    for setting, mapped in ((None, "True"), ("0", "False")):
        run_env = env if setting is None else {**env, cds.ENABLED: setting}
        done = subprocess.run([sys.executable, "-c", CDS_SCRIPT, str(archive)], cwd=REPO, env=run_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["10", mapped], (setting, done.stdout, done.stderr)
        assert [line for line in done.stderr.splitlines() if line.strip() and line != INCUBATOR_WARNING] == []


def test_the_archive_options_are_added_only_when_nothing_decides_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from compaction.spark import cds

    monkeypatch.setenv("KCOMPACT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cds.ENABLED, raising=False)
    assert cds.session_options("-Dx=1") == "-Dx=1"  # no archive yet
    archive = cds.archive_path()
    assert archive is not None and archive.parent == tmp_path
    archive.write_bytes(b"an archive")
    assert cds.session_options("-Dx=1") == f"-Dx=1 -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    assert cds.session_options("") == f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    for decided in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=/new.jsa"):
        assert cds.session_options(decided) == decided
    monkeypatch.setenv(cds.ENABLED, "0")
    assert cds.session_options("-Dx=1") == "-Dx=1"


def test_a_reinstalled_pyspark_gets_an_archive_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JVM refuses an archive whose class-path jars changed modification time, without a word: a pyspark
    reinstalled at the same path with the same jars (a fresh CI checkout's venv, under a kept ~/.cache) must not
    find the old archive under the same name."""
    import pyspark

    from compaction.spark import cds

    monkeypatch.setenv("KCOMPACT_CACHE_DIR", str(tmp_path / "cache"))
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    jar = jars / "spark-core.jar"
    jar.write_bytes(b"classes")
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "pyspark" / "__init__.py"))
    first = cds.archive_path()
    assert first is not None and cds.archive_path() == first
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    assert cds.archive_path() != first
    second = cds.archive_path()
    assert second is not None and cds.stale_archives(second) == []
    first.parent.mkdir()
    first.write_bytes(b"the archive of the jars before")
    elsewhere = first.parent / "spark-driver-0.0.0-0123456789abcdef-0123456789abcdef.jsa"
    elsewhere.write_bytes(b"another install's archive")
    earlier_scheme = first.parent / "spark-driver-4.3.0-230becbfd04ae650.jsa"
    earlier_scheme.write_bytes(b"an archive named before the jars' times were in its name")
    assert cds.stale_archives(second) == sorted([first, earlier_scheme])


@pytest.mark.spark
def test_the_shared_session_writes_and_merges_delta_with_delta_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 42 item 1: every session kcompact launches has delta-spark's jars and SQL extension (`make delta`,
    compaction/spark/delta.py): a Delta table written, MERGEd into and read back in the tests' shared session."""
    from delta.tables import DeltaTable

    uri = str(tmp_path / "t")
    spark.range(4).write.format("delta").save(uri)
    (DeltaTable.forPath(spark, uri).alias("t").merge(spark.range(2, 6).alias("s"), "t.id = s.id")
     .whenNotMatchedInsertAll().execute())
    assert sorted(r["id"] for r in spark.read.format("delta").load(uri).collect()) == list(range(6))
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
