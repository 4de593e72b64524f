"""Benchmark-scale Kafka log dirs, fast: the engine behind `kcompact generate --bulk`.

`generate.workload` writes a realistic mixture (Zipf keys, idempotent and transactional producers, every
codec, headers, out-of-order timestamps, epoch changes) record by record in Python: fine for tests and the
demo, far too slow for the tens of millions of keys the benchmarks need. This
package writes the same kind of partition directory — rolled segments plus an active one, `.index` and
`.timeindex` by Kafka's index.interval.bytes rule (computed from the batch sizes without reading the log back,
byte-identical to `indexes.build_indexes`), an (empty) producer `.snapshot` at every roll,
`leader-epoch-checkpoint` and `partition.metadata` with the same topic ids (`topics.topic_ids`) — with
no Python per record: a numba kernel encodes whole runs of batches (headers included)
into one buffer, Python only adds each batch's CRC-32C (and compresses its records section when a codec is
set) and streams the bytes to the segment files. Each segment costs a few file creations, so benchmark-scale
runs want benchmark-scale --segment-bytes (e.g. 128 MiB), not the 256 KiB default.

The workload is deliberately plain; what it gives up compared with `workload`:

- one non-idempotent, non-transactional producer per partition (producer id/epoch/base sequence −1), so no
  control batches, no `.txnindex` and empty producer snapshots; leader epoch 0 throughout;
- one codec for every batch, exactly `records_per_batch` records per batch (the last one may hold fewer);
- CreateTime timestamps `start_ms + offset · ms_per_record`, never going backwards; no record headers;
- keys `key-%010d` (14 bytes) over `keys` ids per partition, `sequential` (ids 0..K−1 once, in order, then
  uniform draws) or `uniform`; values of exactly `value_bytes` printable bytes (slices of a seeded pool),
  or null (a tombstone) with probability `tombstone_ratio`;
- then, for the "a small share of the keys changes" benchmarks, round(update_fraction · K) records that
  rewrite distinct keys with fresh non-null values: a contiguous run of ids at a seeded position
  (`clustered`) or a seeded random sample (`random`, in random order).

Everything is a pure function of `BulkSpec` and the topic-partition (record content is a counter-based hash
of the seed and the offset: `bulk_records`), so a partition's bytes do not depend on chunking or on `jobs`,
and `bulk_records.reference_records` recomputes any partition's records in plain Python for tests. Existing
segment files of a partition directory (20-digit `.log`/`.index`/`.timeindex`/`.txnindex`/`.snapshot`) are
removed first so a rerun never leaves a mixture.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from compaction.errors import ConfigError
from compaction.format.batch import make_attributes
from compaction.format.checkpoints import EpochEntry
from compaction.format.codecs import Codec
from compaction.generate.bulk_records import LEADER_EPOCH, encode_batches, partition_draws
from compaction.generate.bulk_report import BulkPartitionResult, BulkProgress, BulkSummary
from compaction.generate.bulk_segments import SegmentStream, write_compressed, write_plain
from compaction.generate.bulk_spec import BulkSpec
from compaction.generate.logdir import LogDirWriter
from compaction.generate.topics import iter_partitions, topic_ids

CHUNK_BYTES = 8 * 2**20
"""The kernel encodes about this many bytes of batches per call."""


def generate_partition(
    directory: Path,
    spec: BulkSpec,
    topic: str,
    partition: int,
    topic_id: str,
    progress: Callable[[BulkProgress], None] | None = None,
    progress_interval_s: float = 5.0,
) -> BulkPartitionResult:
    """Write one partition directory. `progress` is called every `progress_interval_s` and once at the end."""
    started = time.perf_counter()
    files = LogDirWriter(directory, spec.index_interval_bytes)
    files.clear_segments()
    draws = partition_draws(spec, topic, partition)
    end = spec.log_end_offset
    rpb = spec.records_per_batch
    batches_per_chunk = max(1, CHUNK_BYTES // spec.batch_bound)
    buf = np.empty(batches_per_chunk * spec.batch_bound, dtype=np.uint8)
    bounds = np.empty(batches_per_chunk + 1, dtype=np.int64)
    attributes = make_attributes(spec.codec)
    stream = SegmentStream(files, spec)
    last_report = started
    try:
        for first in range(0, end, batches_per_chunk * rpb):
            n_batches = min(batches_per_chunk, -(-(end - first) // rpb))
            encode_batches(spec, draws, buf, bounds, first, n_batches)
            starts = bounds[: n_batches + 1].tolist()
            if spec.codec is Codec.NONE:
                write_plain(stream, buf, starts, first)
            else:
                write_compressed(stream, buf, starts, first, attributes)
            now = time.perf_counter()
            if progress is not None and now - last_report >= progress_interval_s:
                last_report = now
                done = min(end, first + n_batches * rpb)
                progress(BulkProgress(topic, partition, done, end, stream.total, len(stream.bases), now - started))
        stream.finish()
    except BaseException:
        stream.abort()
        raise
    files.write_partition_files(topic_id, [EpochEntry(LEADER_EPOCH, 0)])
    seconds = time.perf_counter() - started
    if progress is not None:
        progress(BulkProgress(topic, partition, end, end, stream.total, len(stream.bases), seconds, done=True))
    return BulkPartitionResult(
        topic, partition, topic_id, end, stream.total, tuple(stream.bases), seconds, spec.updates_per_partition
    )


def generate_bulk_logdir(
    logdir: Path,
    spec: BulkSpec,
    *,
    jobs: int = 1,
    progress: Callable[[BulkProgress], None] | None = None,
    progress_interval_s: float = 5.0,
) -> BulkSummary:
    """Write every partition of `spec` under `logdir`, `jobs` partitions at a time (worker processes).

    With jobs > 1 `progress` must be picklable (a top-level function such as `print_progress`).
    The bytes written do not depend on `jobs`.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    started = time.perf_counter()
    logdir.mkdir(parents=True, exist_ok=True)
    ids = topic_ids(spec.topics, spec.seed)
    parts = list(iter_partitions(spec.topics))
    calls = [
        (logdir / f"{topic}-{partition}", spec, topic, partition, ids[topic], progress, progress_interval_s)
        for topic, partition in parts
    ]
    if jobs == 1 or len(parts) == 1:
        results = [generate_partition(*call) for call in calls]
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(parts)), mp_context=context) as pool:
            futures = [pool.submit(generate_partition, *call) for call in calls]
            results = [f.result() for f in futures]
    return BulkSummary(tuple(results), time.perf_counter() - started)
