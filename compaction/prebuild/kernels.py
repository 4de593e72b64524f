"""Compile every kernel into the caches beside their modules: `python -m compaction.prebuild.kernels`.

`make venv` runs it in the checkout and `make dist` (scripts/pack_env.py) in the environment it packs, so that no
run compiles: not a fresh clone's first `kcompact compact`, not an executor of a new Spark application. numba
compiles a kernel once per argument types, so the warm-up calls the library's own entry points (scan, rank, fold,
filter, rewrite, verify, the bulk generator) on a small generated log dir with every codec, transactions, aborts,
tombstones and headers, as a run calls them, rather than the kernels with arguments of its own making.

Each CPU is built in a process of its own (numba reads NUMBA_CPU_NAME when it starts): this machine's, whose
entries a process here loads, and `generic`, whose entries any CPU of the architecture loads when it has none of
its own (`cache.KernelCache`). Idempotent: an entry already cached is loaded, not compiled again.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numba
import numpy as np
import pyarrow as pa

import compaction
from compaction.kernels.cache import GENERIC_CPU

CPUS = ("host", GENERIC_CPU)
HEADER = "version"


def warm_up(workdir: Path) -> None:
    """Call every kernel once through the code that calls it in a run, on a log dir generated under `workdir`."""
    from compaction.bloom.filter import BUCKETED_BYTES, KeyFilter
    from compaction.bloom.hashing import key_hashes
    from compaction.bloom.segment import filter_part, segment_filter
    from compaction.config import CompactionStrategy
    from compaction.format.scan import scan_records, scan_segment
    from compaction.generate import WorkloadSpec, generate_logdir
    from compaction.generate.bulk import generate_bulk_logdir
    from compaction.generate.bulk_spec import BulkSpec
    from compaction.generate.topics import TopicSpec
    from compaction.rewrite.group import SegmentInput, rewrite_group
    from compaction.strategies.keyfold import KeyFold
    from compaction.strategies.packed_fold import merged_folds, pack_fold
    from compaction.strategies.winner import fold_segment, segment_best
    from compaction.topic_table.target import table_schema
    from compaction.topic_table.winners import table_changes_of
    from compaction.verify.columnar import carried_tombstones, view_rows

    generate_logdir(workdir / "log", WorkloadSpec(topics=(TopicSpec("warm", 1),), records_per_partition=600,
                                                  keys=40, segment_bytes=8 * 1024, seed=27))
    generate_bulk_logdir(workdir / "bulk", BulkSpec(topics=(TopicSpec("bulk", 1),), records_per_partition=200,
                                                    keys=50))
    consumed: list[pa.Table] = []
    large = KeyFilter.build(np.arange(900_000, dtype=np.uint64), 1e-9)  # its bits set a region at a time
    assert large.m // 8 > BUCKETED_BYTES, large.m
    for log in sorted((workdir / "log").rglob("*.log")):
        data, obj = log.read_bytes(), str(log)
        for header in (None, HEADER):
            scan = scan_segment(data, obj=obj, header_key=header)
        records = scan_records(data, obj=obj)  # the consumer read (read_partition, the topic table's input)
        batches = records.consumer_batches(np.flatnonzero(records.ranges[0] >= 0))
        consumed.extend(t for t in (pa.Table.from_batches([b]) for b in batches) if t.num_rows)
        for strategy in CompactionStrategy:
            for records in buffer_kinds(scan.records):
                segment_best(records, (), strategy)
            view_rows(data, obj=obj, strategy=strategy, header=HEADER, aborted=(), below=2**62)
        key_filter = segment_filter(scan, 0.01)
        filter_part(data, obj=obj)  # a rewrite's output piece, its keys read from its records (bytes: read-only)
        for records in buffer_kinds(scan.records):
            for keys in (records["key"], records["key"].chunk(0)):  # a table's column, a batch's (the skip step)
                hashes = key_hashes(keys)
                key_filter.positives(hashes)
                hashes.setflags(write=False)  # as Spark's Arrow columns arrive
                key_filter.positives(hashes)
        carried_tombstones(data, obj=obj)
        base = int(log.stem)
        winners = np.unique(scan.records["offset"].to_numpy()).astype(np.int64)
        rewrite_group([SegmentInput(data, base, obj)], winners, upper_bound_offset=2**62, now_ms=0,
                      delete_retention_ms=0)
    for log in sorted([*(workdir / "log").rglob("*.log"), *(workdir / "bulk").rglob("*.log")]):
        # as a large chunk's rewrite: each piece filtered as it comes, the indexes built from the pieces (a plain
        # segment's piece is the rewrite kernel's own buffer: writable, a type of its own to numba)
        data, obj = log.read_bytes(), str(log)
        scanned = scan_segment(data, obj=obj).records
        winners = np.unique(scanned["offset"].to_numpy()).astype(np.int64)
        outgrown = KeyFold(capacity=4)  # a fold that outgrows its table, then reserves: every key slotted again
        fold_segment(outgrown, scanned, (), CompactionStrategy.OFFSET, True)
        outgrown.reserve(4 * outgrown.keys + 64)

        def filtered(piece: bytes | memoryview, _hashes: np.ndarray | None, obj: str = obj) -> None:
            filter_part(piece, obj=obj)

        rewrite_group([SegmentInput(data, int(log.stem), obj)], winners, upper_bound_offset=2**62, now_ms=0,
                      delete_retention_ms=0, on_written=filtered)
    for strategy in CompactionStrategy:  # the topic table's fold: one task's records, from one segment or several
        for held in (consumed[:1], consumed):
            table_changes_of(held, 0, 1, strategy, HEADER, table_schema(strategy))
    for ranked in (False, True):  # the fused job's merge of folds a task received through Spark: read-only columns
        fold = KeyFold()
        fold_segment(fold, scan.records, (), CompactionStrategy.OFFSET, True)
        merged_folds([pa.py_buffer(p.to_pybytes()) for p in pack_fold(fold.result(), ranked)])


def buffer_kinds(table: pa.Table) -> list[pa.Table]:
    """`table` as the scan makes it, with buffers Arrow allocated (writable to numpy) and as read from Arrow IPC
    (read-only): a kernel compiles once per array type, and mutability is part of it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    read_only = pa.ipc.open_stream(pa.py_buffer(sink.getvalue().to_pybytes())).read_all()
    allocated = pa.Table.from_pylist(table.to_pylist(), schema=table.schema)
    return [table, allocated, read_only]


