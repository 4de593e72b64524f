"""`make bench`: measured figures written to BENCHMARKS.md, each side by side with its reference and target.

The goals (a-f), each from one `make bench` run:
(a) fetch ratio: the run report's `fetch_ratio` (bytes fetched / bytes of segments + filters the run had to
    read) of every compaction run below, per shape. Target <= 1.05.
(b) P4 skipping at the defaults (no bloom.filter.fpp): 1% of the keys updated after a compacted round; bytes
    fetched by round 2 vs dirty bytes + clean segments really holding an updated key + 2% of the clean region;
    plus the filter rate sweep on the same segments.
(c) P2 on two shapes: `kcompact generate --bulk` (uncompressed and lz4), and P2K, 2 partitions of 64 MiB
    segments with random keys written by kafka-python (`scripts/kafka_workload.py`). MB/s with session
    start-up excluded, the whole process, and the share of raw read + CRC-32C of the same bytes (one core,
    measured in the same run). Targets >= 100 MB/s and >= 6% (P2), >= 80 MB/s and >= 5% (P2K).
(d) P6 one hot partition: >= 1 GiB in one partition vs the same bytes over 8 partitions (P2's run). Target
    >= 80% of its MB/s; the report's rewrite_tasks.
(e) P5 scaling: the P2 workload at 1/16, 1/4 and 1 of its size; the intercept of a + b*MB is the fixed cost
    per run. Target a <= 4 s (and the points within 15% of linear).
(f) P7 verify at scale: `kcompact verify` of a >= 5 M-key partition on Spark, driver peak RSS; measured once
    `compaction.verify.verify_partition` takes `spark=`, else reported as not measured with its command.
Also P1 (scan vs raw read + CRC-32C, one core) and P3 (5 M / 20 M / 50 M keys, memory).

Workloads are cached under bench-data/ (keyed by their options); each compaction run is a fresh process
(`scripts/bench_run.py`) on a hard-linked copy of a store tiered once. Figures are kept per benchmark under
bench-data/results/, so `--only P4` refreshes one section of BENCHMARKS.md and keeps the others (each says when
it was measured). `--quick` shrinks every workload (~1/64) to check the harness end to end in a few minutes:
its data, results and report go under bench-data/quick/, never to BENCHMARKS.md.
Never part of `make test`: timings belong here, not in unit tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench-data"
RESULTS = DATA / "results"
NOW_MS = 1_800_000_000_000
START_MS = 1_700_000_000_000  # generated timestamps start at 1.7e12: everything is old enough to clean
KAFKA_MB_S = 16.5  # Kafka's cleaner on a 25.7 GB production partition, as reported by its operators
QUICK = 1 / 64  # --quick: every workload at this share of its size


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


def generate(name: str, *args: str) -> Path:
    """Generate (once) a log dir with `kcompact generate` and the given options."""
    logdir = DATA / name
    if not (logdir / ".complete").exists():
        # pinned first timestamp: the data stays older than NOW_MS whenever it is generated (the default is the
        # wall clock, which would pass NOW_MS and make the data "in the future")
        cmd = [sys.executable, "-m", "compaction.cli", "generate", "--logdir", str(logdir),
               "--start-ms", str(START_MS), *args]
        print("generating:", " ".join(cmd[2:]), file=sys.stderr)
        subprocess.run(cmd, check=True)
        (logdir / ".complete").write_text(" ".join(args))
    return logdir


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



# --- workloads and runs ------------------------------------------------------------------------------------


def bulk(name: str, *args: str) -> Path:
    """`kcompact generate --bulk` once per name (the name must change with the options)."""
    return generate(name, "--bulk", *args)


def rolled_logs(logdir: Path) -> list[Path]:
    """The .log files a tier run uploads (every partition's active, highest segment stays local)."""
    return [f for part in sorted(p for p in logdir.iterdir() if p.is_dir()) for f in sorted(part.glob("*.log"))[:-1]]


def log_bytes(logdir: Path) -> int:
    return sum(f.stat().st_size for f in rolled_logs(logdir))


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


def tiered(logdir: Path, name: str) -> Path:
    """A store holding `logdir` tiered (once, cached): the pristine copy runs are hard-linked from."""
    from compaction.metadata import table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    pristine = DATA / "stores" / name / "pristine"
    if not (pristine / ".complete").exists():
        shutil.rmtree(pristine, ignore_errors=True)
        store = open_store(str(pristine))
        print(f"tiering {logdir.name} into {pristine}", file=sys.stderr)
        results = tier_logdir(logdir, store, table_in_store(store, create=True), NOW_MS - 86_400_000)
        errors = [r.error for r in results if r.error]
        if errors:
            raise SystemExit(f"tiering {logdir} failed: {errors}")
        (pristine / ".complete").write_text(json.dumps({"rebuilt_indexes": sum(r.rebuilt_indexes for r in results)}))
    return pristine


def copy_store(pristine: Path, name: str) -> Path:
    """A private copy of a store: hard links (objects and Delta files are never modified in place)."""
    target = pristine.parent / name
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", str(pristine), str(target)], check=True)
    return target


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


def warm(store: Path) -> None:
    """Read every file of `store` once, so that a run reads its objects from the page cache, as the raw read +
    CRC-32C reference does: the figures measure kcompact, not the machine's disk (on S3 the fetch is in the
    report's requests)."""
    for f in store.rglob("*"):
        if f.is_file():
            with f.open("rb") as src:
                while src.read(8 << 20):
                    pass


RUNS = 3
"""Runs per end-to-end figure: each a fresh process on a fresh copy; the figure is the run of median wall time.
This machine's speed drifts by up to ~1.5x within minutes (a session start of 9-18 s in one hour), so a single
run says as much about the moment as about the code."""


def compaction_of_copy(pristine: Path, *options: str, runs: int = RUNS) -> tuple[dict[str, Any], float]:
    """`compaction` `runs` times, each on a throwaway copy of `pristine` (page cache warm): the figures of the
    run of median wall time (plan + stage + commit), with every run's wall time in `run_walls`, and that wall
    time."""
    done = []
    for _ in range(runs):
        warm(pristine)  # the copy is hard links: the same pages
        run = compaction(copy_store(pristine, "run"), *options)
        shutil.rmtree(pristine.parent / "run", ignore_errors=True)
        done.append((run["phases"]["plan"] + run["phases"]["stage"] + run["phases"]["commit"], run))
    done.sort(key=lambda d: d[0])
    wall, median = done[len(done) // 2]
    median["run_walls"] = [round(w, 2) for w, _r in done]
    return median, wall


def throughput(run: dict[str, Any], wall: float, raw_mb_s: float) -> dict[str, Any]:
    """The P2 figures of a run: MB/s without session start-up, for the whole process, and as a share of raw."""
    mb_s = run["bytes_read"] / wall / 1e6
    return {"wall_seconds": wall, "mb_s": mb_s, "process_mb_s": run["bytes_read"] / run["process_seconds"] / 1e6,
            "raw_mb_s": raw_mb_s, "raw_share": mb_s / raw_mb_s}


def e2e_args(scale: float, codec: str, partitions: int = 8) -> list[str]:
    """P2/P5's workload at `scale` (1 = the >= 1 GiB one): 8 partitions, ~110-byte values, ~4.5 versions per
    key, segments scaled with the data so every partition has the same number of them. `partitions` = 1 puts
    the same records and keys in one partition (P6)."""
    records = int((1_600_000 if codec == "none" else 2_000_000) * scale) * 8 // partitions
    keys = max(1, int(300_000 * scale)) * 8 // partitions
    return [
        "--topics", f"e2e:{partitions}" if partitions == 8 else f"hot:{partitions}", "--records", str(records),
        "--keys", str(keys), "--key-order", "uniform", "--value-bytes", "100", "--records-per-batch", "200",
        "--segment-bytes", str(int(32 * 2**20 * scale)), "--codecs", codec, "--tombstone-ratio", "0.01",
        "--seed", "11",
    ]


def bench_e2e(codec: str, scale: float = 1.0, profile: bool = False, partitions: int = 8) -> dict[str, Any]:
    """P2 (and P5's points, P6's runs): a compaction of the tiered workload at the defaults (but
    min.cleanable.dirty.ratio 0.01), the median of `RUNS`; input MB/s over its wall time, and the raw read +
    CRC-32C reference."""
    args = e2e_args(scale, codec, partitions)
    name = f"e2e-{codec}-{args[3]}" if partitions == 8 else f"hot{partitions}-{codec}-{args[3]}"
    logdir = bulk(name, *args)
    pristine = tiered(logdir, name)
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
            **throughput(run, wall, raw)}


KAFKA_SHAPE = {"partitions": 2, "records": 4_000_000, "keys": 1_000_000, "segment_bytes": 64 * 2**20}


def kafka_workload(scale: float) -> tuple[Path, list[str], float]:
    """P2K's log dir, written once by kafka-python (`scripts/kafka_workload.py`): its path, options and the
    seconds its generation took."""
    records = max(1000, int(KAFKA_SHAPE["records"] * scale))
    args = ["--topic", "kp", "--partitions", str(KAFKA_SHAPE["partitions"]), "--records", str(records),
            "--keys", str(max(100, int(KAFKA_SHAPE["keys"] * scale))), "--key-bytes", "16", "--value-bytes", "100",
            "--records-per-batch", "200", "--segment-bytes", str(max(2**16, int(KAFKA_SHAPE["segment_bytes"] * scale))),
            "--seed", "13"]
    logdir = DATA / f"kp-{KAFKA_SHAPE['partitions']}x{records}"
    marker = logdir / ".complete"
    if not marker.exists():
        shutil.rmtree(logdir, ignore_errors=True)
        print("generating with kafka-python:", " ".join(args), file=sys.stderr)
        started = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "scripts" / "kafka_workload.py"), "--logdir", str(logdir), *args],
                       check=True)
        marker.write_text(json.dumps({"args": args, "seconds": time.perf_counter() - started}))
    return logdir, args, float(json.loads(marker.read_text())["seconds"])


