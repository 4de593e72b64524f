"""Write the class-data-sharing archive of the Spark driver JVM (`compaction.spark.cds`): `make cds` runs
`python -m compaction.prebuild.cds`, which does nothing when the archive for this java and pyspark exists."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compaction.spark.cds import ENABLED, QUIET, WRITE_OPTION, archive_path, stale_archives


def build(force: bool = False) -> Path | None:
    """Write the archive unless it exists (or `force`): a child process compacts a small generated topic in a JVM
    that writes its loaded classes at exit. The archive's path, or None when there is no java or KCOMPACT_CDS=0."""
    path = archive_path()
    if path is None or os.environ.get(ENABLED) == "0":
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compaction.prebuild.cds", "--write", str(partial)], check=True)
    if not partial.is_file() or partial.stat().st_size == 0:
        raise RuntimeError(f"the training JVM wrote no class-data-sharing archive at {partial}")
    partial.replace(path)
    for stale in stale_archives(path):  # a JVM still mapping one keeps its pages
        stale.unlink(missing_ok=True)
    print(f"Spark driver class-data-sharing archive: {path} ({path.stat().st_size / 2**20:.0f} MiB, "
          f"{time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return path


def _train(archive: Path) -> None:
    """In this process: a session whose JVM writes `archive` at exit, one small compaction and a consumer read on
    it, then the JVM's exit (its standard input closed, as when Python ends) waited for."""
    from pyspark import SparkContext

    import compaction
    from compaction.generate import WorkloadSpec, generate_logdir
    from compaction.generate.topics import TopicSpec
    from compaction.metadata import table_in_store
    from compaction.spark.session import build_session
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    with tempfile.TemporaryDirectory(prefix="kcompact-cds-") as tmp:
        work = Path(tmp)
        generate_logdir(work / "log", WorkloadSpec(topics=(TopicSpec("cds", 2),), records_per_partition=4000,
                                                   keys=300, segment_bytes=64 * 1024, seed=5))
        store = open_store(str(work / "store"))
        now_ms = int(time.time() * 1000)
        tier_logdir(work / "log", store, table_in_store(store, create=True), now_ms)
        config = work / "kcompact.yaml"
        config.write_text("defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n")
        spark = build_session(app_name="kcompact-cds",
                              conf={"spark.driver.extraJavaOptions": f"{WRITE_OPTION}{archive} {QUIET}"})
        compaction.compact(spark, str(work / "store"), str(config), now_ms=now_ms)
        compaction.read_partition(spark, str(work / "store"), "cds", 0).count()
        spark.stop()
        gateway = SparkContext._gateway
        if gateway is not None and getattr(gateway, "proc", None) is not None:
            gateway.proc.stdin.close()
            gateway.proc.wait(timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="write the archive again even if it exists")
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)  # the training child's archive
    args = parser.parse_args()
    if args.write is not None:
        _train(args.write)
        sys.stdout.flush()
        os._exit(0)  # deltalake may abort the interpreter at exit (see compaction.cli)
    try:
        path = build(force=args.force)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # an optimization: never what stops a setup
        print(f"kcompact: no class-data-sharing archive ({e}); Spark sessions start without it", file=sys.stderr)
        return 0
    print(path if path is not None else "no archive: no java found, or KCOMPACT_CDS=0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
