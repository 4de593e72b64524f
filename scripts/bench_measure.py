"""The measurements of `make bench` (scripts/bench.py): each `bench_*` function measures one figure and returns
what `bench_render` needs, as JSON-ready values; `save` keeps them under bench-data/results/.

Compaction runs are separate processes (`scripts/bench_run.py`: a fresh SparkSession each, so memory peaks are
their own) on throwaway copies of a pristine store; the figure of an end-to-end run is the median of `RUNS`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import crc32c
from bench_workloads import (
    DATA,
    NOW_MS,
    P4_FRACTION,
    P4_KEYS,
    P4_SEGMENT,
    P4_SWEEP,
    P8_FRACTION,
    ROOT,
    base_segments,
    bulk,
    cardinality_args,
    copy_store,
    e2e_args,
    generate,
    kafka_workload,
    log_bytes,
    records_per_segment,
    rolled,
    rolled_logs,
    tiered,
    warm,
)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, Python {platform.python_version()}, {platform.system()}"


def bench_scan(min_bytes: int) -> dict[str, object]:
    """P1: scan MB/s vs raw read + CRC-32C MB/s over the same segment files, one core."""
    from compaction.format.scan import scan_segment

    parts = 8
    records = max(1, min_bytes // (parts * 150))
    args = [
        "--topics",
        f"scan:{parts}",
        "--records",
        str(records),
        "--keys",
        "200000",
        "--value-bytes",
        "80",
        "--records-per-batch",
        "100",
        "--segment-bytes",
        str(128 * 2**20),
        "--codecs",
        "none",
        "--transactional-ratio",
        "0",
        "--tombstone-ratio",
        "0.02",
        "--seed",
        "7",
    ]
    logdir = generate(f"scan-{records}", *args)
    files = sorted(logdir.glob("*/*.log"))
    total = sum(f.stat().st_size for f in files)
    scan_segment(files[0].read_bytes())  # compile (or load) the kernels before timing

    def raw() -> int:
        return read_with_crc(files)

    def scan() -> int:
        n = 0
        for f in files:
            n += scan_segment(f.read_bytes(), obj=str(f)).records.num_rows
        return n

    raw()  # page cache warm for both
    best_raw = min(_timed(raw) for _ in range(3))
    rows = scan()
    best_scan = min(_timed(scan) for _ in range(3))
    return {
        "bytes": total,
        "records": rows,
        "files": len(files),
        "raw_mb_s": total / best_raw / 1e6,
        "scan_mb_s": total / best_scan / 1e6,
        "scan_records_s": rows / best_scan,
        "ratio": best_raw / best_scan,
        "workload": " ".join(args),
    }


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def raw_crc_mb_s(files: list[Path]) -> float:
    """Reading `files` and computing their CRC-32C on one core, page cache warm: best of 2, MB/s. The reference
    the P2 figures are stated against, measured beside them since this machine's speed drifts day to day."""
    total = read_with_crc(files)
    return total / min(_timed(lambda: read_with_crc(files)) for _ in range(2)) / 1e6


def read_with_crc(files: list[Path]) -> int:
    """Read every file and compute its CRC-32C (what a reader that checks every byte must do); the bytes read."""
    n = 0
    for f in files:
        data = f.read_bytes()
        crc32c.crc32c(data)
        n += len(data)
    return n