def bench_kafka_shape(scale: float) -> dict[str, Any]:
    """P2K: the second P2 shape, written by kafka-python, compacted with only cleanup.policy set."""
    logdir, args, seconds = kafka_workload(scale)
    pristine = tiered(logdir, logdir.name)
    run, wall = compaction_of_copy(pristine)
    return {"workload": " ".join(args), "command": "python scripts/kafka_workload.py " + " ".join(args),
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


def cardinality_args(keys: int, partitions: int, scale: float = 1.0) -> list[str]:
    topic = "card" if partitions == 8 else "verify"
    return [
        "--topics", f"{topic}:{partitions}", "--records", str(int(keys * 1.5) // partitions), "--keys",
        str(keys // partitions), "--key-order", "sequential", "--value-bytes", "16", "--records-per-batch", "500",
        "--segment-bytes", str(int(16 * 2**20 * scale)), "--codecs", "none", "--tombstone-ratio", "0", "--seed", "5",
    ]


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


P4_KEYS = 1_000_000  # per partition (2 partitions)
P4_FRACTION = 0.01
P4_SEGMENT = 16 * 2**20
P4_SWEEP = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def _records_per_segment(value_bytes: int, per_batch: int, segment_bytes: int) -> int:
    """With fixed-size keys and values every batch has one size: how many records a segment holds."""
    from compaction.format.segment import iter_batch_headers

    probe = bulk(f"probe-{value_bytes}-{per_batch}", "--topics", "probe:1", "--records", str(3 * per_batch),
                 "--keys", str(3 * per_batch), "--value-bytes", str(value_bytes), "--records-per-batch",
                 str(per_batch), "--codecs", "none", "--tombstone-ratio", "0", "--seed", "1")
    data = (probe / "probe-0" / f"{0:020d}.log").read_bytes()
    sizes = {h.size for h in iter_batch_headers(data)}
    if len(sizes) != 1:
        raise SystemExit(f"batch sizes vary ({sizes}): cannot align the base with a segment boundary")
    return (segment_bytes // sizes.pop()) * per_batch


def bench_skipping(keys_per_partition: int = P4_KEYS, segment_bytes: int = P4_SEGMENT) -> dict[str, Any]:
    """P4 at the defaults (no bloom.filter.fpp): round 1 compacts a base where every key appears once; then 1% of
    the keys (a contiguous range of ids per partition) are updated and round 2 runs. Bytes fetched by round 2 vs
    the bound of goal (b): dirty bytes + clean segments that really hold an updated key + 2% of the clean
    region; and the bytes read from the cleaned region (clean segments rewritten + filters)."""
    from compaction.format.scan import scan_segment
    from compaction.metadata import ObjectSuffix, table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    per_segment = _records_per_segment(400, 100, segment_bytes)
    keys = (keys_per_partition // per_segment) * per_segment  # the base ends on a segment boundary
    args = ["--topics", "skip:2", "--records", str(keys), "--keys", str(keys), "--key-order", "sequential",
            "--value-bytes", "400", "--records-per-batch", "100", "--segment-bytes", str(segment_bytes),
            "--codecs", "none", "--tombstone-ratio", "0", "--update-fraction", str(P4_FRACTION),
            "--update-spread", "clustered", "--seed", "3"]
    name = f"skip-{keys}"
    full = bulk(name, *args)
    base = DATA / f"{name}-base"  # the base segments and the first update segment (active: not tiered)
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        for part in sorted(p for p in full.iterdir() if p.is_dir()):
            (base / part.name).mkdir(parents=True)
            for f in part.iterdir():
                stem = f.name.split(".")[0]
                if not stem.isdigit() or int(stem) <= keys:
                    os.link(f, base / part.name / f.name)
        (base / ".complete").write_text("ok")
    topic_config = ["--topic-config", f"segment.bytes={segment_bytes}"]
    pristine = tiered(base, f"{name}-default")
    store_dir = copy_store(pristine, "run")
    first = compaction(store_dir, "--min-dirty-ratio", "0.01", *topic_config)
    store = open_store(str(store_dir))
    table = table_in_store(store)
    tier_logdir(_rolled(full), store, table, NOW_MS - 86_400_000)
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


def _rolled(logdir: Path) -> Path:
    """`logdir` with its active segments rolled: hard links plus an empty new active segment per partition
    at its log end offset (as a broker's roll leaves it), so that tiering uploads the updates."""
    from compaction.format.segment import iter_batch_headers

    rolled = logdir.with_name(logdir.name + "-rolled")
    if (rolled / ".complete").exists():
        return rolled
    shutil.rmtree(rolled, ignore_errors=True)
    for part in sorted(p for p in logdir.iterdir() if p.is_dir()):
        (rolled / part.name).mkdir(parents=True)
        for f in part.iterdir():
            os.link(f, rolled / part.name / f.name)
        last = sorted(part.glob("*.log"))[-1]
        end = max(h.last_offset for h in iter_batch_headers(last.read_bytes())) + 1
        (rolled / part.name / f"{end:020d}.log").write_bytes(b"")
    (rolled / ".complete").write_text("ok")
    return rolled


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


# --- BENCHMARKS.md ------------------------------------------------------------------------------------------


# --- P8: the topic as a Delta table (`kcompact table`) -------------------------------------------------------

P8_SHAPES = (  # (partitions, keys per partition, value bytes, segment bytes): >= 1.1 GB of base segments each
    (8, 1_500_000, 100, 32 * 2**20),
    (1, 2_700_000, 400, 64 * 2**20),
)
P8_FRACTION = 0.01


def _base_segments(full: Path, keys: int) -> Path:
    """`full`'s segments up to the first one at or above offset `keys` (hard links): the base without the updates
    (that segment is the active one, so tiering the base leaves the updates out)."""
    base = full.with_name(full.name + "-base")
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        for part in sorted(p for p in full.iterdir() if p.is_dir()):
            (base / part.name).mkdir(parents=True)
            for f in part.iterdir():
                if not f.name.split(".")[0].isdigit() or int(f.name.split(".")[0]) <= keys:
                    os.link(f, base / part.name / f.name)
        (base / ".complete").write_text("ok")
    return base


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


def _read_partition_seconds(store: Path, topic: str, from_offset: int) -> float:
    """The wall time of `read_partition(..., from_offset, read_committed).count()` of partition 0 in a fresh process
    (session start-up excluded): the table's input path without the table."""
    code = ("import sys, time, json; from compaction.spark.session import build_session; "
            "from compaction.storage import open_store; from compaction.spark.read import read_partition; "
            "s = build_session(); st = open_store(sys.argv[1]); t = time.perf_counter(); "
            "n = read_partition(s, st, sys.argv[2], 0, from_offset=int(sys.argv[3]), "
            "isolation='read_committed').count(); print(json.dumps({'seconds': time.perf_counter() - t}))")
    done = subprocess.run([sys.executable, "-c", code, str(store), topic, str(from_offset)], check=True,
                          stdout=subprocess.PIPE, text=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def bench_table(partitions: int, keys_per_partition: int, value_bytes: int, segment_bytes: int,
                scale: float = 1.0) -> dict[str, Any]:
    """P8: a full rebuild of the table from a base where every key appears once (>= 1.1 GB), then an update after
    1% of the keys were rewritten (tiered as new segments). MB/s = segment bytes the run read / its wall time.
    No tombstones: the base must end on a segment boundary, which `_records_per_segment` computes for one record
    size."""
    from compaction.metadata import table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    segment_bytes = max(2**16, int(segment_bytes * scale))
    per_segment = _records_per_segment(value_bytes, 100, segment_bytes)
    keys = max(per_segment, int(keys_per_partition * scale) // per_segment * per_segment)
    topic = f"tbl{partitions}"
    args = ["--topics", f"{topic}:{partitions}", "--records", str(keys), "--keys", str(keys), "--key-order",
            "sequential", "--value-bytes", str(value_bytes), "--records-per-batch", "100", "--segment-bytes",
            str(segment_bytes), "--codecs", "none", "--tombstone-ratio", "0", "--update-fraction",
            str(P8_FRACTION), "--update-spread", "random", "--seed", "17"]
    name = f"table-{partitions}x{keys}-{value_bytes}"
    full = bulk(name, *args)
    pristine = tiered(_base_segments(full, keys), f"{name}-base")
    tier_end = table_in_store(open_store(str(pristine))).live_segments(topic, 0)[-1].end_offset + 1
    if tier_end != keys:
        raise SystemExit(f"P8: the base of {name} is tiered up to offset {tier_end}, not {keys}: the update would "
                         "read more than the 1%")
    store_dir = copy_store(pristine, "table-run")
    table = store_dir.parent / "table"
    shutil.rmtree(table, ignore_errors=True)
    rebuild = _table_run(store_dir, topic, table, NOW_MS)
    store = open_store(str(store_dir))
    tier_logdir(_rolled(full), store, table_in_store(store), NOW_MS - 86_400_000)
    update = _table_run(store_dir, topic, table, NOW_MS + 1)
    segments = table_in_store(open_store(str(pristine))).live_segments(topic, 0)
    tail = segments[len(segments) * 7 // 8:] if partitions == 1 else segments  # ~1/8 of the base either way
    read_seconds = _read_partition_seconds(pristine, topic, tail[0].start_offset)
    partition_bytes = sum(s.segment_size_bytes for s in tail)
    shutil.rmtree(store_dir, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    return {"workload": " ".join(args), "command": "kcompact generate --bulk " + " ".join(args),
            "partitions": partitions, "keys": keys * partitions, "rebuild": rebuild, "update": update,
            "read_partition": {"seconds": read_seconds, "bytes": partition_bytes}}


def _rows_handled(r: dict[str, Any], label: str) -> float:
    """What bounds a P8 run: the records a rebuild reads (every key once), the table rows an update rewrites."""
    return float(r["keys"]) if label == "rebuild" else float(r[label]["rows_written"])


def _table_rate(r: dict[str, Any]) -> float:
    return float(r["segment_bytes_read"]) / float(r["seconds"]["total"]) / 1e6


def _p8(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = ["Each shape: `kcompact table` rebuilds the table from a base where every key appears once, then 1% "
             "of the keys are rewritten (new segments, tiered) and a second run updates it. "
             "MB/s = segment bytes the run read / its wall time (plan + Spark + commit, session start-up excluded; "
             "the whole process in brackets); rows/s = records read (rebuild) or table rows rewritten (update) / "
             "wall time. Other agents' jobs and test suites shared the 2 cores during these runs (load average "
             "6-11), so the figures are low bounds.", "",
             "| shape | keys | run | segment bytes read | wall s (process) | MB/s | rows/s "
             "| table files written (bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        shape = f"{r['partitions']} partition(s): `{r['workload']}`"
        for label in ("rebuild", "update"):
            x = r[label]
            lines.append(f"| {shape if label == 'rebuild' else ''} | {r['keys']:,} | {label} | "
                         f"{_mb(x['segment_bytes_read'])} | {x['seconds']['total']:.1f} ({x['process_seconds']:.1f}) "
                         f"| {_table_rate(x):.2f} | {_rows_handled(r, label) / x['seconds']['total']:,.0f} "
                         f"| {x['files_added']} ({_mb(x['bytes_written'])}) |")
    lines += ["", "What limits it: the input path. `read_partition(..., isolation='read_committed').count()` alone "
              "(`compaction.spark.read`, which decodes every record in Python on the executors; the driver reads "
              "batch headers only, to find open transactions) over about 1/8 of each base (partition 0 of 8; the "
              "last eighth of the one partition; a short read, so its fixed cost weighs more than in a rebuild):"]
    for r in runs:
        rp = r["read_partition"]
        lines.append(f"- {r['partitions']} partition(s): {_mb(rp['bytes'])} in {rp['seconds']:.1f} s = "
                     f"{rp['bytes'] / rp['seconds'] / 1e6:.2f} MB/s, vs the rebuild's {_table_rate(r['rebuild']):.2f} "
                     "MB/s over the whole base.")
    lines += ["", "An update under the offset strategy reads only the new segments, then the keys of the table's "
              "files and rewrites every file holding a changed key: with 1% of the keys spread at random that is "
              "every file (Delta without deletion vectors is copy-on-write), so the update costs about a rewrite "
              "of the table, not of the topic. A partition with at least 20 changed keys per table file skips the "
              "key-only read that finds the touched files (files are hash-partitioned by key, so all are touched).",
              "", "The rebuilds handle " + " and ".join(
                  f"{_rows_handled(r, 'rebuild') / r['rebuild']['seconds']['total']:,.0f} rows/s "
                  f"({r['partitions']} partition(s))" for r in runs) + ", at about the rate of `read_partition` "
              "alone: the table adds little to its input path (Python per record). Faster input needs a columnar "
              "read_committed path in `compaction.spark.read` (e.g. the scan kernels of `compaction.format.scan`, as "
              "compaction uses), not a change to the table."]
    return lines


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _p1(r: dict[str, Any]) -> list[str]:
    return [
        f"Workload: `kcompact generate {r['workload']}` — {r['files']} uncompressed segments, "
        f"{_gib(r['bytes'])}, {int(r['records']):,} records (~100-byte values). Best of 3.",
        "",
        "| measurement | MB/s | records/s |",
        "|---|---|---|",
        f"| raw read + CRC-32C of the same bytes | {r['raw_mb_s']:,.0f} | — |",
        f"| columnar scan (numba) → Arrow | {r['scan_mb_s']:,.0f} | {r['scan_records_s']:,.0f} |",
        "",
        f"Scan / reference: **{100 * r['ratio']:.0f}%** (target ≥ 40%).",
    ]


def _walls(r: dict[str, Any]) -> str:
    walls = r.get("run_walls")
    return f"walls of its runs {' / '.join(f'{w:.1f}' for w in walls)} s; median run: " if walls else ""


def _split(r: dict[str, Any]) -> str:
    ph, t = r["phases"], r["task_seconds"]
    return (f"{_walls(r)}plan {ph['plan']:.1f} s · map (scan + winners) {r['map_seconds']:.1f} s · rewrite + upload "
            f"{r['rewrite_seconds']:.1f} s · commit {ph['commit']:.2f} s (session start-up {ph['session']:.1f} s, "
            f"not counted; whole process {r['process_seconds']:.1f} s) — executor task time: scan {t['scan']:.1f} s, "
            f"download {t['download']:.1f} s, rewrite {t['rewrite']:.1f} s, upload {t['upload']:.1f} s; "
            f"rewrite tasks {sum(p['rewrite_tasks'] for p in r['per_partition'])} for {r['partitions']} partitions")


def _rate_table(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = ["| run | input (tiered) | records in → out | output | wall | MB/s | whole process | raw read + CRC "
             "(1 core) | share of raw | fetch ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in runs:
        lines.append(f"| {label} | {_gib(r['bytes_read'])} | {r['records_read']:,} → {r['records_written']:,} | "
                     f"{_mb(r['bytes_written'])} | {r['wall_seconds']:.1f} s | **{r['mb_s']:.1f}** | "
                     f"{r['process_mb_s']:.1f} MB/s | {r['raw_mb_s']:,.0f} MB/s | **{100 * r['raw_share']:.1f}%** | "
                     f"{_ratio(r.get('fetch_ratio'))} |")
    return lines


def _time_limit(r: dict[str, Any], fixed: float | None) -> str:
    """Where a run's wall time (session start-up excluded) went: what limits its MB/s."""
    ph, t = r["phases"], r["task_seconds"]
    parts = {"plan": ph["plan"], "map (scan + winners)": r["map_seconds"], "rewrite + upload": r["rewrite_seconds"],
             "commit": ph["commit"]}
    top = max(parts, key=lambda k: parts[k])
    line = (f"{top} is {parts[top]:.1f} s of the {r['wall_seconds']:.1f} s; executor task time scan {t['scan']:.1f} s, "
            f"rewrite {t['rewrite']:.1f} s, upload {t['upload']:.1f} s, download {t['download']:.1f} s on 2 cores")
    if fixed is not None:
        line += f"; P5's fixed cost per run (a = {fixed:.1f} s) is {100 * fixed / r['wall_seconds']:.0f}% of it"
    return line + "."


def _fixed_cost(saved: dict[str, Any]) -> float | None:
    return fit(saved["P5"]["points"])[0] if "P5" in saved else None


def _p2(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = [f"Workload: `kcompact generate --bulk {runs[0]['workload'].replace(' --codecs none', ' --codecs C')}`, "
             "tiered into a local store; one run of `plan → stage → commit` in local[2] (`scripts/bench_run.py`, "
             "config: cleanup.policy compact, min.cleanable.dirty.ratio 0.01, nothing else); MB/s = segment bytes "
             "read by the run / its wall time (plan + stage + commit). Session start-up (JVM, Python workers, numba "
             "kernels loaded in them) is measured apart, as a long-lived executor has paid it already; the whole "
             "process figure counts it (interpreter, JVM, workers, a one-task-per-core warm-up job, the run). The "
             "raw reference reads the same .log files and computes their CRC-32C on one core, page cache warm, "
             "in the same `make bench` run. Each figure is the median of three runs (each a fresh process on a fresh "
             "copy of the store; every run's wall time below). A first compaction runs scan, winners and rewrite as "
             "one Spark job of two stages; its map / rewrite split is taken at the end of the last scan task.", ""]
    lines += _rate_table([(r["codec"], r) for r in runs])
    lines += ["", *[f"- {r['codec']}: {_split(r)}" for r in runs], "",
              "Target ≥ 100 MB/s and ≥ 6% of raw read + CRC-32C (goal c; Kafka's cleaner: 16.5 MB/s)."]
    missed = [r for r in runs if r["mb_s"] < 100 or r["raw_share"] < 0.06]
    lines += [f"- **What limits {r['codec']}**: {_time_limit(r, _fixed_cost(saved))}" for r in missed]
    lines.append(P2_ANALYSIS)
    lines += ["", "Where the map phase goes (the same segments, each step a Spark job of its own, warm; "
              "`bench_run.py --profile-map`):", "",
              "| codec | segments | rows to the JVM (each scan task's best per partition and key) | distinct keys "
              "| scan + hand-over | + hash aggregate & shuffle | + persist (step-by-step path) "
              "| scan task time (summed) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.get("map_profile")
        if p:
            lines.append(f"| {r['codec']} | {p['segments']} | {p['rows_to_jvm']:,} | {p['keys']:,} | "
                         f"{p['scan']:.1f} s | {p['aggregate']:.1f} s | {p['persist']:.1f} s | "
                         f"{p['task_scan']:.1f} s |")
    return lines


def _p2k(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    lines = [f"Workload: `{r['command']}` — every batch built by kafka-python's `DefaultRecordBatchBuilder` "
             f"(an independent Kafka codec: its own varints and CRC-32C), uncompressed, laid out as a broker's log "
             f"dir; generated in {r['generation_seconds']:.0f} s (kafka-python directly, no replication of sampled "
             f"batches needed), {_gib(r['input_bytes'])} of rolled segments. `kcompact tier` rebuilt "
             f"{r.get('rebuilt_indexes')} offset/time indexes (the writer leaves them out, as Kafka rebuilds them on "
             "load); the writer puts an empty producer snapshot at every roll, as a broker does (without one, "
             "planning replays the whole tier to find the producer state). Runs with only cleanup.policy "
             "compact set (every other option at its default), as a new user would; the median of three.", ""]
    lines += _rate_table([("kafka-python, 2 partitions", r)])
    lines += ["", f"- {_split(r)}", "", "Target ≥ 80 MB/s and ≥ 5% of raw read + CRC-32C (goal c)."]
    if r["mb_s"] < 80 or r["raw_share"] < 0.05:
        lines.append(f"- **What limits it**: {_time_limit(r, _fixed_cost(saved))}")
    return lines


def _p3(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = ["Workload: `kcompact generate --bulk` with `--key-order sequential` (every key once, then 50% more "
             "updates), 16-byte values, 8 partitions, e.g. `" + runs[-1]["workload"] + "`. One run each, "
             "peak resident memory sampled every 0.2 s from /proc (the JVM is driver and executor in local mode; "
             "`spark.driver.memory` 6g).",
             "",
             "| distinct keys in the run | records read → written | wall | Python driver peak | JVM peak | "
             "Python workers peak (sum) |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        m = r["memory_peak_bytes"]
        lines.append(f"| {r['dirty_keys']:,} | {r['records_read']:,} → {r['records_written']:,} | "
                     f"{r['wall_seconds']:.0f} s | {_mb(m['driver_python'])} | {_mb(m['jvm'])} | "
                     f"{_mb(m['python_workers'])} |")
    lines += ["", "Target: 50 M keys in one run, driver memory not growing with the key count. The Python driver holds "
              "plans and per-partition results only. In local mode the JVM is also the executor: its growth is the "
              "executor's (the per-key rows, cached for the rewrite, and the shuffle), within its fixed heap "
              "(`spark.driver.memory`); on a cluster that part is spread over executors."]
    return lines


def _p4(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    s = r["second"]
    clean = r["clean_bytes"]
    share = r["read_bytes"] / clean
    other = max(0, r["fetched_bytes"] - r["dirty_bytes"] - r["read_bytes"])
    lines = [
        f"Workload: `kcompact generate --bulk {r['workload']}`: {r['keys']:,} keys, each once, compacted (round 1); "
        "then 1% of them updated (a contiguous range of ids per partition), tiered, and round 2 runs. Both rounds "
        "with the topic's own settings only (`segment.bytes`, `min.cleanable.dirty.ratio` 0.01 then 0.001): "
        f"**no bloom.filter.fpp**, so filters are sized from the data (round 1 wrote them at "
        f"{'n/a' if r['fpp'] is None else format(r['fpp'], '.2g')}).",
        "",
        "| round 2 | bytes | share of the clean region |",
        "|---|---|---|",
        f"| clean region: {r['clean_segments']} segments | {_mb(clean)} | 100% |",
        f"| dirty segments (the updates) | {_mb(r['dirty_bytes'])} | {100 * r['dirty_bytes'] / clean:.2f}% |",
        f"| clean segments that really hold an updated key (overlap) | {_mb(r['overlap_bytes'])} | "
        f"{100 * r['overlap_bytes'] / clean:.2f}% |",
        f"| **bound**: dirty + overlap + 2% of the clean region | {_mb(r['bound_bytes'])} | "
        f"{100 * r['bound_bytes'] / clean:.2f}% |",
        f"| **fetched by round 2** (all requests; fetch ratio {_ratio(s.get('fetch_ratio'))}) | "
        f"{_mb(r['fetched_bytes'])} | **{100 * r['fetched_bytes'] / clean:.2f}%** |",
        f"| of which clean segments rewritten + filters | {_mb(r['read_bytes'])} | {100 * share:.2f}% |",
        f"| of which filters | {_mb(s['filter_bytes_read'])} | {100 * s['filter_bytes_read'] / clean:.2f}% |",
        f"| not downloaded ({s['segments_skipped']} segments kept unread) | {_mb(s['bytes_not_downloaded'])} | "
        f"{100 * s['bytes_not_downloaded'] / clean:.2f}% |",
        "",
        f"Fetched {_mb(r['fetched_bytes'])} vs bound {_mb(r['bound_bytes'])} (target: fetched ≤ bound, goal b). "
        f"Segments read although they hold no updated key: {s.get('false_positive_segments', '?')} filter false "
        f"positive(s), {s.get('segments_merged', '?')} small segment(s) merged into a rewritten neighbour. Round 2 "
        f"took {s['phases']['stage']:.1f} s to stage (round 1: {r['first']['phases']['stage']:.1f} s).",
    ]
    if r["fetched_bytes"] > r["bound_bytes"]:
        lines += ["", f"- **What limits it**: round 2 fetched {_mb(r['dirty_bytes'])} of dirty segments, "
                  f"{_mb(s['clean_bytes_rewritten'])} of clean segments rewritten ({_mb(r['overlap_bytes'])} of them "
                  f"hold an updated key), {_mb(s['filter_bytes_read'])} of filters and {_mb(other)} besides "
                  "(companions, re-fetches): the excess over the bound is the clean segments read without an updated "
                  "key plus whatever was fetched twice."]
    lines += ["", "Secondary: filter rate sweep on the same clean segments (filters rebuilt in process at each rate; "
              "share of the cleaned region read = segments testing positive + all filters; the first row is the rate "
              "the defaults chose):", "",
              "| bloom.filter.fpp | clustered 1%: read (overlap) | filters alone | random 1%: read (overlap) |",
              "|---|---|---|---|"]
    for row in r["sweep"]:
        c, rnd = row["clustered"], row["random"]
        lines.append(f"| {row['fpp']:.2g} | {100 * c['read']:.1f}% ({100 * c['overlap']:.1f}%) | "
                     f"{100 * c['filters']:.2f}% | {100 * rnd['read']:.1f}% ({100 * rnd['overlap']:.1f}%) |")
    lines += ["", "With keys spread at random, 1% of them touch almost every segment: no filter can help there."]
    return lines


def _p5(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    points = sorted(r["points"], key=lambda p: p["scale"])
    base, top = points[0], points[-1]
    a, b = fit(points)  # a: what a run costs whatever its size (Spark jobs, commits); b: per MB
    xs = [p["bytes_read"] / 1e6 for p in points]
    lines = ["The P2 uncompressed workload at 1/16, 1/4 and 1 of its size (records, keys and segment.bytes "
             "scaled together, 8 partitions each; the 16× point is P2's run; each point the median of three runs).",
             "", "| input | wall | MB/s | time ratio vs 1× | input ratio | fit a + b·MB | vs fit | fetch ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for p, x in zip(points, xs, strict=True):
        predicted = a + b * x
        lines.append(f"| {_mb(p['bytes_read'])} ({16 * p['scale'] / top['scale']:g}×) | {p['wall_seconds']:.1f} s | "
                     f"{p['mb_s']:.1f} | {p['wall_seconds'] / base['wall_seconds']:.2f} | "
                     f"{p['bytes_read'] / base['bytes_read']:.2f} | {predicted:.1f} s | "
                     f"{100 * (p['wall_seconds'] / predicted - 1):+.0f}% | {_ratio(p.get('fetch_ratio'))} |")
    lines += ["", f"Fit: **a = {a:.1f} s per run** whatever its size (target ≤ 4 s, goal e), b = {1000 * b:.1f} ms "
              f"per MB ({1 / b:.0f} MB/s marginal). The per-byte part is linear when every point is within 15% of "
              "the fit."]
    small = base
    lines.append(f"- **{'What limits a' if a > 4 else 'The 1× run'}**: {_mb(small['bytes_read'])} in "
                 f"{small['wall_seconds']:.1f} s: plan {small['phases']['plan']:.1f} s, map "
                 f"{small['map_seconds']:.1f} s, rewrite + upload {small['rewrite_seconds']:.1f} s, commit "
                 f"{small['phases']['commit']:.1f} s for {small['partitions']} partitions (Spark jobs and stages "
                 "with Python tasks, per-partition fencing and commits).")
    lines.append(FIXED_COST_ANALYSIS)
    return lines


P2_ANALYSIS = (
    "- **Where the time goes** (2026-11-24, Spark's event log and the executors' own timers; this machine's speed "
    "varies by up to 1.5× from run to run, hence the median of three): the scan stage runs one task per core; each "
    "spends about half its time in Python (fetch, decode, fold into one row per key) and the rest handing those "
    "rows to the JVM and its shuffle. The rewrite stage runs a task per partition; the JVM's own CPU time there is "
    "0.2-0.4 s a task (reading the shuffle, the aggregate, the hand-over), the rest is the rewrite in Python "
    "(decode the inputs, keep the winners, re-encode, index, build the output's filter) and the upload.\n"
    "- **Why the 2026-11-25 figures are lower than the 2026-11-24 ones** (none 171 → 160 MB/s, lz4 154 → 121, "
    "P2K 140 → 119): the machine, not the code. The code of 2026-11-24 (1ec357c) and this one, alternated on the "
    "same stores right after this run: lz4 11.5 / 13.0 s old (a first run compiling its kernels: 13.8 s) against "
    "11.8-11.9 s new; P2K 6.7-8.0 s old against 6.7-8.9 s new. What changed on 2026-11-25 (P6) touches every "
    "rewrite: its filter is built, and its objects uploaded, in threads beside it.\n"
    "- **What made the 2026-11-24 09:00 figures faster than the 06:30 ones** (alternated runs, old and new code, "
    "same store): the one job's rows carry (key, offset, slot) instead of (tp, key, offset, dirty, slot), since "
    "every key is dirty in that job and each rewrite slot names its partition: uncompressed 10.2-10.6 s → "
    "8.7-9.7 s. In a synthetic job of 2.4 M rows through mapInArrow, a shuffle by slot and the aggregate, the two "
    "columns cost 0.6-0.9 s in a fresh JVM and 0.3 s in a warm one. The rewrite's per-batch counts come from the "
    "scan's decoded ranges instead of a whole Arrow table (one lz4 partition's rewrite 0.69-0.90 s → 0.58-0.63 "
    "s); segments are read into numpy buffers, which the kernel backs with huge pages, and the local store copies "
    "into the run cache with sendfile (one lz4 scan task's Python time 2.5-3.0 s → 2.25-2.6 s).\n"
    "- **A fresh JVM pays its JIT in the run**: the same compaction four times in one session (a fresh copy of the "
    "store each time) took 13.6 s, then 10.5-11.2 s; the rewrite stage 7.2 s, then 5.3 s. A `spark-submit` per "
    "run pays this, so these figures include it; only the session start and its one-task warm-up job are left "
    "out.\n"
    "- **Tried without effect** (three runs each, within the run-to-run spread): "
    "`spark.sql.execution.bypassPartialAggregation` (the aggregate after the shuffle by slot is already one "
    "Complete-mode pass: `spark.sql.execution.combineAdjacentAggregation` is on by default), larger Arrow batches "
    "(`spark.sql.execution.arrow.maxRecordsPerBatch` 200,000 and 1,000,000), the JVM's C1 compiler only (session "
    "start 8.6 s instead of 11 s, stage unchanged), whole-stage code generation off, adaptive execution off, "
    "uncompressed shuffle files.\n"
    "- **Two harness faults found on the way**: the first measured run of `make bench` used to compile numba "
    "kernels inside its wall time when the checkout's numba cache was cold (a fresh clone or worktree). First the "
    "rewrite's and the filter's kernels (2-3 s; `bench_run.py`'s warm-up now loads them too, as a long-lived "
    "executor has them); then, this morning, the scan's kernels again for writable buffers (the run cache's numpy "
    "buffers are another numba type than bytes; every buffer the kernels get is now read-only, so one compiled "
    "version serves every caller).")

FIXED_COST_ANALYSIS = (
    "- **Where a goes, from Spark's event log** (2026-11-24, same machine, the 1× run at 05:40): a first compaction "
    "is one Spark job of two stages. The scan, one task per core, took 0.6 s; the aggregate and the rewrite, one task "
    "per partition, 1.35 s, of which 0.36 s was rewriting and the rest each task's start and aggregate in a JVM that "
    "is still cold. About 0.9 s goes on the driver before the job (a fencing epoch per partition, planning the "
    "DataFrame) and 0.3 s on the Delta commits. The history of a: 8.3 s when a run was 8 Spark jobs; 3.5-5.4 s "
    "once it was one job (Python workers no longer forked to pickle a DataFrame built from a list; `local_frame`); "
    "2.6 s with one scan task per core instead of two to four, each folding its segments in one hash table of key "
    "bytes instead of an Arrow group-by per segment and again per task. Runs with clean segments (the filter test, "
    "a rescan) keep the step-by-step jobs: two to four more.")


HOT_ANALYSIS = (
    "- **What changed on 2026-11-25** (the hot run from 13.6-13.9 s to 10.4-10.7 s by hand, alternated with the "
    "spread run, which went from 9.0-9.2 s to 7.9-8.3 s: hot / spread 76-77% to 89-91%). Spark's event log of one "
    "hot run before: the scan stage 5.25 s, a second stage aggregating the 4.46 M scan rows and sending each of "
    "the 2.39 M winners to its chunk 2.9 s, the rewrite stage 4.3 s (tasks 2.95 and 4.31 s); after (a run of 10.9 "
    "s): 3.6 s, 3.2 s and 3.2 s (tasks 2.3 and 3.2 s). (1) The winners reach their chunk **packed**: each "
    "aggregate task searches its winners' chunks among the offset ranges and hands the shuffle a row per chunk "
    "and 16 k offsets (146 rows) instead of a row per winner through a broadcast join; in a warm session the "
    "aggregate and the routing took 2.5-2.6 s instead of 3.1-3.5 s, and the rewrite task no longer reads 1.96 M "
    "rows from the JVM. (2) The scan task's **fold grows four times** at a time from a million keys: its 2.2 M "
    "keys took 1.0-1.1 s instead of 1.4-1.7 s (smaller folds keep doubling: a sparse table is slower to fold "
    "into). (3) The output's **filter is built beside the rewrite** (each input segment's output scanned in a "
    "thread while the next is rewritten) and the objects are uploaded while it is finished: the later chunk, "
    "which holds most winners and ends the rewrite stage, uses the core the earlier chunk freed (in process: "
    "rewrite + filter 1.45-2.16 s -> 1.28-1.31 s).\n"
    "- **What still separates the two runs**: the hot partition's 2 scan tasks each see 2.2 M of its 2.4 M keys, "
    "so Spark receives, shuffles and aggregates 4.46 M rows instead of 2.37 M, in a stage of its own (3.2 s): a "
    "winner's chunk is known only once its key is aggregated. The spread run aggregates inside its rewrite tasks. "
    "Sending each scan row to every chunk at or before its offset would let the chunks aggregate themselves, but "
    "doubles the later scan task's rows (estimated no faster for two chunks, slower for more).\n"
    "- **Tried without effect** (warm session, 4.46 M rows): leaving the constant partition column out of a "
    "one-partition run's rows; 2, 4, 8 or 16 aggregate tasks.\n"
    "- **Earlier** (2026-11-24): 70% in the recorded run (84-91% that morning), after the spread run got faster; "
    "evening the chunks' bytes was tried and reverted (the later chunk's cost follows its winners, not its "
    "bytes). Before one scan task per core (2026-11-24 05:05) the partition was cut into 8 scan tasks (9.3 M rows "
    "to the shuffle): 52%.")


def _p6(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    hot, spread = r["hot"], r["spread"]
    ratio = hot["mb_s"] / spread["mb_s"]
    tasks = hot["per_partition"][0]
    lines = [f"Workload: `{hot['command']}` (one partition) vs `{spread['command']}` (the same records and keys "
             "over 8 partitions: P2's uncompressed run), each compacted at the defaults but "
             "min.cleanable.dirty.ratio 0.01.", ""]
    lines += _rate_table([("1 hot partition", hot), ("8 partitions", spread)])
    lines += ["", f"- 1 partition: {_split(hot)}", f"- 8 partitions: {_split(spread)}", "",
              f"Hot / spread = **{100 * ratio:.0f}%** (target ≥ 80%, goal d); the hot partition's report: "
              f"rewrite_tasks {tasks['rewrite_tasks']}, chunks {tasks['chunks']}, segments_scanned "
              f"{tasks['segments_scanned']}, cache_hits {tasks['cache_hits']}."]
    lines.append(HOT_ANALYSIS)
    if ratio < 0.8:
        lines.append(f"- **What limits it**: map {hot['map_seconds']:.1f} s vs {spread['map_seconds']:.1f} s, rewrite "
                     f"+ upload {hot['rewrite_seconds']:.1f} s vs {spread['rewrite_seconds']:.1f} s (rewrite task "
                     f"time {hot['task_seconds']['rewrite']:.1f} s vs {spread['task_seconds']['rewrite']:.1f} s over "
                     f"{tasks['rewrite_tasks']} vs {sum(p['rewrite_tasks'] for p in spread['per_partition'])} tasks).")
    return lines


def _p7(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    lines = ["<!-- goal f hook: scripts/bench.py `bench_verify` measures this once "
             "`compaction.verify.verify_partition` accepts `spark=` -->",
             f"Workload: `{r['command']}` ({r['keys']:,} keys in one partition; the goal's scale is 50 M)."]
    if not r["measured"]:
        return [*lines, "", "**Not measured yet**: `compaction.verify.verify_partition` does not take `spark=` in this "
                "version (verify holds one partition's keys on the driver). `make bench BENCH_ARGS=\"--only P7\"` "
                "measures it once it does: verify on the session, driver peak RSS sampled from /proc every 0.2 s."]
    m = r["memory_peak_bytes"]
    return [*lines, "", "| keys | verify wall | verdict | Python driver peak | JVM peak | Python workers peak |",
            "|---|---|---|---|---|---|",
            f"| {r['keys']:,} | {r['verify_seconds']:.1f} s | {'ok' if r['verify_ok'] else 'PROBLEMS'} | "
            f"{_mb(m['driver_python'])} | {_mb(m['jvm'])} | {_mb(m['python_workers'])} |", "",
            "Target: a flat driver (the Python driver's peak not growing with the keys), output and exit codes kept."]


def _runs(saved: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every compaction run of the saved figures, labelled by shape."""
    out: list[tuple[str, dict[str, Any]]] = []
    for r in saved.get("P2", []):
        out.append((f"P2 {r['codec']}", r))
    if "P2K" in saved:
        out.append(("P2K kafka-python, 2 × 64 MiB segments", saved["P2K"]))
    for r in saved.get("P3", []):
        out.append((f"P3 {r['keys']:,} keys", r))
    if "P4" in saved:
        out += [("P4 round 1", saved["P4"]["first"]), ("P4 round 2 (1% updated)", saved["P4"]["second"])]
    for p in saved.get("P5", {}).get("points", [])[:-1]:
        out.append((f"P5 {_mb(p['bytes_read'])}", p))
    if "P6" in saved:
        out.append(("P6 one hot partition", saved["P6"]["hot"]))
    return out


def _fetch(saved: dict[str, Any]) -> list[str]:
    lines = ["The run report's `fetch_ratio`: bytes fetched from the store (every request) / bytes of the segments "
             "and filters the run had to read; 1.00 = every byte fetched once. Target ≤ 1.05 on every shape "
             "(goal a). Workloads and dates: the sections below.", "",
             "| run | fetched | needed | GETs | fetch ratio | worst partition | segments scanned / cache hits |",
             "|---|---|---|---|---|---|---|"]
    worse = []
    for label, r in _runs(saved):
        parts = r.get("per_partition", [])
        worst = max(parts, key=lambda p: p.get("fetch_ratio") or 0, default=None)
        lines.append(f"| {label} | {_mb(r['requests']['bytes_read'])} | {_mb(r.get('needed_bytes', 0))} | "
                     f"{r['requests']['gets']:,} | **{_ratio(r.get('fetch_ratio'))}** | "
                     f"{worst['tp'] + ' ' + _ratio(worst.get('fetch_ratio')) if worst else '—'} | "
                     f"{sum(p['segments_scanned'] for p in parts)} / {sum(p['cache_hits'] for p in parts)} |")
        if (r.get("fetch_ratio") or 0) > 1.05:
            worse.append(label)
    if worse:
        lines += ["", f"- **What limits it** ({', '.join(worse)}): the bytes fetched beyond those needed are "
                  "re-fetches (a segment scanned, then fetched again by the rewrite: cache hits below the segments "
                  "scanned) and the companions a rewrite copies; the columns above say which."]
    return lines


SECTIONS: dict[str, tuple[str, Callable[[Any, dict[str, Any]], list[str]]]] = {
    "P1": ("P1 — segment scan vs raw read + CRC-32C (one core)", lambda r, _s: _p1(r)),
    "P2": ("P2 — end to end, ≥ 1 GiB, local[2] (goal c, first shape)", _p2),
    "P2K": ("P2K — end to end on a kafka-python workload: 2 partitions, 64 MiB segments, random keys (goal c)",
            _p2k),
    "P4": ("P4 — skipping at the defaults when 1% of keys change (goal b)", _p4),
    "P5": ("P5 — scaling 1× / 4× / 16×, fixed cost per run (goal e)", _p5),
    "P6": ("P6 — one hot partition vs 8 partitions (goal d)", _p6),
    "P3": ("P3 — key cardinality and memory", _p3),
    "P7": ("P7 — verify at scale (goal f)", _p7),
    "P8": ("P8 — the topic as a Delta table: full rebuild ≥ 1 GiB and a 1% update, two shapes (`kcompact table`)",
           _p8),
}
PREVIOUS = "<!-- previous version: figures measured before the run refactor; replaced as sections are re-measured -->"


def save(results: Path, figure: str, result: Any) -> None:
    results.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (results / f"{figure}.json").write_text(json.dumps({"measured": now, "machine": machine(), "result": result}))


WAL_SECTION = "## W — "
"""The WAL's section, written by scripts/bench_wal.py (`make bench-wal`); this harness carries it over as it is."""


def kept_section(text: str, heading: str) -> list[str]:
    """The lines of the section of `text` starting with `heading`, up to the next section or PREVIOUS."""
    start = text.find(heading)
    if start < 0:
        return []
    ends = [i for i in (text.find("\n## ", start + 1), text.find(PREVIOUS, start)) if i >= 0]
    return [*text[start : min(ends, default=len(text))].rstrip("\n").split("\n"), ""]


def write_report(path: Path, results: Path) -> None:
    """BENCHMARKS.md from the saved figures. Figures not measured yet by this harness keep a placeholder; the
    previous version's text (below PREVIOUS in the existing file) is carried over until every figure is new."""
    saved_files = {f: json.loads((results / f"{f}.json").read_text()) for f in SECTIONS
                   if (results / f"{f}.json").exists()}
    saved = {f: d["result"] for f, d in saved_files.items()}
    lines = [
        "# kcompact benchmarks",
        "",
        "Written by `make bench` (`python scripts/bench.py`; `--only P2,P4` refreshes some sections and keeps the "
        "others). Each section names its workload, machine and date. Never part of `make test`.",
        "",
        *summary(saved),
        "## Fetch ratio on every shape (goal a)", "",
        *(_fetch(saved) if _runs(saved) else ["Not measured yet by this harness."]), "",
    ]
    for figure, (title, render) in SECTIONS.items():
        lines += [f"## {title}", ""]
        if figure in saved_files:
            data = saved_files[figure]
            lines += [f"Measured {data['measured']} on {data['machine']}.", "", *render(data["result"], saved), ""]
        else:
            lines += [f"Not measured yet by this harness (`make bench BENCH_ARGS=\"--only {figure}\"`).", ""]
    existing = path.read_text() if path.exists() else ""
    lines += kept_section(existing, WAL_SECTION)
    previous = existing.split(PREVIOUS, 1) if existing else []
    if len(previous) == 2 and len(saved_files) < len(SECTIONS):
        lines += [PREVIOUS, previous[1].lstrip("\n")]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def fit(points: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares wall seconds = a + b * MB over P5's points."""
    xs, ys = [p["bytes_read"] / 1e6 for p in points], [p["wall_seconds"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def summary(r: dict[str, Any]) -> list[str]:
    """Targets vs figures (the goals a-f first); the sections say what limits the ones not met."""
    rows = []
    runs = _runs(r)
    if runs:
        worst_label, worst = max(runs, key=lambda x: x[1].get("fetch_ratio") or 0)
        top = worst.get("fetch_ratio") or 0
        rows.append(("a. fetch ratio, every shape", "≤ 1.05", f"max {top:.3f} ({worst_label})", top <= 1.05))
    if "P4" in r:
        p4 = r["P4"]
        rows.append(("b. P4 skipping at the defaults, 1% keys", "fetched ≤ dirty + overlap + 2% clean",
                     f"{_mb(p4['fetched_bytes'])} vs {_mb(p4['bound_bytes'])}",
                     p4["fetched_bytes"] <= p4["bound_bytes"]))
    if "P2" in r:
        rates = ", ".join(f"{x['codec']} {x['mb_s']:.0f} MB/s = {100 * x['raw_share']:.1f}% (process "
                          f"{x['process_mb_s']:.0f})" for x in r["P2"])
        rows.append(("c. P2 end to end, local[2]", "≥ 100 MB/s and ≥ 6% of raw", rates,
                     all(x["mb_s"] >= 100 and x["raw_share"] >= 0.06 for x in r["P2"])))
    if "P2K" in r:
        k = r["P2K"]
        rows.append(("c. P2K kafka-python shape", "≥ 80 MB/s and ≥ 5% of raw",
                     f"{k['mb_s']:.0f} MB/s = {100 * k['raw_share']:.1f}% (process {k['process_mb_s']:.0f})",
                     k["mb_s"] >= 80 and k["raw_share"] >= 0.05))
    if "P6" in r:
        ratio = r["P6"]["hot"]["mb_s"] / r["P6"]["spread"]["mb_s"]
        tasks = r["P6"]["hot"]["per_partition"][0]["rewrite_tasks"]
        rows.append(("d. one hot partition vs 8", "≥ 80%", f"{100 * ratio:.0f}% ({tasks} rewrite tasks)", ratio >= 0.8))
    if "P5" in r:
        a, b = fit(r["P5"]["points"])
        worst_fit = max(abs(p["wall_seconds"] / (a + b * p["bytes_read"] / 1e6) - 1) for p in r["P5"]["points"])
        rows.append(("e. fixed cost per run (P5 intercept)", "≤ 4 s", f"{a:.1f} s", a <= 4))
        rows.append(("P5 scaling 1×/4×/16×", "within 15% of linear", f"a + b·MB within {100 * worst_fit:.0f}%",
                     worst_fit <= 0.15))
    if "P7" in r:
        v = r["P7"]
        rows.append(("f. verify at scale", "flat driver", f"{v['keys'] / 1e6:.0f} M keys: driver "
                     f"{_mb(v['memory_peak_bytes']['driver_python'])}" if v["measured"] else "not measured yet",
                     v["measured"] and v["verify_ok"]))
    if "P1" in r:
        rows.append(("P1 scan vs read + CRC", "≥ 40%", f"{100 * r['P1']['ratio']:.0f}%", r["P1"]["ratio"] >= 0.4))
    if "P3" in r:
        top3 = max(r["P3"], key=lambda x: x["keys"])
        drivers = " → ".join(f"{x['memory_peak_bytes']['driver_python'] / 1e6:.0f}" for x in r["P3"])
        flat = max(x["memory_peak_bytes"]["driver_python"] for x in r["P3"]) <= 1.25 * min(
            x["memory_peak_bytes"]["driver_python"] for x in r["P3"])
        rows.append(("P3 cardinality", "50 M keys in one run, flat driver memory",
                     f"{top3['dirty_keys'] / 1e6:.1f} M keys in {top3['wall_seconds']:.0f} s; driver MB {drivers}",
                     top3["dirty_keys"] >= 50_000_000 and flat))
    lines = ["## Summary", "", "| figure | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {target} | {value} | {'yes' if ok else '**no**'} |" for name, target, value, ok in rows]
    if not rows:
        lines.append("| — | — | not measured yet by this harness | — |")
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated figures to measure (default all)")
    parser.add_argument("--quick", action="store_true",
                        help="every workload ~1/64 of its size, to check the harness end to end; results and report "
                             "under bench-data/quick/ (never BENCHMARKS.md)")
    parser.add_argument("--scan-bytes", type=int, default=1_100_000_000, help="bytes of segments for P1")
    parser.add_argument("--keys", default="5000000,20000000,50000000", help="P3's distinct key counts")
    parser.add_argument("--p4-keys", type=int, default=P4_KEYS, help="P4's keys per partition (2 partitions)")
    parser.add_argument("--verify-keys", type=int, default=5_000_000, help="P7's keys in one partition")
    parser.add_argument("--out", type=Path, default=None, help="default BENCHMARKS.md (--quick: bench-data/quick/)")
    args = parser.parse_args()
    wanted = {f.strip().upper() for f in args.only.split(",") if f.strip()}
    unknown = wanted - SECTIONS.keys()
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    scale, results, out = 1.0, RESULTS, args.out or ROOT / "BENCHMARKS.md"
    scan_bytes, keys, p4_keys, p4_segment, verify_keys = (args.scan_bytes, args.keys, args.p4_keys, P4_SEGMENT,
                                                          args.verify_keys)
    if args.quick:
        scale, results, out = QUICK, DATA / "quick" / "results", args.out or DATA / "quick" / "BENCHMARKS.md"
        scan_bytes, keys = int(scan_bytes * QUICK), "40000,80000"
        p4_keys, p4_segment, verify_keys = int(p4_keys * QUICK), int(P4_SEGMENT * QUICK), int(verify_keys * QUICK)
    p2_none = None
    if "P1" in wanted:
        save(results, "P1", bench_scan(scan_bytes))
    if "P2" in wanted:
        runs = [bench_e2e("none", scale, profile=True), bench_e2e("lz4", scale, profile=True)]
        p2_none = runs[0]
        save(results, "P2", runs)
    if "P2K" in wanted:
        save(results, "P2K", bench_kafka_shape(scale))
    if "P4" in wanted:
        save(results, "P4", bench_skipping(p4_keys, p4_segment))
    if "P5" in wanted:
        save(results, "P5", bench_scaling(scale, p2_none))
    if "P6" in wanted:
        save(results, "P6", bench_hot(scale, p2_none))
    if "P3" in wanted:
        save(results, "P3", [bench_cardinality(int(k), scale) for k in keys.split(",")])
    if "P7" in wanted:
        save(results, "P7", bench_verify(verify_keys, scale))
    if "P8" in wanted:
        save(results, "P8", [bench_table(*shape, scale=scale) for shape in P8_SHAPES])
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, results)
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
