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
Also P1 (scan vs raw read + CRC-32C, one core), P3 (5 M / 20 M / 50 M keys, memory), P0 (a ~10 MB run vs
Spark's own start), P0c (a fresh clone's first run vs its second, and the kernels compiled for this CPU vs the
generic ones; `bench_fresh.py`) and P9 (issue 29 item 4: a Kafka broker tiering through kcompact's plugin and a
consumer reading the tier through it, beside Kafka's stock topic-based metadata manager; `bench_broker.py`) and P9S
(issue 40 item 4: the same on an s3:// store, a moto server, with and without the plugin's chunk cache: bytes fetched
from the store per byte served, and the Java consumer's rate on the tier against the local log's;
`bench_broker_s3.py`), P10 (issue 44: Kafka's own cleaner and kcompact on the same partition directories, MB/s per
core side by side, peak RSS, and whether their records are equal; `bench_cleaner.py`), and P11 (issue 41 item 7:
the same bytes over 8, 100 and 1,000 partitions, every command a fresh process; `bench_partitions.py`). Every
end-to-end figure is also measured as users run it: fresh `kcompact compact` processes
(`bench_measure.cli_processes`), the first one its own column; that whole-process figure is the headline, the
in-session one (`bench_run.py`, session start-up excluded) beside it.

Workloads are cached under bench-data/ (keyed by their options; `bench_workloads.py`); each compaction run is a
fresh process (`scripts/bench_run.py`) on a hard-linked copy of a store tiered once (`bench_measure.py`). Figures
are kept per benchmark under bench-data/results/, so `--only P4` refreshes one section of BENCHMARKS.md and keeps
the others (each says when it was measured); `bench_render.py` writes the file, with the notes of bench_notes.md.
`--quick` shrinks every workload (~1/64) to check the harness end to end in a few minutes:
its data, results and report go under bench-data/quick/, never to BENCHMARKS.md.
Never part of `make test`: timings belong here, not in unit tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_fresh import bench_fresh
from bench_measure import (
    bench_cardinality,
    bench_e2e,
    bench_hot,
    bench_kafka_shape,
    bench_scaling,
    bench_scan,
    bench_skipping,
    bench_small,
    bench_table,
    bench_verify,
    save,
)
from bench_render import SECTIONS, write_report
from bench_workloads import DATA, P4_KEYS, P4_SEGMENT, P8_SHAPES, QUICK, ROOT

RESULTS = DATA / "results"


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
    if "P0" in wanted:
        save(results, "P0", bench_small(scale))
    if "P0C" in wanted:
        save(results, "P0C", bench_fresh(scale))
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
    if "P9" in wanted:
        from bench_broker import bench_broker  # a Kafka broker per run: needs `make kafka`'s jars and plugin

        save(results, "P9", bench_broker(scale))
    if "P9S" in wanted:
        from bench_broker_s3 import bench_broker_s3  # a broker per run on a moto server: `make kafka`, moto

        save(results, "P9S", bench_broker_s3(scale))
    if "P10" in wanted:
        from bench_cleaner import bench_cleaner  # Kafka's Cleaner in its own JVM: needs `make kafka`'s harness

        save(results, "P10", bench_cleaner(scale))
    if "P11" in wanted:
        from bench_partitions import bench_partitions

        save(results, "P11", bench_partitions(scale if args.quick else 1.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(out, results)
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
