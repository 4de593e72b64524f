"""One measured compaction run, in a fresh process (its own SparkSession, so memory peaks are its own).

`scripts/bench.py` tiers a workload into a pristine store once, hard-links a copy per run and calls

    python scripts/bench_run.py STORE_DIR --now-ms T [--fpp P] [--min-dirty-ratio R] [--topic-config K=V] [--cores N]
                                [--shuffle] [--again STORE_DIR]...

which plans, stages and commits one run in Spark local mode and prints one JSON object on stdout: the wall
time of each phase (session start, plan, stage = map + rewrite, commit), executor task time summed over
tasks (scan, download, rewrite, upload), bytes and records read and written, the filter figures, the
report's `fetch_ratio` and per-partition counters (rewrite tasks, segments scanned, cache hits, needed bytes),
and the peak resident memory of the Python driver, of the JVM (driver and executor in local mode) and of the
Spark Python workers together, sampled from /proc every 0.2 s. Options left out are left unset in the
config: the run uses kcompact's defaults (Kafka's, and filters sized from the data). Each `--again` store (another
copy of the same pristine store) is then compacted in the same session, as a notebook's or a long-lived driver's
next run is: the phases and task times of each such run in `again` (the memory peaks cover every run).

    python scripts/bench_run.py STORE_DIR --now-ms T --profile-map
    python scripts/bench_run.py STORE_DIR --now-ms T --verify TOPIC:PARTITION --before VERSION

time the map phase's parts as separate Spark jobs (nothing committed), or run `kcompact verify` of one
partition on the session (when `compaction.verify.verify_partition` takes `spark=`) with the same sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class MemorySampler(threading.Thread):
    """Peak RSS of this process (the driver), the JVM it launched and the JVM's Python workers (summed)."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peaks = {"driver_python": 0, "jvm": 0, "python_workers": 0}
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        while not self._stop_event.is_set():
            tree = _children()
            jvms = [p for p in tree.get(me, []) if _comm(p) == "java"]
            workers, stack = 0, list(jvms)
            while stack:
                pid = stack.pop()
                for child in tree.get(pid, []):
                    stack.append(child)
                    if _comm(child).startswith("python"):
                        workers += _rss(child)
            self.peaks["driver_python"] = max(self.peaks["driver_python"], _rss(me))
            self.peaks["jvm"] = max(self.peaks["jvm"], sum(_rss(j) for j in jvms))
            self.peaks["python_workers"] = max(self.peaks["python_workers"], workers)
            self._stop_event.wait(self.interval)

    def stop(self) -> dict[str, int]:
        self._stop_event.set()
        self.join()
        return self.peaks


def warm_up(spark: Any, cores: int) -> None:
    """Start every Python worker and load the numba kernels in it (what a long-lived executor already has):
    one tiny segment scanned, ranked, filtered, rewritten and decoded for a consumer (`read_partition`'s path)
    per task. Loading means compiling them when the checkout's numba cache is cold (a fresh clone or worktree):
    without the rewrite's and the filter's kernels here, the first measured run compiled them (P2's uncompressed
    run, the first of `make bench`, lost 2-3 s)."""

    def scan_tiny(batches: Any) -> Any:
        import numpy as np

        from compaction.bloom.segment import segment_filter
        from compaction.config import CompactionStrategy
        from compaction.format.batch import Record, build_batch, encode_batch
        from compaction.format.scan import scan_records, scan_segment
        from compaction.rewrite.group import SegmentInput, rewrite_group
        from compaction.strategies.winner import segment_best

        segment = encode_batch(build_batch([Record(0, 0, b"k", b"v", ()), Record(1, 0, b"k", b"w", ())]))
        scanned = scan_segment(segment)
        for strategy in CompactionStrategy:
            segment_best(scanned.records, (), strategy)
        segment_filter(scanned, 0.01)
        rewrite_group([SegmentInput(segment, 0, "warm-up")], np.array([1], np.int64), upper_bound_offset=2,
                      now_ms=0, delete_retention_ms=0)
        list(scan_records(segment).consumer_batches(np.arange(2)))
        yield from batches

    spark.range(0, cores, numPartitions=cores).mapInArrow(scan_tiny, "id long").collect()