def compaction(store: Path, *options: str) -> dict[str, Any]:
    """One run of `scripts/bench_run.py` (a fresh process and SparkSession) on `store`: its JSON figures, plus
    `process_seconds`, the whole process's wall time (interpreter, JVM and Python workers started, the run)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_run.py"), str(store), "--now-ms", str(NOW_MS), *options]
    print("running:", " ".join(cmd[1:]), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    process_seconds = time.perf_counter() - started
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = process_seconds
    if result.get("errors") or result.get("committed") != result.get("partitions"):
        raise SystemExit(f"compaction of {store} failed: {result.get('errors')}")
    print("  ", {k: result.get(k) for k in ("phases", "bytes_read", "fetch_ratio", "memory_peak_bytes")},
          file=sys.stderr)
    return result


RUNS = 3
"""Runs per end-to-end figure: each a fresh process on a fresh copy; the figure is the run of median wall time.
This machine's speed drifts by up to ~1.5x within minutes (a session start of 9-18 s in one hour), so a single
run says as much about the moment as about the code."""


def _wall(phases: dict[str, float]) -> float:
    return phases["plan"] + phases["stage"] + phases["commit"]


def compaction_of_copy(pristine: Path, *options: str, runs: int = RUNS, again: int = 0
                       ) -> tuple[dict[str, Any], float]:
    """`compaction` `runs` times, each on a throwaway copy of `pristine` (page cache warm): the figures of the
    run of median wall time (plan + stage + commit), with every run's wall time in `run_walls`, and that wall
    time. With `again`, each process then compacts `again` more copies in its session (`bench_run.py --again`):
    their walls, over every process, in `again_walls`, and the median of them in `again_wall`."""
    done, later = [], []
    for _ in range(runs):
        warm(pristine)  # the copy is hard links: the same pages
        extra = [a for i in range(again) for a in ("--again", str(copy_store(pristine, f"run-again-{i}")))]
        run = compaction(copy_store(pristine, "run"), *options, *extra)
        for name in ["run", *(f"run-again-{i}" for i in range(again))]:
            shutil.rmtree(pristine.parent / name, ignore_errors=True)
        done.append((_wall(run["phases"]), run))
        later += [_wall(a["phases"]) for a in run.get("again", [])]
    done.sort(key=lambda d: d[0])
    wall, median = done[len(done) // 2]
    median["run_walls"] = [round(w, 2) for w, _r in done]
    if later:
        later.sort()
        median["again_walls"] = [round(w, 2) for w in later]
        median["again_wall"] = later[len(later) // 2]
    return median, wall


KCOMPACT = Path(sys.executable).parent / "kcompact"
"""The console script users run (`pip install`'s entry point in the project's venv)."""


def cli_processes(pristine: Path, settings: dict[str, str], runs: int = RUNS,
                  env: dict[str, str] | None = None, kcompact: Path = KCOMPACT) -> dict[str, Any]:
    """`kcompact compact` as users run it on a schedule: `runs` fresh processes, each on a fresh copy of `pristine`
    (page cache warm), with kcompact's own session defaults. The first process is its own figure (nothing of a
    previous run in it but the page cache), then the median of all of them; bytes read from the run's report.
    `env` replaces the process's environment (default: this one's)."""
    config = pristine.parent / "cli-config.yaml"
    config.write_text("defaults:\n" + "".join(f"  {k}: {v}\n" for k, v in {"cleanup.policy": "compact",
                                                                            **settings}.items()))
    seconds, bytes_read = [], []
    for _ in range(runs):
        warm(pristine)
        store = copy_store(pristine, "cli")
        report = pristine.parent / "cli-report.json"
        cmd = [str(kcompact), "compact", "--store", str(store), "--config", str(config), "--now", str(NOW_MS),
               "--report-json", str(report)]
        print("running:", " ".join(cmd), file=sys.stderr)
        started = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env or dict(os.environ))
        seconds.append(time.perf_counter() - started)
        doc = json.loads(report.read_text())
        if doc.get("failed") or not all(p["committed"] for p in doc["partitions"]):
            raise SystemExit(f"`kcompact compact` of {store} failed: {doc.get('failed')}")
        bytes_read.append(doc["bytes_read"])
        shutil.rmtree(store, ignore_errors=True)
    median = sorted(seconds)[len(seconds) // 2]
    return {"command": " ".join(["kcompact", *cmd[1:]]).replace(str(pristine.parent), "$W"), "seconds": seconds,
            "first_seconds": seconds[0], "median_seconds": median, "bytes_read": bytes_read[0],
            "first_mb_s": bytes_read[0] / seconds[0] / 1e6, "mb_s": bytes_read[0] / median / 1e6}


SPARK_ALONE = ("from pyspark.sql import SparkSession; s = SparkSession.builder.master('local[2]').getOrCreate(); "
               "s.range(1).count(); s.stop()")
"""Spark's own start: a session, one trivial job, stop: what any Spark application pays before its work."""


