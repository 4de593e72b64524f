"""`make bench`: measured figures written to BENCHMARKS.md, each side by side with its reference.

P1 scan: the numba columnar scan of generated segments (uncompressed ~100-byte records) vs reading the
same bytes and computing their CRC-32C, both on one core, in the same run. Target: scan >= 40% of it.

Workloads come from `kcompact generate` and are cached under bench-data/ (keyed by their options).
Never part of `make test`: timings belong here, not in unit tests.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import crc32c

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench-data"


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


def write_report(results: dict[str, dict[str, object]], path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# kcompact benchmarks",
        "",
        f"Measured {now} by `make bench` (`python scripts/bench.py`) on: {machine()}.",
        "Each figure is the best of 3 runs, side by side with its reference in the same process run.",
        "",
    ]
    if "scan" in results:
        r = results["scan"]
        lines += [
            "## P1 — segment scan vs raw read + CRC-32C (one core)",
            "",
            f"Workload: `kcompact generate {r['workload']}` — {r['files']} uncompressed segments, "
            f"{int(r['bytes']) / 2**30:.2f} GiB, {int(r['records']):,} records (~100-byte values).",  # type: ignore[call-overload]
            "",
            "| measurement | MB/s | records/s |",
            "|---|---|---|",
            f"| raw read + CRC-32C of the same bytes | {float(r['raw_mb_s']):,.0f} | — |",  # type: ignore[arg-type]
            f"| columnar scan (numba) → Arrow | {float(r['scan_mb_s']):,.0f} | "  # type: ignore[arg-type]
            f"{float(r['scan_records_s']):,.0f} |",  # type: ignore[arg-type]
            "",
            f"Scan / reference: **{100 * float(r['ratio']):.0f}%** (target ≥ 40%).",  # type: ignore[arg-type]
            "",
        ]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scan-bytes", type=int, default=1_100_000_000, help="bytes of segments for P1")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    results = {"scan": bench_scan(args.scan_bytes)}
    write_report(results, args.out)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
