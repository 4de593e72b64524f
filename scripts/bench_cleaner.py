"""P10 (issue 44): Kafka's own cleaner and kcompact side by side, on the same partition directories, in one run.

For each shape, the same generated log dir is cleaned twice:

- **Kafka**: a copy of the dir cleaned in place by Kafka 4.2.1's `Cleaner` (`kafka/cleaner-harness`'s `CleanerBench`)
  as one broker cleaner thread with the broker's defaults (`log.cleaner.dedupe.buffer.size` 128 MiB,
  `log.cleaner.io.buffer.size` 512 KiB, load factor 0.9, no throttle), round after round until nothing cleanable is
  left (a round cleans what its offset map holds: a shape whose keys overflow it takes several). The JVM runs as a
  broker's would (G1, C2, `-Xmx1g`) and first cleans a warm-up dir of other data, untimed: the time inside the JVM is
  the cleaning rounds alone; the whole process's is beside it.
- **kcompact**: the dir tiered once into a store (`bench_workloads.tiered`), compacted with only `cleanup.policy`
  set, `local[2]`: in session (session start excluded, the median of three fresh processes,
  `bench_measure.compaction_of_copy`), in a session that has compacted before (each of those processes then compacts
  another copy of the same bytes, as a notebook's or a long-lived driver's next run; the median of the three: Kafka's
  figure is likewise its JVM's clean after a warm-up one) and as fresh `kcompact compact` processes
  (`bench_measure.cli_processes`).

Both clean the same bytes: every segment but each partition's active one (the tier leaves it local; Kafka's cleaner
never cleans it). MB/s = those bytes / seconds; kcompact's per core = its MB/s / the 2 cores it ran on; the ratio
= kcompact's per core / Kafka's per thread. Peak RSS: Kafka's JVM, and kcompact's driver, JVM and Python workers.

**Results equal**: after the runs, each partition's records as Kafka's cleaner left them (its segments up to the
active one, in offset order) and as kcompact's compaction left them (the live segments in the store) are scanned
and compared record by record (offset, timestamp, key, value; control records left out): a digest of each side,
and the count of records. A faster path can never be a different one.

Run: `make bench BENCH_ARGS="--only P10"` (`--quick` for ~1/64 sizes).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from bench_measure import NOW_MS, cli_processes, compaction, compaction_of_copy, raw_crc_mb_s
from bench_run import MemorySampler
from bench_workloads import DATA, ROOT, bulk, copy_store, kafka_workload, log_bytes, rolled_logs, tiered

sys.path.insert(0, str(ROOT))

from compaction.format.scan import scan_segment
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.storage.layout import Suffix
from tests.kafka_runtime import LOG4J, classpath, java

CORES = 2
"""kcompact's `local[2]`: the cores its MB/s per core divides by."""

HEAP = "1g"
"""The cleaner JVM's heap: a broker's default (`kafka-server-start.sh`), which holds the 128 MiB offset map."""


def shapes(scale: float) -> list[tuple[str, str, Path, list[str]]]:
    """(name, what, log dir, the command that wrote it) per shape, each generated once under bench-data/."""
    found: list[tuple[str, str, Path, list[str]]] = []
    logdir, args, _seconds = kafka_workload(scale)
    found.append(("P2K", "P2K: kafka-python, 2 partitions, 100-byte values, 64 MiB segments", logdir,
                  ["python", "scripts/kafka_workload.py", *args]))
    # segments sized so that every shape has several per partition (the generated values compress: ~1.6x under
    # lz4, ~16x under zstd), at full size and at --quick's
    for name, what, values, codec, records, keys, partitions, segment in (
        ("1k-lz4", "1 KiB values, lz4, 2 partitions", 1024, "lz4", 500_000, 100_000, 2, 64 * 2**20),
        ("4k-zstd", "4 KiB values, zstd, 2 partitions", 4096, "zstd", 500_000, 100_000, 2, 16 * 2**20),
        ("overflow", "12 M keys in one partition: Kafka's map holds ~5 M a round", 20, "none", 14_000_000,
         12_000_000, 1, 64 * 2**20),
    ):
        n, k = max(1000, int(records * scale)), max(100, int(keys * scale))
        args = ["--topics", f"p10{name.replace('-', '')}:{partitions}", "--records", str(n), "--keys", str(k),
                "--key-order", "uniform", "--value-bytes", str(values), "--records-per-batch", "200",
                "--segment-bytes", str(max(2**16, int(segment * scale))), "--codecs", codec,
                "--tombstone-ratio", "0.01", "--seed", "17"]
        found.append((name, what, bulk(f"p10-{name}-{n}", *args), ["kcompact", "generate", "--bulk", *args]))
    return found


