"""The class-data-sharing archive of the Spark driver JVM that kcompact launches: where it is, the options using it.

A fresh `kcompact compact` process starts a JVM that loads and verifies some 20,000 classes of Spark, Arrow and
Scala, most of them on the way to its first query. JDK class data sharing (AppCDS, JEP 350) maps them from an
archive written by an earlier JVM instead: `make cds` runs `python -m compaction.prebuild.cds`, which compacts a
small generated topic in a JVM started with `-XX:ArchiveClassesAtExit`, and every session that
`compaction.spark.session` launches afterwards starts with `-XX:SharedArchiveFile` (measured in BENCHMARKS.md, P0).

An archive is only valid for the JVM and the class path that wrote it (the JVM checks each jar's size and
modification time), so its file name is a hash of the java binary, its version and the jars of the pyspark install
and of delta-spark (compaction/spark/delta.py) with their sizes and modification times (`archive_path`): a
reinstalled pyspark, even the same release at the same path, finds no archive until `make cds` writes its own (and
deletes the one it replaces) instead of a stale one that the JVM would skip; a JVM that finds the archive unusable
anyway starts without it (`-Xshare:auto`, the default), with the warning silenced. Under spark-submit the JVM runs
before Python does, and a cluster's executors start their own: there the archive is the deployment's choice
(`spark.driver.extraJavaOptions` / `spark.executor.extraJavaOptions`).

Set KCOMPACT_CDS=0 to start sessions without it. The archive is ~160 MB under KCOMPACT_CACHE_DIR (default
~/.cache/kcompact).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

ENABLED = "KCOMPACT_CDS"
"""0 in the environment: sessions start without the archive, and `build` writes none."""

QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""The JVM's class-data-sharing messages off: an unusable archive, classes it cannot archive (signed jars)."""

USE_OPTIONS = "-XX:SharedArchiveFile={path} " + QUIET
"""The driver JVM's options to start from the archive: an unusable one is skipped without a word."""

WRITE_OPTION = "-XX:ArchiveClassesAtExit="
JVM_ARCHIVE_OPTIONS = ("-XX:SharedArchiveFile", WRITE_OPTION, "-Xshare")
"""Java options that already decide about class data sharing: a session given one of them is left as it is."""


def cache_dir() -> Path:
    return Path(os.environ.get("KCOMPACT_CACHE_DIR") or Path.home() / ".cache" / "kcompact")


def java_binary() -> Path | None:
    """The java spark-submit runs (`bin/spark-class`: JAVA_HOME's, else the one on PATH), resolved; None if none."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(p) if (p := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def archive_path() -> Path | None:
    """Where the archive for this java and this pyspark install is (or would be); None without a java.

    Its name is `spark-driver-<version>-<install>-<jars>.jsa`: <install> hashes the java binary (path, time) and
    where pyspark's jars are, <jars> their names, sizes and modification times, which the JVM checks."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    from compaction.spark import delta

    jars = Path(pyspark.__file__).parent / "jars"
    on_class_path = [*jars.glob("*.jar"), *delta.jars()]
    files = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in on_class_path)
    return cache_dir() / f"{_install_prefix(java, jars)}{_digest(files)}.jsa"


def stale_archives(path: Path) -> list[Path]:
    """The other archives of the install `path` is for (written for its jars before they were reinstalled), and
    those named by kcompact's earlier scheme (`spark-driver-<version>-<hash>.jsa`, never looked up again)."""
    prefix = path.name[:path.name.rindex("-") + 1]
    mine = set(path.parent.glob(f"{prefix}*.jsa"))
    earlier = {p for p in path.parent.glob("spark-driver-*.jsa")
               if re.fullmatch(r"spark-driver-[^-]+-[0-9a-f]{16}\.jsa", p.name)}
    return sorted((mine | earlier) - {path})


def _install_prefix(java: Path, jars: Path) -> str:
    import pyspark

    return f"spark-driver-{pyspark.__version__}-{_digest([str(java), str(java.stat().st_mtime_ns), str(jars)])}-"


def _digest(parts: list[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def session_options(java_options: str) -> str:
    """`java_options` plus the archive's options, when the archive exists and nothing in them decides otherwise."""
    if os.environ.get(ENABLED) == "0" or any(o in java_options for o in JVM_ARCHIVE_OPTIONS):
        return java_options
    path = archive_path()
    if path is None or not path.is_file():
        return java_options
    return f"{java_options} {USE_OPTIONS.format(path=path)}".strip()