def planned_scans(store: Any, config: Any, *, force: bool = False, only: tuple[str, int] | None = None,
                  from_offset: int = 0) -> tuple[Any, list[Any], dict[Any, int]]:
    """What a run's scan reads in `store` under `config`: the plan's eligible partitions (only `only`, from its
    segment starting at `from_offset`, if given) as `compaction.spark.scan.scan_rows` takes them: the scan's
    settings, its segments and each partition's index."""
    from compaction.metadata import table_in_store
    from compaction.run.plan import plan
    from compaction.run.stage import partition_work
    from compaction.spark.scan import ScanSettings

    run = plan(store, config, NOW_MS, force=force)
    table = table_in_store(store)
    works = [partition_work(run, p, table.partition_snapshot(p.topic, p.partition).topic_id or "", 2**50, None)
             for p in run.plan.eligible if only is None or (p.topic, p.partition) == only]
    scans = [s for w in works for s in w.scans if s.start_offset >= from_offset]
    return ScanSettings.of(run.store, [w.task for w in works]), scans, {w.tp: i for i, w in enumerate(works)}


def profile_map(spark: Any, store_dir: Path) -> dict[str, Any]:
    """The map phase of a run over `store_dir`, taken apart: each step a Spark job of its own, timed warm.

    scan: segments read, decoded and ranked on the Python workers, per-segment best per key, rows handed to
    the JVM (counted); aggregate: + Spark's hash aggregate and shuffle to one row per key (materialised);
    persist: + caching the result, as `stage` does. The differences are what each step costs.
    """
    from pyspark.sql import functions as F

    from compaction.config import KcompactConfig, TopicConfig
    from compaction.spark.scan import ScanTracker, scan_rows
    from compaction.spark.winners import best_per_key
    from compaction.storage import open_store

    config = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                             "min.cleanable.dirty.ratio": "0.01"}))
    settings, scans, index_of = planned_scans(open_store(str(store_dir)), config)
    tracker = spark.sparkContext.accumulator({}, ScanTracker())
    rows = scan_rows(spark, settings, scans, index_of, tracker)
    best = best_per_key(rows, settings.by_offset)
    out: dict[str, Any] = {"segments": len(scans)}

    def timed(name: str, job: Any) -> Any:
        started = time.perf_counter()
        value = job()
        out[name] = time.perf_counter() - started
        return value

    out["rows_to_jvm"] = timed("scan", rows.count)
    out["task_scan"] = sum(v.scan_task_ms for v in tracker.value.values()) / 1000
    timed("aggregate", lambda: best.select(F.max("offset"), F.max("dirty")).collect())
    out["keys"] = best.count()
    cached = best.persist()
    timed("persist", lambda: cached.groupBy("tp").agg(F.sum(F.col("dirty").cast("long"))).collect())
    cached.unpersist()
    return out


NOW_MS = 1_800_000_000_000


def input_path_seconds(kind: str, store_dir: Path, topic: str, from_offset: int, again: int = 3) -> dict[str, Any]:
    """In a fresh session (its start not counted): the same read of partition 0 from `from_offset` (where a segment
    starts) as Spark jobs, first and then `again` times, each timed from building the DataFrame to the end of its
    `count()`.

    kind "read": `read_partition(..., isolation='read_committed')`, every record decoded with its value and headers
    and handed to Spark (the table's input path); kind "scan": the compaction's scan of the same segments
    (`compaction.spark.scan.scan_rows`: decoded, each task's best record per key handed to Spark), its plan made
    before the clock starts. The first job pays the session's Python workers and their kernels, as a fresh process's
    first job does."""
    from compaction.spark.session import build_session
    from compaction.storage import open_store

    spark = build_session("local[2]", "kcompact-bench")
    store = open_store(str(store_dir))
    if kind == "read":
        from compaction.spark.read import read_partition

        def job() -> int:
            return read_partition(spark, store, topic, 0, from_offset=from_offset,
                                  isolation="read_committed").count()
    else:
        from compaction.config import KcompactConfig, TopicConfig
        from compaction.spark.scan import ScanTracker, scan_rows

        config = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}))
        settings, scans, index_of = planned_scans(store, config, force=True, only=(topic, 0), from_offset=from_offset)

        def job() -> int:
            tracker = spark.sparkContext.accumulator({}, ScanTracker())
            return scan_rows(spark, settings, scans, index_of, tracker).count()

    walls = []
    for _ in range(1 + again):
        started = time.perf_counter()
        job()
        walls.append(time.perf_counter() - started)
    return {"first": walls[0], "again": walls[1:]}