def cached_entries(package: Path) -> Counter[str]:
    """How many compiled entries the caches under `package` hold, per CPU name (numba's index files)."""
    counts: Counter[str] = Counter()
    for index in package.rglob("__pycache__/*.nbi"):
        with index.open("rb") as f:
            if pickle.load(f) != numba.__version__:
                continue
            _stamp, overloads = pickle.loads(f.read())
        counts.update(key[1][1] for key in overloads)
    return counts


def build(cpu: str) -> float:
    """Run the warm-up in a fresh process compiling for `cpu` ("host" or "generic"); its wall time in seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    if cpu != "host":
        env["NUMBA_CPU_NAME"] = cpu
    started = time.perf_counter()
    isolated = ["-I"] if sys.flags.isolated else []  # pack_env.py: the packed environment's compaction, no other
    subprocess.run([sys.executable, *isolated, "-m", "compaction.prebuild.kernels", "--warm-up"], env=env, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", choices=(*CPUS, "both"), default="both")
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.warm_up:
        with tempfile.TemporaryDirectory(prefix="kcompact-kernels-") as tmp:
            warm_up(Path(tmp))
        return
    package = Path(compaction.__file__).parent
    for cpu in CPUS if args.cpu == "both" else (args.cpu,):
        seconds = build(cpu)
        print(f"kernels for the {cpu} CPU cached in {seconds:.1f} s", file=sys.stderr)
    counts = ", ".join(f"{n} for {name}" for name, n in sorted(cached_entries(package).items()))
    print(f"compiled kernels under {package}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