def kafka_clean(logdir: Path, work: Path, warmup: Path) -> dict[str, Any]:
    """Kafka's cleaner over a fresh copy of every partition dir of `logdir` (and a fresh copy of `warmup` first):
    seconds inside the JVM, the whole process's, rounds, bytes before and after, peak RSS; the cleaned copy stays
    in `work` for the comparison."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(logdir), str(work / "log")], check=True)  # a copy: Kafka rewrites indexes in place
    subprocess.run(["cp", "-r", str(warmup), str(work / "warmup")], check=True)
    parts = sorted(p for p in (work / "log").iterdir() if p.is_dir())
    warm = sorted(p for p in (work / "warmup").iterdir() if p.is_dir())
    cmd = [java(), f"-Xmx{HEAP}", f"-Dlog4j2.configurationFile={LOG4J}", f"-Dkafka.logs.dir={work}",
           "-cp", classpath("cleaner-harness"), "dev.kcompact.cleaner.CleanerBench", "--now", str(NOW_MS),
           *[a for w in warm for a in ("--warmup", str(w))], *map(str, parts)]
    print("running Kafka's cleaner:", " ".join(cmd[-len(parts) - 2 * len(warm) - 3:]), file=sys.stderr)
    sampler = MemorySampler()
    sampler.start()
    started = time.perf_counter()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    process_seconds = time.perf_counter() - started
    peaks = sampler.stop()
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    partitions = [{"dir": Path(r[0]).name, "seconds": float(r[1]), "rounds": int(r[2]), "bytes_before": int(r[3]),
                   "bytes_after": int(r[4]), "bytes_read": int(r[5]), "messages_read": int(r[6]),
                   "messages_written": int(r[7])} for r in rows]
    return {"seconds": sum(p["seconds"] for p in partitions), "process_seconds": process_seconds,
            "rounds": max(p["rounds"] for p in partitions), "partitions": partitions, "peak_rss_bytes": peaks["jvm"],
            "command": "java -Xmx1g -cp ... dev.kcompact.cleaner.CleanerBench --now NOW [--warmup DIR]... DIR..."}


def _digest_binary(h: Any, array: pa.Array) -> None:
    """Feed `array` (binary or large_binary, nulls allowed) into `h`: its validity, lengths and bytes."""
    array = array.cast(pa.large_binary())
    valid = np.asarray(array.is_valid(), dtype=np.bool_)
    h.update(valid.tobytes())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset: array.offset + len(array) + 1]
    h.update(np.diff(offsets).tobytes())
    data = array.buffers()[2]
    if data is not None and len(array):
        h.update(memoryview(data)[offsets[0]:offsets[-1]])


def records_digest(segments: list[bytes], where: str) -> dict[str, Any]:
    """The records of `segments` (one partition's, in offset order) as a digest and a count."""
    h, count = hashlib.blake2b(digest_size=16), 0
    for i, data in enumerate(segments):
        records = scan_segment(data, obj=f"{where}#{i}", with_values=True).records
        records = records.filter(pa.compute.invert(records.column("control")))
        count += records.num_rows
        for name in ("offset", "timestamp"):
            h.update(np.asarray(records.column(name).combine_chunks()).astype(np.int64).tobytes())
        for name in ("key", "value"):
            _digest_binary(h, records.column(name).combine_chunks())
    return {"records": count, "digest": h.hexdigest()}


def kafka_records(work: Path) -> dict[str, dict[str, Any]]:
    """Per partition dir: the records of Kafka's cleaned segments (the active one, never cleaned, left out)."""
    found = {}
    for part in sorted(p for p in (work / "log").iterdir() if p.is_dir()):
        logs = sorted(part.glob("*.log"))[:-1]
        found[part.name] = records_digest([f.read_bytes() for f in logs], str(part))
    return found


def kcompact_records(store_dir: Path) -> dict[str, dict[str, Any]]:
    """Per partition: the records of the live segments kcompact's compaction left in `store_dir`."""
    store = open_store(str(store_dir))
    snapshot = table_in_store(store).snapshot()
    found = {}
    for tp in sorted(snapshot.partitions):
        live = sorted(snapshot.live_segments(tp.topic, tp.partition), key=lambda s: s.start_offset)
        keys = [s.object_key(Suffix.LOG) for s in live]
        found[f"{tp.topic}-{tp.partition}"] = records_digest([store.get(k) for k in keys if k], store.uri)
    return found


def bench_shape(name: str, what: str, logdir: Path, command: list[str], warmup: Path) -> dict[str, Any]:
    work = DATA / "p10" / name
    input_bytes = log_bytes(logdir)
    if not input_bytes:
        raise SystemExit(f"P10 {name}: {logdir} has no segment but the active ones: nothing for either to clean")
    kafka = kafka_clean(logdir, work, warmup)
    pristine = tiered(logdir, logdir.name)
    cli = cli_processes(pristine, {})
    run, wall = compaction_of_copy(pristine, again=1)
    checked = copy_store(pristine, "p10-check")
    compaction(checked)
    ours, theirs = kcompact_records(checked), kafka_records(work)
    shutil.rmtree(checked, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    kafka_mb_s = input_bytes / kafka["seconds"] / 1e6
    mb_s = input_bytes / wall / 1e6
    again_mb_s = input_bytes / run["again_wall"] / 1e6  # the session's second compaction (another copy)
    raw = raw_crc_mb_s(rolled_logs(logdir))
    return {
        "shape": name, "what": what, "command": " ".join(command), "input_bytes": input_bytes,
        "partitions": len(theirs),
        "kafka": {**kafka, "mb_s": kafka_mb_s, "process_mb_s": input_bytes / kafka["process_seconds"] / 1e6},
        "kcompact": {"wall_seconds": wall, "mb_s": mb_s, "mb_s_per_core": mb_s / CORES,
                     "process_first_mb_s": input_bytes / cli["first_seconds"] / 1e6,
                     "process_mb_s": input_bytes / cli["median_seconds"] / 1e6, "cli": cli,
                     "run_walls": run.get("run_walls"), "memory_peak_bytes": run.get("memory_peak_bytes"),
                     "again_walls": run.get("again_walls"), "again_mb_s_per_core": again_mb_s / CORES},
        "ratio_session": mb_s / CORES / kafka_mb_s,
        "ratio_session_again": again_mb_s / CORES / kafka_mb_s,
        "ratio_fresh": input_bytes / cli["median_seconds"] / 1e6 / CORES / kafka_mb_s,
        "raw_mb_s": raw, "raw_share": mb_s / raw,  # as P2 and the issue count it: the run's MB/s over one core's raw
        "equal": ours == theirs, "records": {"kafka": theirs, "kcompact": ours},
    }


def bench_cleaner(scale: float) -> list[dict[str, Any]]:
    """P10 over every shape; the warm-up dir is a small workload of its own."""
    warmup = bulk(f"p10-warmup-{int(200_000 * max(scale, 1 / 16))}", "--topics", "p10warm:1", "--records",
                  str(int(200_000 * max(scale, 1 / 16))), "--keys", "50000", "--key-order", "uniform",
                  "--value-bytes", "100", "--segment-bytes", str(4 * 2**20), "--seed", "3")
    results = [bench_shape(name, what, logdir, command, warmup) for name, what, logdir, command in shapes(scale)]
    unequal = [r["shape"] for r in results if not r["equal"]]
    if unequal:
        print(f"P10: kcompact's records differ from Kafka's cleaner's on {unequal}: "
              f"{json.dumps([r['records'] for r in results if not r['equal']])}", file=sys.stderr)
    return results


__all__ = ["bench_cleaner"]