def verify_run(spark: Any, store_dir: Path, target: str, before: int) -> dict[str, Any]:
    """`kcompact verify` of one partition on `spark` (goal f): its wall time and verdict."""
    from compaction.storage import open_store
    from compaction.verify import verify_partition

    topic, _sep, partition = target.rpartition(":")
    started = time.perf_counter()
    on_spark: dict[str, Any] = {"spark": spark}  # the keyword exists once verify runs on Spark (bench.py checks)
    report = verify_partition(open_store(str(store_dir)), topic, int(partition), before, **on_spark)
    return {"verify_seconds": time.perf_counter() - started, "verify_ok": report.ok, "verify_keys": report.keys_before}


def run_figures(report: dict[str, Any], staged: Any) -> dict[str, Any]:
    """The figures `scripts/bench.py` reads, from the run report (and the staged run for the filter rates)."""
    parts = report["partitions"]
    fpps = {(sp.plan.topic, sp.plan.partition): sp.filter_fpp for sp in staged.partitions}
    return {
        "map_seconds": report["time_split_seconds"]["map"],
        "rewrite_seconds": report["time_split_seconds"]["rewrite"],
        "task_seconds": report["task_seconds"],
        "partitions": len(parts),
        "committed": sum(1 for p in parts if p["committed"]),
        "errors": [p["error"] for p in parts if p["error"]],
        "metadata_version_planned": report["metadata_version_planned"],
        "bytes_read": report["bytes_read"],
        "bytes_written": report["bytes_written"],
        "records_read": sum(p["records_read"] for p in parts),
        "records_written": sum(p["records_written"] for p in parts),
        "dirty_keys": sum(p["stats"].get("dirty_keys", 0) for p in parts),
        "clean_segments": sum(p["stats"].get("clean_segments", 0) for p in parts),
        "segments_skipped": report["segments_skipped"],
        "bytes_not_downloaded": report["bytes_not_downloaded"],
        "false_positive_segments": sum(p["stats"].get("bloom_segment_false_positives", 0) for p in parts),
        "segments_merged": sum(p["stats"].get("segments_merged", 0) for p in parts),
        "clean_bytes_rewritten": sum(p["stats"].get("clean_bytes_rewritten", 0) for p in parts),
        "filter_bytes_read": sum(p["stats"].get("filter_bytes_read", 0) for p in parts),
        "requests": report["requests"],
        "fetch_ratio": report.get("fetch_ratio"),
        "needed_bytes": sum(p["stats"].get("needed_bytes", 0) for p in parts),
        "per_partition": [{
            "tp": f"{p['topic']}-{p['partition']}",
            "fetch_ratio": p.get("fetch_ratio"),
            "filter_fpp": fpps.get((p["topic"], p["partition"])),
            **{k: p["stats"].get(k, 0) for k in ("rewrite_tasks", "chunks", "segments_scanned", "cache_hits",
                                                 "needed_bytes", "store_bytes_read")},
        } for p in parts],
    }