def spark_alone(runs: int = RUNS) -> list[float]:
    """The whole-process seconds of `SPARK_ALONE`, `runs` times."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", SPARK_ALONE], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - started)
    return seconds


SMALL_SCALE = 1 / 128
"""P0's share of P2's uncompressed workload: ~10 MB of segments, all dirty (a small scheduled run)."""


def bench_small(scale: float = 1.0) -> list[dict[str, Any]]:
    """P0 (issue 27 b): a small run, ~10 MB all dirty, as fresh `kcompact compact` processes vs Spark's own start
    (`spark_alone`), alternated so both see the same machine; on two shapes (P2's generator, 8 partitions, and
    P2K's kafka-python writer, 2 partitions)."""
    bulk_args = e2e_args(SMALL_SCALE * scale, "none")
    kp_logdir, kp_args, _seconds = kafka_workload(SMALL_SCALE * scale)
    shapes = [("kcompact generate --bulk " + " ".join(bulk_args), bulk(f"small-{bulk_args[3]}", *bulk_args)),
              ("python scripts/kafka_workload.py " + " ".join(kp_args), kp_logdir)]
    out = []
    for workload, logdir in shapes:
        pristine = tiered(logdir, logdir.name)
        cli: list[dict[str, Any]] = []
        plain: list[dict[str, Any]] = []
        alone: list[float] = []
        settings = {"min.cleanable.dirty.ratio": "0.01"}
        for _ in range(RUNS):  # alternated: this machine's speed drifts within minutes
            alone += spark_alone(1)
            cli.append(cli_processes(pristine, settings, runs=1))
            plain.append(cli_processes(pristine, settings, runs=1, env={**os.environ, "KCOMPACT_CDS": "0"}))
        seconds = [c["seconds"][0] for c in cli]
        without = [c["seconds"][0] for c in plain]
        out.append({"workload": workload, "command": cli[0]["command"], "input_bytes": log_bytes(logdir),
                    "bytes_read": cli[0]["bytes_read"], "seconds": seconds,
                    "median_seconds": sorted(seconds)[len(seconds) // 2], "no_cds_seconds": without,
                    "no_cds_median_seconds": sorted(without)[len(without) // 2], "spark_seconds": alone,
                    "spark_median_seconds": sorted(alone)[len(alone) // 2]})
    return out


def throughput(run: dict[str, Any], wall: float, raw_mb_s: float) -> dict[str, Any]:
    """The P2 figures of a run: MB/s without session start-up, for the whole process, and as a share of raw."""
    mb_s = run["bytes_read"] / wall / 1e6
    return {"wall_seconds": wall, "mb_s": mb_s, "process_mb_s": run["bytes_read"] / run["process_seconds"] / 1e6,
            "raw_mb_s": raw_mb_s, "raw_share": mb_s / raw_mb_s}


def bench_e2e(codec: str, scale: float = 1.0, profile: bool = False, partitions: int = 8) -> dict[str, Any]:
    """P2 (and P5's points, P6's runs): a compaction of the tiered workload at the defaults (but
    min.cleanable.dirty.ratio 0.01), the median of `RUNS`; input MB/s over its wall time, and the raw read +
    CRC-32C reference."""
    args = e2e_args(scale, codec, partitions)
    name = f"e2e-{codec}-{args[3]}" if partitions == 8 else f"hot{partitions}-{codec}-{args[3]}"
    logdir = bulk(name, *args)
    pristine = tiered(logdir, name)
    cli = cli_processes(pristine, {"min.cleanable.dirty.ratio": "0.01"})  # first: its first process is the first run
    run, wall = compaction_of_copy(pristine, "--min-dirty-ratio", "0.01")
    raw = raw_crc_mb_s(rolled_logs(logdir))
    map_profile = None
    if profile:  # where the map phase goes, on the same segments (nothing committed)
        cmd = [sys.executable, str(ROOT / "scripts" / "bench_run.py"), str(pristine), "--now-ms", str(NOW_MS),
               "--profile-map"]
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        map_profile = json.loads(done.stdout.strip().splitlines()[-1])["map_profile"]
    return {"workload": " ".join(args), "command": "kcompact generate --bulk " + " ".join(args), "codec": codec,
            "scale": scale, "input_bytes": log_bytes(logdir), "map_profile": map_profile, **run,
            **throughput(run, wall, raw), "cli": cli}


def bench_kafka_shape(scale: float) -> dict[str, Any]:
    """P2K: the second P2 shape, written by kafka-python, compacted with only cleanup.policy set."""
    logdir, args, seconds = kafka_workload(scale)
    pristine = tiered(logdir, logdir.name)
    cli = cli_processes(pristine, {})
    run, wall = compaction_of_copy(pristine)
    return {"cli": cli, "workload": " ".join(args), "command": "python scripts/kafka_workload.py " + " ".join(args),
            "generation_seconds": seconds, "input_bytes": log_bytes(logdir),
            "rebuilt_indexes": json.loads((pristine / ".complete").read_text()).get("rebuilt_indexes"), **run,
            **throughput(run, wall, raw_crc_mb_s(rolled_logs(logdir)))}


def bench_hot(scale: float, spread: dict[str, Any] | None) -> dict[str, Any]:
    """P6: P2's uncompressed records and keys in one partition vs over 8 (P2's own run)."""
    return {"hot": bench_e2e("none", scale, partitions=1), "spread": spread or bench_e2e("none", scale)}


def bench_cardinality(keys: int, scale: float = 1.0) -> dict[str, Any]:
    """P3: `keys` distinct keys (every key once, then 50% more updates), small values; memory peaks.

    Every key's first record lies in a rolled (tiered) segment; the run's `dirty_keys` counts them."""
    args = cardinality_args(keys, 8, scale)
    name = f"card-{keys}-{args[args.index('--segment-bytes') + 1]}"
    run, wall = compaction_of_copy(tiered(bulk(name, *args), name), "--min-dirty-ratio", "0.01",
                                   "--driver-memory", "6g", runs=1)  # memory peaks: one run says it
    return {"workload": " ".join(args), "keys": keys, "wall_seconds": wall, **run}


def verify_on_spark() -> bool:
    """Whether `kcompact verify` runs on Spark yet (`verify_partition` takes `spark=`)."""
    import inspect

    from compaction.verify import verify_partition

    return "spark" in inspect.signature(verify_partition).parameters


def bench_verify(keys: int, scale: float = 1.0) -> dict[str, Any]:
    """P7 (goal f): `kcompact verify` of one partition of `keys` keys after a run, on Spark, with the
    driver's peak RSS. Until verify takes `spark=`, the section says so and gives the command."""
    args = cardinality_args(keys, 1, scale)
    name = f"verify-{keys}-{args[args.index('--segment-bytes') + 1]}"
    command = ("kcompact generate --bulk " + " ".join(args) + "; kcompact tier; kcompact compact --report-json R; "
               "kcompact verify --store S --topic verify --partition 0 --before <R's metadata_version_planned>")
    if not verify_on_spark():
        return {"measured": False, "keys": keys, "command": command}
    store = copy_store(tiered(bulk(name, *args), name), "run")
    run = compaction(store, "--min-dirty-ratio", "0.01", "--driver-memory", "6g")
    check = _verify(store, run["metadata_version_planned"])
    shutil.rmtree(store, ignore_errors=True)
    return {"measured": True, "keys": keys, "command": command, "run": run, **check}


def _verify(store: Path, before: int) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_run.py"), str(store), "--now-ms", str(NOW_MS),
           "--verify", "verify:0", "--before", str(before), "--driver-memory", "6g"]
    print("running:", " ".join(cmd[1:]), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "process_seconds": time.perf_counter() - started}


def bench_skipping(keys_per_partition: int = P4_KEYS, segment_bytes: int = P4_SEGMENT) -> dict[str, Any]:
    """P4 at the defaults (no bloom.filter.fpp): round 1 compacts a base where every key appears once; then 1% of
    the keys (a contiguous range of ids per partition) are updated and round 2 runs. Bytes fetched by round 2 vs
    the bound of goal (b): dirty bytes + clean segments that really hold an updated key + 2% of the clean
    region; and the bytes read from the cleaned region (clean segments rewritten + filters)."""
    from compaction.format.scan import scan_segment
    from compaction.metadata import ObjectSuffix, table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    per_segment = records_per_segment(400, 100, segment_bytes)
    keys = (keys_per_partition // per_segment) * per_segment  # the base ends on a segment boundary
    args = ["--topics", "skip:2", "--records", str(keys), "--keys", str(keys), "--key-order", "sequential",
            "--value-bytes", "400", "--records-per-batch", "100", "--segment-bytes", str(segment_bytes),
            "--codecs", "none", "--tombstone-ratio", "0", "--update-fraction", str(P4_FRACTION),
            "--update-spread", "clustered", "--seed", "3"]
    name = f"skip-{keys}"
    full = bulk(name, *args)
    base = base_segments(full, keys)  # and the first update segment (active: not tiered)
    topic_config = ["--topic-config", f"segment.bytes={segment_bytes}"]
    pristine = tiered(base, f"{name}-default")
    store_dir = copy_store(pristine, "run")
    first = compaction(store_dir, "--min-dirty-ratio", "0.01", *topic_config)
    store = open_store(str(store_dir))
    table = table_in_store(store)
    tier_logdir(rolled(full), store, table, NOW_MS - 86_400_000)
    clean = {p: [s for s in table.live_segments("skip", p) if s.end_offset < keys] for p in (0, 1)}
    dirty_bytes = sum(s.segment_size_bytes for p in (0, 1) for s in table.live_segments("skip", p)
                      if s.start_offset >= keys)
    updated = {p: _updated_keys(full / f"skip-{p}", keys) for p in (0, 1)}
    clean_keys = {p: [(s, scan_segment(store.get(s.object_key(ObjectSuffix.LOG) or "")).records["key"])
                      for s in clean[p]] for p in (0, 1)}
    clean_bytes = sum(s.segment_size_bytes for p in (0, 1) for s in clean[p])
    overlap = sum(s.segment_size_bytes for p in (0, 1) for s, k in clean_keys[p] if _holds(k, updated[p]))
    second = compaction(store_dir, "--min-dirty-ratio", "0.001", *topic_config)
    shutil.rmtree(store_dir, ignore_errors=True)
    fpps = sorted({x["filter_fpp"] for x in first["per_partition"] if x.get("filter_fpp")})
    return {
        "workload": " ".join(args), "fpp": fpps[0] if fpps else None, "keys": 2 * keys,
        "dirty_per_partition": int(P4_FRACTION * keys), "clean_bytes": clean_bytes, "dirty_bytes": dirty_bytes,
        "clean_segments": sum(len(c) for c in clean.values()), "overlap_bytes": overlap,
        "read_bytes": second["clean_bytes_rewritten"] + second["filter_bytes_read"],
        "fetched_bytes": second["requests"]["bytes_read"],
        "bound_bytes": dirty_bytes + overlap + 0.02 * clean_bytes,
        "first": first, "second": second,
        "sweep": _sweep(clean_keys, updated, clean_bytes, overlap, tuple(fpps[:1]) + P4_SWEEP),
    }


def _updated_keys(part: Path, keys: int) -> Any:
    """The keys of the records at offsets >= `keys` (the updates), as an Arrow array."""
    import pyarrow as pa

    from compaction.format.scan import scan_segment

    chunks = []
    for log in sorted(part.glob("*.log")):
        records = scan_segment(log.read_bytes()).records
        chunks.append(records.filter(pa.compute.greater_equal(records["offset"], keys))["key"])
    return pa.chunked_array([c.cast(pa.binary()) for chunk in chunks for c in chunk.chunks], pa.binary()
                            ).combine_chunks()


def _holds(segment_keys: Any, updated: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.is_in(segment_keys.cast("binary"), value_set=updated)).as_py())


def _sweep(clean_keys: dict[int, list[Any]], updated: dict[int, Any], clean_bytes: int, overlap: int,
           rates: tuple[float, ...]) -> list[dict[str, Any]]:
    """The same clean segments and updated keys, filters rebuilt at each rate in the process: share of the
    clean region read (segments testing positive + every filter), clustered and random 1% updates."""
    import numpy as np

    from compaction.bloom.filter import KeyFilter
    from compaction.bloom.hashing import key_hashes

    rng = np.random.default_rng(9)
    hashed = {p: [(s, key_hashes(k)) for s, k in segs] for p, segs in clean_keys.items()}
    randoms = {}
    for p, segs in hashed.items():  # a random 1% of the partition's keys, for the spread-out case
        every = np.concatenate([h for _s, h in segs])
        randoms[p] = rng.choice(every, size=len(updated[p]), replace=False)
    rows = []
    for fpp in rates:
        row: dict[str, Any] = {"fpp": fpp}
        for spread, dirty in (("clustered", {p: key_hashes(u) for p, u in updated.items()}), ("random", randoms)):
            read = filters = truly = 0
            for p, segs in hashed.items():
                for s, h in segs:
                    f = KeyFilter.build(h, fpp)
                    filters += len(f.to_bytes())
                    if f.positives(dirty[p]) > 0:
                        read += s.segment_size_bytes
                    if np.isin(dirty[p], h).any():
                        truly += s.segment_size_bytes
            row[spread] = {"read": (read + filters) / clean_bytes, "overlap": truly / clean_bytes,
                           "filters": filters / clean_bytes}
        rows.append(row)
    return rows


def bench_scaling(scale: float, p2: dict[str, Any] | None) -> dict[str, Any]:
    """P5: the P2 (uncompressed) workload at 1/16 and 1/4 of its size, and P2's own run as the 16x point."""
    points = [bench_e2e("none", scale / 16), bench_e2e("none", scale / 4), p2 or bench_e2e("none", scale)]
    return {"points": points}


def _table_run(store: Path, topic: str, table: Path, now_ms: int) -> dict[str, Any]:
    """One `kcompact table` process: its JSON report plus `process_seconds`."""
    config = DATA / "table-config.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n")
    cmd = [sys.executable, "-m", "compaction.cli", "table", "--store", str(store), "--config", str(config),
           "--topic", topic, "--table", str(table), "--now", str(now_ms), "--json"]
    print("running:", " ".join(cmd[1:]), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    report: dict[str, Any] = json.loads(done.stdout)
    report["process_seconds"] = time.perf_counter() - started
    print("  ", report["seconds"], report["segment_bytes_read"], file=sys.stderr)
    return report


def _warm_table_runs(store: Path, topic: str, before: Path, now_ms: int) -> dict[str, Any]:
    """In one fresh process, after `bench_run.warm_up` (a long-lived session's Python workers and kernels): a rebuild
    into a scratch table, then the same update `P8_UPDATES` times, each of a fresh copy of `before` (the table as the
    rebuild left it); each run's wall (`total`), the updates' median as `update_seconds`. The first update in a
    session pays for what the rebuild did not use yet (reading table files, writing vectors) as well."""
    code = ("import sys, json, shutil; sys.path.insert(0, sys.argv[4]); from bench_run import warm_up; "
            "from compaction import table; from compaction.config import KcompactConfig, TopicConfig; "
            "from compaction.spark.session import build_session; from compaction.storage import open_store; "
            "s = build_session(); warm_up(s, 2); st = open_store(sys.argv[1]); "
            "c = KcompactConfig(defaults=TopicConfig.from_kafka({'cleanup.policy': 'compact'})); "
            "scratch = sys.argv[3] + '-scratch'; shutil.rmtree(scratch, ignore_errors=True); "
            "r = table(s, st, c, sys.argv[2], scratch, now_ms=int(sys.argv[5])).seconds['total']; "
            "u = []\n"
            "for _ in range(int(sys.argv[6])):\n"
            "    shutil.rmtree(scratch); shutil.copytree(sys.argv[3], scratch)\n"
            "    u.append(table(s, st, c, sys.argv[2], scratch, now_ms=int(sys.argv[5])).seconds['total'])\n"
            "shutil.rmtree(scratch); "
            "print(json.dumps({'rebuild_seconds': r, 'update_walls': u, 'update_seconds': sorted(u)[len(u) // 2]}))")
    done = subprocess.run([sys.executable, "-c", code, str(store), topic, str(before),
                           str(Path(__file__).resolve().parent), str(now_ms), str(P8_UPDATES)], check=True,
                          stdout=subprocess.PIPE, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _input_path(kind: str, store: Path, topic: str, from_offset: int) -> dict[str, Any]:
    """`bench_run.input_path_seconds` in a fresh process: the first job's seconds and the next three's."""
    code = ("import sys, json, os; sys.path.insert(0, sys.argv[5]); from pathlib import Path; "
            "from bench_run import input_path_seconds; "
            "r = input_path_seconds(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])); "
            "print(json.dumps(r)); sys.stdout.flush(); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", code, kind, str(store), topic, str(from_offset),
                           str(Path(__file__).resolve().parent)], check=True, stdout=subprocess.PIPE, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


P8_REBUILDS = 3
"""Fresh `kcompact table` processes per shape rebuilding the table; the median one is the figure (one fresh process
varies by about 15% on the 2-core machine)."""

P8_UPDATES = 3
"""Updates per shape, each of a fresh copy of the table the rebuild left: fresh processes (the median one is the
figure), and as many in one warm session."""


def bench_table(partitions: int, keys_per_partition: int, value_bytes: int, segment_bytes: int,
                scale: float = 1.0) -> dict[str, Any]:
    """P8: a full rebuild of the table from a base where every key appears once (>= 1.1 GB), then an update after
    1% of the keys were rewritten (tiered as new segments). MB/s = segment bytes the run read / its wall time.
    No tombstones: the base must end on a segment boundary, which `records_per_segment` computes for one record
    size."""
    from compaction.metadata import table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    segment_bytes = max(2**16, int(segment_bytes * scale))
    per_segment = records_per_segment(value_bytes, 100, segment_bytes)
    keys = max(per_segment, int(keys_per_partition * scale) // per_segment * per_segment)
    topic = f"tbl{partitions}"
    args = ["--topics", f"{topic}:{partitions}", "--records", str(keys), "--keys", str(keys), "--key-order",
            "sequential", "--value-bytes", str(value_bytes), "--records-per-batch", "100", "--segment-bytes",
            str(segment_bytes), "--codecs", "none", "--tombstone-ratio", "0", "--update-fraction",
            str(P8_FRACTION), "--update-spread", "random", "--seed", "17"]
    name = f"table-{partitions}x{keys}-{value_bytes}"
    full = bulk(name, *args)
    pristine = tiered(base_segments(full, keys), f"{name}-base")
    tier_end = table_in_store(open_store(str(pristine))).live_segments(topic, 0)[-1].end_offset + 1
    if tier_end != keys:
        raise SystemExit(f"P8: the base of {name} is tiered up to offset {tier_end}, not {keys}: the update would "
                         "read more than the 1%")
    store_dir = copy_store(pristine, "table-run")
    table = store_dir.parent / "table"
    rebuilds = []
    for _ in range(P8_REBUILDS):  # a rebuild reads the store and writes a new table: each on an empty one
        shutil.rmtree(table, ignore_errors=True)
        rebuilds.append(_table_run(store_dir, topic, table, NOW_MS))
    walls = [r["seconds"]["total"] for r in rebuilds]
    median = sorted(rebuilds, key=lambda r: r["seconds"]["total"])[len(rebuilds) // 2]
    last = rebuilds[-1]  # its table is the one the update then runs on
    rebuild = {**median, "walls": walls, "process_walls": [r["process_seconds"] for r in rebuilds],
               "files_added": last["files_added"], "bytes_written": last["bytes_written"]}
    store = open_store(str(store_dir))
    tier_logdir(rolled(full), store, table_in_store(store), NOW_MS - 86_400_000)
    before = table.parent / "table-before-update"
    shutil.rmtree(before, ignore_errors=True)
    shutil.copytree(table, before)
    updates = []
    for _ in range(P8_UPDATES):
        shutil.rmtree(table, ignore_errors=True)
        shutil.copytree(before, table)
        updates.append(_table_run(store_dir, topic, table, NOW_MS + 1))
    update = {**sorted(updates, key=lambda r: r["seconds"]["total"])[len(updates) // 2],
              "walls": [r["seconds"]["total"] for r in updates],
              "process_walls": [r["process_seconds"] for r in updates]}
    warm = _warm_table_runs(store_dir, topic, before, NOW_MS + 1)
    shutil.rmtree(before, ignore_errors=True)
    segments = table_in_store(open_store(str(pristine))).live_segments(topic, 0)
    tail = segments[len(segments) * 7 // 8:] if partitions == 1 else segments  # ~1/8 of the base either way
    read = _input_path("read", pristine, topic, tail[0].start_offset)
    scan = _input_path("scan", pristine, topic, tail[0].start_offset)
    partition_bytes = sum(s.segment_size_bytes for s in tail)
    shutil.rmtree(store_dir, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    return {"workload": " ".join(args), "command": "kcompact generate --bulk " + " ".join(args),
            "partitions": partitions, "keys": keys * partitions, "rebuild": rebuild, "update": update, "warm": warm,
            "read_partition": {"read": read, "scan": scan, "bytes": partition_bytes}}


def save(results: Path, figure: str, result: Any) -> None:
    results.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (results / f"{figure}.json").write_text(json.dumps({"measured": now, "machine": machine(), "result": result}))
