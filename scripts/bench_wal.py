"""`make bench-wal`: the WAL's figures, on two shapes, into BENCHMARKS.md's "W" section.

Per shape, on a local store (the request counters are the store's own, the same on S3):

- upload: `kcompact wal upload` of a whole bulk-generated log dir (>= 1 GiB: every segment, rolled and active, goes
  to combined objects of 4 MiB), wall time, objects and PUTs per GB;
- read: one partition read back through `compaction.reader` (tier empty, all WAL): GETs per GB and bytes fetched /
  bytes needed;
- roll: `kcompact wal roll` at a --now past segment.ms (everything rolls), in a fresh process on local[2]: wall time
  including the Spark session, MB/s of WAL data rolled, GETs and PUTs per GB (driver plus executors).

Each step runs in its own process on the cached log dir (bench-data/, git-ignored). The section it writes replaces
the previous "## W" section of BENCHMARKS.md and keeps everything else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_measure import machine
from bench_render import WAL_SECTION, note, section_span

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench-data"
START_MS = 1_700_000_000_000
NOW_MS = START_MS + 30 * 86_400_000  # past segment.ms (7 days) for every record: the whole WAL rolls
OBJECT_BYTES = 4 * 1024 * 1024
SHAPES = {
    # name: (partitions, records per partition, value bytes, records per batch, segment bytes)
    "W8": (8, 1_050_000, 120, 200, 64 * 2**20),
    "W64": (64, 150_000, 100, 50, 8 * 2**20),
}


def kcompact(*args: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "compaction.cli", *args, "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"kcompact {' '.join(args[:2])} exited {proc.returncode}")
    return json.loads(proc.stdout), wall


SCALE = float(os.environ.get("KCOMPACT_BENCH_WAL_SCALE", "1"))  # < 1: a quick check of the harness


def logdir_for(name: str) -> Path:
    partitions, records, value, per_batch, segment = SHAPES[name]
    records = int(records * SCALE)
    logdir = DATA / f"wal-{name}" if SCALE == 1 else DATA / "quick" / f"wal-{name}"
    if not (logdir / ".complete").exists():
        shutil.rmtree(logdir, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "compaction.cli", "generate", "--bulk", "--logdir", str(logdir),
                        "--topics", f"wal:{partitions}", "--records", str(records),
                        "--keys", str(records // 4), "--key-order", "uniform", "--value-bytes",
                        str(value), "--records-per-batch", str(per_batch), "--segment-bytes", str(segment),
                        "--codecs", "none", "--start-ms", str(START_MS)], check=True)
        (logdir / ".complete").write_text(name)
    return logdir


def log_bytes(logdir: Path) -> int:
    return sum(f.stat().st_size for f in logdir.glob("*/*.log"))


def read_partition_requests(store: Path) -> dict[str, Any]:
    code = (
        "import json, sys\n"
        "from compaction.storage import open_store\n"
        "from compaction.reader import consumer_records, log_refs\n"
        "s = open_store(sys.argv[1])\n"
        "refs = log_refs(s, 'wal', 0)\n"
        "needed = sum(r.end_position - r.start_position for r in refs)\n"
        "n = sum(1 for _ in consumer_records(s, refs))\n"
        "print(json.dumps({'records': n, 'needed': needed, **vars(s.stats)}))\n"
    )
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout), "wall": time.monotonic() - started}


def measure(name: str) -> dict[str, Any]:
    logdir = logdir_for(name)
    store = logdir.parent / f"wal-{name}-store"
    shutil.rmtree(store, ignore_errors=True)
    config = DATA / "wal-bench.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n")
    upload, upload_wall = kcompact("wal", "upload", "--logdir", str(logdir), "--store", str(store), "--now",
                                   str(NOW_MS), "--max-object-bytes", str(OBJECT_BYTES))
    read = read_partition_requests(store)
    roll, roll_wall = kcompact("wal", "roll", "--store", str(store), "--config", str(config), "--now", str(NOW_MS))
    wal_bytes = sum(p["wal_bytes"] for p in roll["partitions"])
    executor = {k: sum(p[k] for p in roll["partitions"]) for k in ("gets", "puts")}
    return {
        "shape": name,
        "partitions": SHAPES[name][0],
        "log_bytes": log_bytes(logdir),
        "upload": {"wall": upload_wall, "objects": upload["objects"], "bytes": upload["bytes"],
                   "puts": upload["requests"]["puts"]},
        "read": read,
        "roll": {"wall": roll_wall, "wal_bytes": wal_bytes, "segments": roll["segments_rolled"],
                 "gets": roll["requests"]["gets"] + executor["gets"],
                 "puts": roll["requests"]["puts"] + executor["puts"],
                 "task_seconds": sum(p["seconds"] for p in roll["partitions"]), "job_seconds": roll["job_seconds"]},
    }


def section(results: list[dict[str, Any]], machine: str) -> str:
    lines = [
        "## W — the WAL: upload, read, roll (issue 15)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine} by `make bench-wal` (scripts/bench_wal.py), local store, "
        f"combined objects of {OBJECT_BYTES // 2**20} MiB (the default), uncompressed batches from "
        "`kcompact generate --bulk`. "
        "Roll wall time is the whole `kcompact wal roll` process on local[2], Spark session start included (in "
        "parentheses: its Spark job alone); "
        "requests are the store's counters (driver and executors); Delta commits of the WAL and metadata tables "
        "are not in them (a few per run).",
        "",
        "| shape | WAL data | upload | objects | upload PUTs/GB | read GETs/GB (fetched/needed) | roll (job) | "
        "roll MB/s (job) | roll GETs/GB | roll PUTs/GB | segments |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gb = r["upload"]["bytes"] / 1e9
        read_gb = r["read"]["needed"] / 1e9
        roll_gb = r["roll"]["wal_bytes"] / 1e9
        lines.append(
            f"| {r['shape']}: {r['partitions']} partitions | {r['upload']['bytes'] / 2**30:.2f} GiB | "
            f"{r['upload']['wall']:.1f} s | {r['upload']['objects']} | {r['upload']['puts'] / gb:.0f} | "
            f"{r['read']['gets'] / read_gb:.0f} ({r['read']['bytes_read'] / max(1, r['read']['needed']):.3f}) | "
            f"{r['roll']['wall']:.1f} s ({r['roll']['job_seconds']:.1f} s) | "
            f"{r['roll']['wal_bytes'] / 1e6 / r['roll']['wall']:.0f} "
            f"({r['roll']['wal_bytes'] / 1e6 / r['roll']['job_seconds']:.0f}) | "
            f"{r['roll']['gets'] / roll_gb:.0f} | {r['roll']['puts'] / roll_gb:.0f} | {r['roll']['segments']} |"
        )
    lines += [
        "",
        "What the columns show, and why the shapes differ:",
        "",
        note("W columns"),
        "- roll: the Spark job (ranged GETs, CRC-32C of every batch, index and producer-state build, uploads; two "
        "tasks at a time) ran at " + " and ".join(
            f"{r['roll']['wal_bytes'] / 1e6 / r['roll']['job_seconds']:.0f} MB/s with {r['partitions']} partitions"
            for r in results) + " (more and smaller tasks, each with its own store session, producer-state read and "
        "uploads). The rest of the process (" + " / ".join(
            f"{r['roll']['wall'] - r['roll']['job_seconds']:.1f} s" for r in results) + ") is the Spark session "
        "start and the driver's metadata commits (two per roll since the batched commits of issue 41: every "
        "partition's fencing epoch in one, every partition's segments in the other) and its per-partition planning.",
        "",
    ]
    extra = os.environ.get("KCOMPACT_BENCH_NOTE")
    if extra:
        lines += [extra, ""]
    return "\n".join(lines)


def write(section_text: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    span = section_span(text, WAL_SECTION)
    if span is not None:  # replace it where it is (scripts/bench.py keeps it after its own sections)
        start, end = span
        rest = text[end:].lstrip("\n")
        text = text[:start] + section_text.rstrip("\n") + "\n" + ("\n" + rest if rest else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section_text
    path.write_text(text)


def main() -> int:

    if "--render" in sys.argv:  # rewrite the section from the saved figures
        write(section(json.loads((DATA / "results" / "W.json").read_text()), machine()))
        return 0
    results = [measure(name) for name in SHAPES]
    print(json.dumps(results, indent=2))
    if SCALE != 1:
        return 0
    (DATA / "results").mkdir(parents=True, exist_ok=True)
    (DATA / "results" / "W.json").write_text(json.dumps(results, indent=2))
    write(section(results, machine()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