def topic_config(args: argparse.Namespace) -> Any:
    """The run's config: cleanup.policy compact and the options given, every other one at kcompact's default."""
    from compaction.config import KcompactConfig, TopicConfig

    settings = {"cleanup.policy": "compact", **dict(kv.split("=", 1) for kv in args.topic_config)}
    if args.min_dirty_ratio is not None:
        settings["min.cleanable.dirty.ratio"] = str(args.min_dirty_ratio)
    if args.fpp is not None:
        settings["bloom.filter.fpp"] = str(args.fpp)
    return KcompactConfig(defaults=TopicConfig.from_kafka(settings))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path)
    parser.add_argument("--fpp", type=float, default=None, help="bloom.filter.fpp (default: unset, sized from data)")
    parser.add_argument("--now-ms", type=int, required=True)
    parser.add_argument("--min-dirty-ratio", type=float, default=None,
                        help="min.cleanable.dirty.ratio (default: unset, Kafka's 0.5)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--profile-map", action="store_true",
                        help="instead of a run: time the map phase's parts as separate Spark jobs (nothing committed)")
    parser.add_argument("--verify", metavar="TOPIC:PARTITION",
                        help="instead of a run: `kcompact verify` of this partition on Spark (needs --before)")
    parser.add_argument("--before", type=int, help="--verify: the metadata version before the run")
    parser.add_argument("--topic-config", action="append", default=[], metavar="NAME=VALUE",
                        help="a Kafka topic config for every topic (repeatable), e.g. segment.bytes=16777216")
    parser.add_argument("--again", action="append", default=[], type=Path, metavar="STORE_DIR",
                        help="after the run, compact this store too in the same session (repeatable)")
    parser.add_argument("--shuffle", action="store_true",
                        help="the one job always shuffles its rows (the fused job off: compaction.spark.fused), for "
                             "an A/B of the two")
    args = parser.parse_args()
    if args.shuffle:
        import compaction.spark.fused as fused

        fused.fits = lambda *_a: False  # type: ignore[assignment]

    sampler = MemorySampler()
    sampler.start()
    started = time.perf_counter()
    from compaction.run.commit import commit
    from compaction.run.plan import plan
    from compaction.run.report import run_report
    from compaction.run.stage import stage
    from compaction.spark.session import build_session
    from compaction.storage import open_store

    spark = build_session(f"local[{args.cores}]", "kcompact-bench", {"spark.driver.memory": args.driver_memory})
    warm_up(spark, args.cores)  # JVM, Python workers and their numba kernels up: start-up is not the run's time
    phases: dict[str, float] = {"session": time.perf_counter() - started}
    if args.profile_map:
        print(json.dumps({"phases": phases, "map_profile": profile_map(spark, args.store)}))
        sys.stdout.flush()
        os._exit(0)
    if args.verify:
        figures = verify_run(spark, args.store, args.verify, args.before)
        print(json.dumps({"phases": phases, **figures, "memory_peak_bytes": sampler.stop()}))
        sys.stdout.flush()
        os._exit(0)
    config = topic_config(args)
    store = open_store(str(args.store))
    t = time.perf_counter()
    run = plan(store, config, args.now_ms)
    phases["plan"] = time.perf_counter() - t
    t = time.perf_counter()
    staged = stage(spark, run)
    phases["stage"] = time.perf_counter() - t
    t = time.perf_counter()
    outcomes = commit(staged)
    phases["commit"] = time.perf_counter() - t
    figures = run_figures(run_report(staged, outcomes).to_dict(), staged)
    again = []
    for other in args.again:
        store = open_store(str(other))
        t = time.perf_counter()
        run = plan(store, config, args.now_ms)
        planned = time.perf_counter()
        staged = stage(spark, run)
        staged_at = time.perf_counter()
        outcomes = commit(staged)
        done = time.perf_counter()
        later = run_figures(run_report(staged, outcomes).to_dict(), staged)
        if later["errors"] or later["committed"] != later["partitions"]:
            raise SystemExit(f"compaction of {other} failed: {later['errors']}")
        again.append({"phases": {"plan": planned - t, "stage": staged_at - planned, "commit": done - staged_at},
                      "task_seconds": later["task_seconds"], "bytes_read": later["bytes_read"]})
    print(json.dumps({"phases": phases, **figures, "again": again, "memory_peak_bytes": sampler.stop()}))
    sys.stdout.flush()
    os._exit(0)  # deltalake may abort the interpreter at exit (see compaction.cli)


if __name__ == "__main__":
    sys.exit(main())
