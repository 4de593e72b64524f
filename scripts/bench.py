"""`make bench`: measured figures written to BENCHMARKS.md, each side by side with its reference.

P1 scan: the numba columnar scan of generated segments (uncompressed ~100-byte records) vs reading the
   same bytes and computing their CRC-32C, both on one core, in the same run. Target: scan >= 40% of it.
P2 end to end: one compaction run (plan, stage, commit) in Spark local[2] over >= 1 GiB of tiered
   segments, uncompressed and lz4, with the time split. Reference: Kafka's cleaner at 16.5 MB/s.
P3 cardinality: 5 M, 20 M and 50 M distinct keys, one run each; peak memory of the Python driver, the
   JVM and the Python workers.
P4 skipping: 1% of the keys updated after a compacted round; bytes read from the cleaned region vs the
   bytes of the segments that really hold an updated key; plus the filter rate sweep on the same segments.
P5 scaling: the P2 workload at 1/16, 1/4 and 1 of its size; time per byte vs linear.

Workloads come from `kcompact generate` (`--bulk` for P2-P5) and are cached under bench-data/ (keyed by their
options); each compaction run is a fresh process (`scripts/bench_run.py`) on a hard-linked copy of a store
tiered once. Figures are kept per benchmark under bench-data/results/, so `--only P4` refreshes one section
of BENCHMARKS.md and keeps the others (each says when it was measured).
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
NOW_MS = 1_800_000_000_000  # generated timestamps start at 1.7e12: everything is old enough to clean
PROFILED = ("none", "lz4")
KAFKA_MB_S = 16.5  # peers.md §6: Kafka's cleaner on a 25.7 GB production partition


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
        cmd = [sys.executable, "-m", "compaction.cli", "generate", "--logdir", str(logdir), *args]
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
        n = 0
        for f in files:
            data = f.read_bytes()
            crc32c.crc32c(data)
            n += len(data)
        return n

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


def log_bytes(logdir: Path, rolled_only: bool = True) -> int:
    """Bytes of the .log files a tier run uploads (every partition's active segment stays local)."""
    total = 0
    for part in sorted(p for p in logdir.iterdir() if p.is_dir()):
        logs = sorted(part.glob("*.log"))
        total += sum(f.stat().st_size for f in (logs[:-1] if rolled_only else logs))
    return total


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
        (pristine / ".complete").write_text("ok")
    return pristine


def copy_store(pristine: Path, name: str) -> Path:
    """A private copy of a store: hard links (objects and Delta files are never modified in place)."""
    target = pristine.parent / name
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", str(pristine), str(target)], check=True)
    return target


def compaction(store: Path, *options: str) -> dict[str, Any]:
    """One run of `scripts/bench_run.py` (a fresh process and SparkSession) on `store`; its JSON figures."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_run.py"), str(store), "--now-ms", str(NOW_MS), *options]
    print("running:", " ".join(cmd[1:]), file=sys.stderr)
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"] or result["committed"] != result["partitions"]:
        raise SystemExit(f"compaction of {store} failed: {result['errors']}")
    print("  ", {k: result[k] for k in ("phases", "bytes_read", "memory_peak_bytes")}, file=sys.stderr)
    return result


def compaction_of_copy(pristine: Path, *options: str) -> tuple[dict[str, Any], float]:
    """`compaction` on a throwaway copy of `pristine`: its figures, and its wall time (plan + stage + commit)."""
    run = compaction(copy_store(pristine, "run"), *options)
    shutil.rmtree(pristine.parent / "run", ignore_errors=True)
    return run, run["phases"]["plan"] + run["phases"]["stage"] + run["phases"]["commit"]


def e2e_args(scale: float, codec: str) -> list[str]:
    """P2/P5's workload at `scale` (1 = the >= 1 GiB one): 8 partitions, ~110-byte values, ~4.5 versions per
    key, segments scaled with the data so every partition has the same number of them."""
    records = int((1_600_000 if codec == "none" else 2_000_000) * scale)  # >= 1 GiB of rolled segments
    return [
        "--topics", "e2e:8", "--records", str(records), "--keys", str(max(1, int(300_000 * scale))),
        "--key-order", "uniform", "--value-bytes", "100", "--records-per-batch", "200",
        "--segment-bytes", str(int(32 * 2**20 * scale)), "--codecs", codec, "--tombstone-ratio", "0.01",
        "--seed", "11",
    ]


def bench_e2e(codec: str, scale: float = 1.0) -> dict[str, Any]:
    """P2 (and P5's points): one compaction of the tiered workload; input MB/s over its wall time."""
    args = e2e_args(scale, codec)
    name = f"e2e-{codec}-{args[3]}"
    logdir = bulk(name, *args)
    pristine = tiered(logdir, name)
    run, wall = compaction_of_copy(pristine, "--fpp", "0.01", "--min-dirty-ratio", "0.01")
    profile = None
    if scale == 1.0 and codec in PROFILED:  # where the map phase goes, on the same segments (nothing committed)
        cmd = [sys.executable, str(ROOT / "scripts" / "bench_run.py"), str(pristine), "--now-ms", str(NOW_MS),
               "--profile-map"]
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        profile = json.loads(done.stdout.strip().splitlines()[-1])["map_profile"]
    return {"workload": " ".join(args), "codec": codec, "scale": scale, "input_bytes": log_bytes(logdir),
            "wall_seconds": wall, "mb_s": run["bytes_read"] / wall / 1e6, "map_profile": profile, **run}


def bench_cardinality(keys: int) -> dict[str, Any]:
    """P3: `keys` distinct keys (every key once, then 50% more updates), small values; memory peaks.

    Every key's first record lies in a rolled (tiered) segment; the run's `dirty_keys` counts them."""
    args = [
        "--topics", "card:8", "--records", str(int(keys * 1.5) // 8), "--keys", str(keys // 8),
        "--key-order", "sequential", "--value-bytes", "16", "--records-per-batch", "500",
        "--segment-bytes", str(16 * 2**20), "--codecs", "none", "--tombstone-ratio", "0", "--seed", "5",
    ]
    name = f"card-{keys}"
    run, wall = compaction_of_copy(tiered(bulk(name, *args), name), "--min-dirty-ratio", "0.01",
                                   "--driver-memory", "6g")
    return {"workload": " ".join(args), "keys": keys, "wall_seconds": wall, **run}


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


def bench_skipping(keys_per_partition: int = P4_KEYS) -> dict[str, Any]:
    """P4: round 1 compacts a base where every key appears once; then 1% of the keys (a contiguous range of
    ids per partition) are updated and round 2 runs. Bytes read from the cleaned region (clean segments
    rewritten + filters read) vs the bytes of the clean segments that really hold an updated key."""
    from compaction.format.scan import scan_segment
    from compaction.metadata import ObjectSuffix, table_in_store
    from compaction.report import bloom_sizing
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    per_segment = _records_per_segment(400, 100, P4_SEGMENT)
    keys = (keys_per_partition // per_segment) * per_segment  # the base ends on a segment boundary
    sizing = bloom_sizing(0.01, int(P4_FRACTION * keys), clean_segments=1)  # what the report suggests
    assert sizing is not None
    fpp = sizing["suggested_fpp"]
    args = ["--topics", "skip:2", "--records", str(keys), "--keys", str(keys), "--key-order", "sequential",
            "--value-bytes", "400", "--records-per-batch", "100", "--segment-bytes", str(P4_SEGMENT),
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
    topic_config = ["--topic-config", f"segment.bytes={P4_SEGMENT}"]
    pristine = tiered(base, f"{name}-{fpp:.1e}")
    store_dir = copy_store(pristine, "run")
    first = compaction(store_dir, "--fpp", str(fpp), "--min-dirty-ratio", "0.01", *topic_config)
    store = open_store(str(store_dir))
    table = table_in_store(store)
    tier_logdir(_rolled(full), store, table, NOW_MS - 86_400_000)
    clean = {p: [s for s in table.live_segments("skip", p) if s.end_offset < keys] for p in (0, 1)}
    updated = {p: _updated_keys(full / f"skip-{p}", keys) for p in (0, 1)}
    clean_keys = {p: [(s, scan_segment(store.get(s.object_key(ObjectSuffix.LOG) or "")).records["key"])
                      for s in clean[p]] for p in (0, 1)}
    clean_bytes = sum(s.segment_size_bytes for p in (0, 1) for s in clean[p])
    overlap = sum(s.segment_size_bytes for p in (0, 1) for s, k in clean_keys[p] if _holds(k, updated[p]))
    second = compaction(store_dir, "--fpp", str(fpp), "--min-dirty-ratio", "0.001", *topic_config)
    shutil.rmtree(store_dir, ignore_errors=True)
    read = second["clean_bytes_rewritten"] + second["filter_bytes_read"]
    return {
        "workload": " ".join(args), "fpp": fpp, "keys": 2 * keys,
        "dirty_per_partition": int(P4_FRACTION * keys), "clean_bytes": clean_bytes,
        "clean_segments": sum(len(c) for c in clean.values()), "overlap_bytes": overlap, "read_bytes": read,
        "first": first, "second": second, "sweep": _sweep(clean_keys, updated, clean_bytes, overlap),
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


def _sweep(clean_keys: dict[int, list[Any]], updated: dict[int, Any], clean_bytes: int, overlap: int
           ) -> list[dict[str, Any]]:
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
    for fpp in P4_SWEEP:
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


def bench_scaling(p2: dict[str, Any] | None) -> dict[str, Any]:
    """P5: the P2 (uncompressed) workload at 1/16 and 1/4 of its size, and P2's own run as the 16x point."""
    points = [bench_e2e("none", 1 / 16), bench_e2e("none", 1 / 4), p2 or bench_e2e("none", 1.0)]
    return {"points": points}


# --- BENCHMARKS.md ------------------------------------------------------------------------------------------


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


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


def _split(r: dict[str, Any]) -> str:
    ph, t = r["phases"], r["task_seconds"]
    return (f"plan {ph['plan']:.1f} s · map (scan + winners) {r['map_seconds']:.1f} s · rewrite + upload "
            f"{r['rewrite_seconds']:.1f} s · commit {ph['commit']:.2f} s (session start-up {ph['session']:.1f} s, "
            f"not counted) — executor task time: scan {t['scan']:.1f} s, download {t['download']:.1f} s, "
            f"rewrite {t['rewrite']:.1f} s, upload {t['upload']:.1f} s")


def _p2(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["Workload: `kcompact generate --bulk " + runs[0]["workload"].replace(" --codecs none", " --codecs C")
             + "`, tiered into a local store; one run of `plan → stage → commit` in local[2] "
             "(`scripts/bench_run.py`); MB/s = segment bytes read by the run / its wall time (plan + stage + commit). "
             "Session start-up (JVM, Python workers, numba kernels loaded in them) is measured apart, as a "
             "long-lived executor has paid it already.",
             "",
             "| codec | input (tiered) | records in → out | output | wall | MB/s | × Kafka's 16.5 MB/s |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['codec']} | {_gib(r['bytes_read'])} | {r['records_read']:,} → {r['records_written']:,} | "
                     f"{_mb(r['bytes_written'])} | {r['wall_seconds']:.1f} s | **{r['mb_s']:.1f}** | "
                     f"{r['mb_s'] / KAFKA_MB_S:.1f}× |")
    lines.append("")
    lines += [f"- {r['codec']}: {_split(r)}" for r in runs]
    lines += ["", "Target ≥ 100 MB/s (≥ 6× Kafka).", "", "Where the map phase goes (the same segments, each step a "
              "Spark job of its own, warm; `bench_run.py --profile-map`):", "",
              "| codec | segments | rows to the JVM (per-segment bests) | distinct keys | scan + hand-over | "
              "+ hash aggregate & shuffle | + persist | scan task time (summed) |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.get("map_profile")
        if p:
            lines.append(f"| {r['codec']} | {p['segments']} | {p['rows_to_jvm']:,} | {p['keys']:,} | "
                         f"{p['scan']:.1f} s | {p['aggregate']:.1f} s | {p['persist']:.1f} s | "
                         f"{p['task_scan']:.1f} s |")
    return lines


def _p3(runs: list[dict[str, Any]]) -> list[str]:
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
              "plans and per-partition results only: its peak does not move with the keys. In local mode the JVM is "
              "also the executor: its growth is the executor's (the per-key rows, cached for the rewrite, and the "
              "shuffle), within its fixed heap (`spark.driver.memory`); on a cluster that part is spread over "
              "executors. A Python worker's peak is set by its rewrite chunk (≤ segment.bytes of input and its "
              "output, memory-mapped) and its winners' offsets (8 bytes per surviving key of the chunk)."]
    return lines


def _p4(r: dict[str, Any]) -> list[str]:
    s = r["second"]
    share = r["read_bytes"] / r["clean_bytes"]
    overlap = r["overlap_bytes"] / r["clean_bytes"]
    lines = [
        f"Workload: `kcompact generate --bulk {r['workload']}`: {r['keys']:,} keys, each once, compacted "
        f"(round 1, filters at bloom.filter.fpp = {r['fpp']:.1e}, the report's suggestion for "
        f"{r['dirty_per_partition']:,} dirty keys per partition); then 1% of them updated (a contiguous range of ids "
        "per partition), tiered, and round 2 runs.",
        "",
        "| cleaned region (round 2) | bytes | share |",
        "|---|---|---|",
        f"| total: {r['clean_segments']} segments | {_mb(r['clean_bytes'])} | 100% |",
        f"| segments that really hold an updated key (overlap) | {_mb(r['overlap_bytes'])} | {100 * overlap:.2f}% |",
        f"| read by the run: segments rewritten + filters | {_mb(r['read_bytes'])} | **{100 * share:.2f}%** |",
        f"| of which filters | {_mb(s['filter_bytes_read'])} | "
        f"{100 * s['filter_bytes_read'] / r['clean_bytes']:.2f}% |",
        f"| not downloaded ({s['segments_skipped']} segments kept unread) | {_mb(s['bytes_not_downloaded'])} | "
        f"{100 * s['bytes_not_downloaded'] / r['clean_bytes']:.2f}% |",
        "",
        f"Segments read although they hold no updated key: {s.get('false_positive_segments', '?')} filter false "
        f"positive(s), {s.get('segments_merged', '?')} small segment(s) merged into a rewritten neighbour.",
        "",
        f"Read / total = {100 * share:.2f}% vs overlap + 2% = {100 * overlap + 2:.2f}% "
        f"(target: read ≤ overlap + 2%). Round 2 took {r['second']['phases']['stage']:.1f} s to stage "
        f"(round 1: {r['first']['phases']['stage']:.1f} s).",
        "",
        "Filter rate sweep on the same clean segments (filters rebuilt in process at each rate; share of the "
        "cleaned region read = segments testing positive + all filters):",
        "",
        "| bloom.filter.fpp | clustered 1%: read (overlap) | filters alone | random 1%: read (overlap) |",
        "|---|---|---|---|",
    ]
    for row in r["sweep"]:
        c, rnd = row["clustered"], row["random"]
        lines.append(f"| {row['fpp']:g} | {100 * c['read']:.1f}% ({100 * c['overlap']:.1f}%) | "
                     f"{100 * c['filters']:.2f}% | {100 * rnd['read']:.1f}% ({100 * rnd['overlap']:.1f}%) |")
    lines += ["", "With keys spread at random, 1% of them touch almost every segment: no filter can help there."]
    return lines


def _p5(r: dict[str, Any]) -> list[str]:
    points = sorted(r["points"], key=lambda p: p["scale"])
    base, top = points[0], points[-1]
    a, b = fit(points)  # a: what a run costs whatever its size (Spark jobs, commits); b: per MB
    xs = [p["bytes_read"] / 1e6 for p in points]
    lines = ["The P2 uncompressed workload at 1/16, 1/4 and 1 of its size (records, keys and segment.bytes "
             "scaled together, 8 partitions each; the 16× point is P2's run).",
             "", "| input | wall | MB/s | time ratio vs 1× | input ratio | fit a + b·MB | vs fit |",
             "|---|---|---|---|---|---|---|"]
    for p, x in zip(points, xs, strict=True):
        predicted = a + b * x
        lines.append(f"| {_mb(p['bytes_read'])} ({16 * p['scale']:g}×) | {p['wall_seconds']:.1f} s | "
                     f"{p['mb_s']:.1f} | {p['wall_seconds'] / base['wall_seconds']:.2f} | "
                     f"{p['bytes_read'] / base['bytes_read']:.2f} | {predicted:.1f} s | "
                     f"{100 * (p['wall_seconds'] / predicted - 1):+.0f}% |")
    marginal = (top["wall_seconds"] - base["wall_seconds"]) / ((top["bytes_read"] - base["bytes_read"]) / 1e6)
    lines += ["", f"Fit: a = {a:.1f} s per run whatever its size, b = {1000 * b:.1f} ms per MB "
              f"({1 / b:.0f} MB/s marginal; 1× → 16×: {1000 * marginal:.1f} ms per added MB). Time grows less than "
              "linearly because the fixed part is amortised; the per-byte part is linear when every point is within "
              "15% of the fit. Target: within 15% of linear."]
    return lines


SECTIONS: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "P1": ("P1 — segment scan vs raw read + CRC-32C (one core)", _p1),
    "P2": ("P2 — end to end, ≥ 1 GiB, local[2]", _p2),
    "P3": ("P3 — key cardinality and memory", _p3),
    "P4": ("P4 — skipping clean segments when 1% of keys change", _p4),
    "P5": ("P5 — scaling 1× / 4× / 16×", _p5),
}


def save(figure: str, result: Any) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (RESULTS / f"{figure}.json").write_text(json.dumps({"measured": now, "machine": machine(), "result": result}))


def write_report(path: Path) -> None:
    lines = [
        "# kcompact benchmarks",
        "",
        "Written by `make bench` (`python scripts/bench.py`; `--only P2,P4` refreshes some sections and keeps the "
        "others). Each section names its workload, machine and date. Never part of `make test`.",
        "",
    ]
    saved = {f: json.loads((RESULTS / f"{f}.json").read_text()) for f in SECTIONS if (RESULTS / f"{f}.json").exists()}
    lines += summary({f: d["result"] for f, d in saved.items()})
    for figure, (title, render) in SECTIONS.items():
        if figure not in saved:
            continue
        data = saved[figure]
        lines += [f"## {title}", "", f"Measured {data['measured']} on {data['machine']}.", "",
                  *render(data["result"]), ""]
    path.write_text("\n".join(lines) + "\n")


def fit(points: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares wall seconds = a + b * MB over P5's points."""
    xs, ys = [p["bytes_read"] / 1e6 for p in points], [p["wall_seconds"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def summary(r: dict[str, Any]) -> list[str]:
    """Targets vs figures, and what stops the ones that are not met (from the figures themselves)."""
    rows = []
    if "P1" in r:
        rows.append(("P1 scan vs read + CRC", "≥ 40%", f"{100 * r['P1']['ratio']:.0f}%", r["P1"]["ratio"] >= 0.4))
    if "P2" in r:
        rates = ", ".join(f"{x['codec']} {x['mb_s']:.0f} MB/s" for x in r["P2"])
        rows.append(("P2 end to end, local[2]", "≥ 100 MB/s", rates, min(x["mb_s"] for x in r["P2"]) >= 100))
    if "P3" in r:
        top = max(r["P3"], key=lambda x: x["keys"])
        drivers = " → ".join(f"{x['memory_peak_bytes']['driver_python'] / 1e6:.0f}" for x in r["P3"])
        flat = max(x["memory_peak_bytes"]["driver_python"] for x in r["P3"]) <= 1.25 * min(
            x["memory_peak_bytes"]["driver_python"] for x in r["P3"])
        rows.append(("P3 cardinality", "50 M keys in one run, flat driver memory",
                     f"{top['dirty_keys'] / 1e6:.1f} M keys in {top['wall_seconds']:.0f} s; driver MB {drivers}",
                     top["dirty_keys"] >= 50_000_000 and flat))
    if "P4" in r:
        p4 = r["P4"]
        read, overlap = 100 * p4["read_bytes"] / p4["clean_bytes"], 100 * p4["overlap_bytes"] / p4["clean_bytes"]
        rows.append(("P4 skipping, 1% keys", "read ≤ overlap + 2%", f"{read:.2f}% vs {overlap:.2f}% + 2%",
                     read <= overlap + 2))
    if "P5" in r:
        a, b = fit(r["P5"]["points"])
        worst = max(abs(p["wall_seconds"] / (a + b * p["bytes_read"] / 1e6) - 1) for p in r["P5"]["points"])
        rows.append(("P5 scaling 1×/4×/16×", "within 15% of linear", f"a + b·MB within {100 * worst:.0f}%",
                     worst <= 0.15))
    lines = ["## Summary", "", "| figure | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {target} | {value} | {'yes' if ok else '**no**'} |" for name, target, value, ok in rows]
    if "P2" in r and "P5" in r:
        a, b = fit(r["P5"]["points"])
        p2 = r["P2"][0]
        prof = p2.get("map_profile") or {}
        cores = 2
        per_row = 1e6 * cores * max(prof.get("aggregate", 0) - prof.get("task_scan", 0) / cores, 0) / max(
            prof.get("rows_to_jvm", 1), 1)
        lines += ["", "**What stops P2 at this size on 2 cores** (numbers from the sections below): every run pays "
                  f"a fixed a = {a:.1f} s whatever its size (P5's fit: the first Spark jobs of a fresh JVM, "
                  f"~10 jobs and stages with Python tasks, per-partition fencing and commits), "
                  f"{100 * a / p2['wall_seconds']:.0f}% of the {p2['wall_seconds']:.0f} s P2 run; the rest runs at "
                  f"{1 / b:.0f} MB/s marginal. Within the map phase the executors' own scan work is "
                  f"{prof.get('task_scan', 0):.1f} s of task time for {prof.get('rows_to_jvm', 0):,} rows, while "
                  f"handing those rows to the JVM, Spark's hash aggregate and shuffle to "
                  f"{prof.get('keys', 0):,} keys take {prof.get('aggregate', 0):.1f} s wall: the per-row cost of "
                  f"Spark's row format (~{per_row:.1f} µs per row per core beyond the scan), paid once per distinct "
                  "key per segment. More "
                  "cores or executors divide the marginal part (the work is partitioned by key and by segment); "
                  "the fixed part is per run, so larger runs amortise it (P5)."]
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="P1,P2,P3,P4,P5", help="comma-separated figures to measure (default all)")
    parser.add_argument("--scan-bytes", type=int, default=1_100_000_000, help="bytes of segments for P1")
    parser.add_argument("--keys", default="5000000,20000000,50000000", help="P3's distinct key counts")
    parser.add_argument("--p4-keys", type=int, default=P4_KEYS, help="P4's keys per partition (2 partitions)")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    wanted = {f.strip().upper() for f in args.only.split(",") if f.strip()}
    unknown = wanted - SECTIONS.keys()
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    p2_none = None
    if "P1" in wanted:
        save("P1", bench_scan(args.scan_bytes))
    if "P2" in wanted:
        runs = [bench_e2e("none"), bench_e2e("lz4")]
        p2_none = runs[0]
        save("P2", runs)
    if "P4" in wanted:
        save("P4", bench_skipping(args.p4_keys))
    if "P5" in wanted:
        save("P5", bench_scaling(p2_none))
    if "P3" in wanted:
        save("P3", [bench_cardinality(int(k)) for k in args.keys.split(",")])
    write_report(args.out)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
