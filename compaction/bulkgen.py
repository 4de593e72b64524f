"""Benchmark-scale Kafka log dirs, fast: the engine behind `kcompact generate --bulk`.

`compaction.workload` writes a realistic mixture (Zipf keys, idempotent and transactional producers, every
codec, headers, out-of-order timestamps, epoch changes) record by record in Python, at ~25 µs a record. That
is fine for tests and the demo, far too slow for the tens of millions of keys the benchmarks need. This
module writes the same kind of partition directory — rolled segments plus an active one, `.index` and
`.timeindex` by Kafka's index.interval.bytes rule (computed from the batch sizes without reading the log back,
byte-identical to `indexes.build_indexes`), an (empty) producer `.snapshot` at every roll,
`leader-epoch-checkpoint` and `partition.metadata` with the same topic ids as `workload.topic_ids_for` — at
millions of records a second on one core: a numba kernel encodes whole runs of batches (headers included)
into one buffer, Python only adds each batch's CRC-32C (and compresses its records section when a codec is
set) and streams the bytes to the segment files. Each segment costs a few file creations, so benchmark-scale
runs want benchmark-scale --segment-bytes (e.g. 128 MiB), not the 256 KiB default.

The workload is deliberately plain; what it gives up compared with `workload.py`:

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
of the seed and the offset), so a partition's bytes do not depend on chunking or on `jobs`, and
`reference_records` recomputes any partition's records in plain Python for tests. Existing segment files of
a partition directory (20-digit `.log`/`.index`/`.timeindex`/`.txnindex`/`.snapshot`) are removed first so a
rerun never leaves a mixture.
"""

from __future__ import annotations

import multiprocessing
import random
import re
import struct
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import crc32c as _crc32c
import numba
import numpy as np

from compaction.errors import ConfigError
from compaction.format.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
    make_attributes,
)
from compaction.format.checkpoints import (
    EpochEntry,
    encode_leader_epoch_checkpoint,
    encode_partition_metadata,
    write_checkpoint_file,
)
from compaction.format.codecs import Codec, compress
from compaction.format.indexes import DEFAULT_INDEX_INTERVAL_BYTES
from compaction.format.producer_snapshot import encode_producer_snapshot
from compaction.format.segment import INDEX_SUFFIX, LOG_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, segment_path
from compaction.workload import TopicSpec, WorkloadSpec, topic_ids_for

KEY_ORDERS = ("sequential", "uniform")
UPDATE_SPREADS = ("clustered", "random")
KEY_PREFIX = b"key-"
KEY_DIGITS = 10
KEY_BYTES = len(KEY_PREFIX) + KEY_DIGITS  # 14
MAX_KEYS = 10**KEY_DIGITS
VALUE_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"
POOL_BYTES = 64 * 1024
"""Values are `value_bytes` slices of a seeded pool of POOL_BYTES + value_bytes printable bytes."""
CHUNK_BYTES = 8 * 2**20
"""The kernel encodes about this many bytes of batches per call."""
LEADER_EPOCH = 0
_INT32_MAX = 2**31 - 1
_RECORD_BOUND = 5 + 1 + 10 + 5 + 1 + KEY_BYTES + 5 + 1
"""Upper bound of a record's size without its value: length, attributes, ts delta, offset delta, key, value
length, header count varints."""
_SEGMENT_FILE = re.compile(r"[0-9]{20}\.(log|index|timeindex|txnindex|snapshot)")
_CRC = struct.Struct(">I")
_OFFSET_ENTRY = struct.Struct(">ii")  # .index: relativeOffset, position
_TIME_ENTRY = struct.Struct(">qi")  # .timeindex: timestamp, relativeOffset
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_EMPTY_SNAPSHOT = encode_producer_snapshot([])  # a plain producer has no state a broker snapshots

# splitmix64 (Steele, Lea, Flood 2014): state = seed + i·golden, then the finaliser.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_M64 = (1 << 64) - 1
_GOLDEN_U = np.uint64(_GOLDEN)
_MIX1_U = np.uint64(_MIX1)
_MIX2_U = np.uint64(_MIX2)


@dataclass(frozen=True)
class BulkSpec:
    """Everything that determines a bulk log dir. Validated on construction (ConfigError, exit code 2)."""

    topics: tuple[TopicSpec, ...] = (TopicSpec("bench", 1),)
    records_per_partition: int = 1_000_000
    keys: int = 1_000_000
    value_bytes: int = 100
    records_per_batch: int = 100
    segment_bytes: int = 128 * 2**20
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    codec: Codec = Codec.NONE
    tombstone_ratio: float = 0.03
    key_order: str = "sequential"
    update_fraction: float = 0.0
    update_spread: str = "clustered"
    start_ms: int = 1_700_000_000_000
    ms_per_record: int = 50
    seed: int = 42

    def __post_init__(self) -> None:
        problems = []
        if not self.topics:
            problems.append("at least one topic is needed")
        for t in self.topics:
            if t.partitions < 1:
                problems.append(f"topic {t.name!r} needs at least one partition")
        if self.records_per_partition < 0:
            problems.append(f"--records must be >= 0, got {self.records_per_partition}")
        if not 1 <= self.keys < MAX_KEYS:
            problems.append(f"--keys must be in [1, {MAX_KEYS - 1}] (keys are key-%010d), got {self.keys}")
        if self.value_bytes < 0:
            problems.append(f"--value-bytes must be >= 0, got {self.value_bytes}")
        if self.records_per_batch < 1:
            problems.append(f"--records-per-batch must be >= 1, got {self.records_per_batch}")
        elif self.batch_bound > _INT32_MAX:
            problems.append("--records-per-batch × --value-bytes: a batch would exceed 2 GiB")
        if not 1 <= self.segment_bytes <= _INT32_MAX:
            problems.append(f"--segment-bytes must be in [1, {_INT32_MAX}], got {self.segment_bytes}")
        if self.index_interval_bytes < 0:
            problems.append(f"index interval must be >= 0, got {self.index_interval_bytes}")
        if not 0.0 <= self.tombstone_ratio <= 1.0:
            problems.append(f"--tombstone-ratio must be in [0, 1], got {self.tombstone_ratio}")
        if self.key_order not in KEY_ORDERS:
            problems.append(f"--key-order must be one of {', '.join(KEY_ORDERS)}, got {self.key_order!r}")
        if not 0.0 <= self.update_fraction <= 1.0:
            problems.append(f"--update-fraction must be in [0, 1], got {self.update_fraction}")
        if self.update_spread not in UPDATE_SPREADS:
            problems.append(
                f"--update-spread must be one of {', '.join(UPDATE_SPREADS)}, got {self.update_spread!r}"
            )
        if self.ms_per_record < 0:
            problems.append(f"--ms-per-record must be >= 0, got {self.ms_per_record}")
        if self.codec not in tuple(Codec):
            problems.append(f"unknown codec {self.codec!r}")
        if problems:
            raise ConfigError("bulk generate: " + "; ".join(problems))

    @property
    def updates_per_partition(self) -> int:
        """Records appended after `records_per_partition`, each rewriting a distinct key."""
        return round(self.update_fraction * self.keys)

    @property
    def log_end_offset(self) -> int:
        return self.records_per_partition + self.updates_per_partition

    @property
    def batch_bound(self) -> int:
        """Upper bound of an uncompressed batch's size."""
        return RECORD_BATCH_OVERHEAD + self.records_per_batch * (_RECORD_BOUND + self.value_bytes)


@dataclass(frozen=True)
class BulkProgress:
    """A partition's progress so far (also its final state when `done`)."""

    topic: str
    partition: int
    records: int
    records_total: int
    bytes: int
    segments: int
    seconds: float
    done: bool = False

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        pct = 100.0 * self.records / self.records_total if self.records_total else 100.0
        return (
            f"{self.topic}-{self.partition}: {self.records}/{self.records_total} records ({pct:.0f}%), "
            f"{self.bytes / 2**20:.1f} MiB, {self.segments} segments, {self.seconds:.1f} s, "
            f"{self.records_per_s / 1e6:.2f} M records/s, {self.bytes / 2**20 / max(self.seconds, 1e-9):.0f} MiB/s"
        )


def print_progress(p: BulkProgress) -> None:
    """A `progress` callback printing one line to stderr (top level, so worker processes can use it)."""
    print(("done " if p.done else "") + p.line(), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BulkPartitionResult:
    """What was written for one partition."""

    topic: str
    partition: int
    topic_id: str
    log_end_offset: int
    bytes: int
    segment_bases: tuple[int, ...]
    seconds: float
    updated_keys: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "topic_id": self.topic_id,
            "log_end_offset": self.log_end_offset,
            "bytes": self.bytes,
            "segments": len(self.segment_bases),
            "updated_keys": self.updated_keys,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class BulkSummary:
    """A whole bulk run: per partition results and totals."""

    partitions: tuple[BulkPartitionResult, ...]
    seconds: float

    @property
    def records(self) -> int:
        return sum(p.log_end_offset for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def segments(self) -> int:
        return sum(len(p.segment_bases) for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        return {
            "records": self.records,
            "bytes": self.bytes,
            "segments": self.segments,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(rate),
            "mib_per_s": round(self.bytes / 2**20 / self.seconds, 1) if self.seconds > 0 else 0.0,
            "partitions": [p.to_dict() for p in self.partitions],
        }

    def line(self) -> str:
        d = self.to_dict()
        return (
            f"{len(self.partitions)} partitions, {self.records} records, {self.bytes / 2**20:.1f} MiB in "
            f"{self.segments} segments, {self.seconds:.1f} s ({d['records_per_s'] / 1e6:.2f} M records/s, "
            f"{d['mib_per_s']} MiB/s)"
        )


# --- per-partition randomness ----------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionPlan:
    """The seeded choices of one partition: hash seeds, the value pool and the updated key ids."""

    key_seed: int
    tombstone_seed: int
    value_seed: int
    pool: np.ndarray = field(repr=False)
    update_start: int
    update_ids: np.ndarray = field(repr=False)  # empty when clustered

    def updated_key(self, i: int) -> int:
        """Key id of the i-th update record."""
        return int(self.update_ids[i]) if len(self.update_ids) else self.update_start + i


def partition_plan(spec: BulkSpec, topic: str, partition: int) -> PartitionPlan:
    """The seeded choices of a partition (from the seed, topic and partition only)."""
    rng = random.Random(f"bulk/{spec.seed}/{topic}/{partition}")
    key_seed, tombstone_seed, value_seed, np_seed = (rng.getrandbits(64) for _ in range(4))
    gen = np.random.default_rng(np_seed)
    alphabet = np.frombuffer(VALUE_ALPHABET, dtype=np.uint8)
    pool = alphabet[gen.integers(0, len(alphabet), POOL_BYTES + spec.value_bytes)]
    n_updates = spec.updates_per_partition
    update_start = 0
    update_ids = np.empty(0, dtype=np.int64)
    if spec.update_spread == "clustered":
        update_start = int(gen.integers(0, spec.keys - n_updates + 1))
    elif n_updates:
        update_ids = gen.choice(spec.keys, size=n_updates, replace=False, shuffle=True).astype(np.int64)
    return PartitionPlan(key_seed, tombstone_seed, value_seed, pool, update_start, update_ids)


def _tombstone_threshold(ratio: float) -> int:
    """A record is a tombstone iff the top 53 bits of its hash are below this."""
    return round(ratio * 2**53)


def _mix64_py(state: int) -> int:
    z = state & _M64
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def _draw_py(seed: int, offset: int) -> int:
    return _mix64_py(seed + offset * _GOLDEN)


def reference_records(spec: BulkSpec, topic: str, partition: int) -> Iterator[tuple[int, int, bytes, bytes | None]]:
    """(offset, timestamp, key, value) of every record of a partition, in plain Python (slow; for tests)."""
    plan = partition_plan(spec, topic, partition)
    pool = plan.pool.tobytes()
    span = len(pool) - spec.value_bytes + 1
    threshold = _tombstone_threshold(spec.tombstone_ratio)
    n = spec.records_per_partition
    for offset in range(spec.log_end_offset):
        if offset >= n:
            key_id, tomb = plan.updated_key(offset - n), False
        else:
            if spec.key_order == "sequential" and offset < spec.keys:
                key_id = offset
            else:
                key_id = _draw_py(plan.key_seed, offset) % spec.keys
            tomb = (_draw_py(plan.tombstone_seed, offset) >> 11) < threshold
        start = _draw_py(plan.value_seed, offset) % span
        value = None if tomb else pool[start : start + spec.value_bytes]
        yield offset, spec.start_ms + offset * spec.ms_per_record, b"key-%010d" % key_id, value


# --- the kernel ------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _draw(seed: np.uint64, offset: int) -> Any:
    """splitmix64 of (seed + offset·golden): uniform 64 bits, a pure function of seed and offset."""
    z = seed + np.uint64(offset) * _GOLDEN_U
    z = (z ^ (z >> np.uint64(30))) * _MIX1_U
    z = (z ^ (z >> np.uint64(27))) * _MIX2_U
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _put_varint(out: np.ndarray, pos: int, value: int) -> int:
    """Zigzag varint of a value in [-2^62, 2^62) at pos; returns the next position."""
    v = (np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63))
    while v >= 0x80:
        out[pos] = np.uint8((v & 0x7F) | 0x80)
        v >>= 7
        pos += 1
    out[pos] = np.uint8(v)
    return pos + 1


@numba.njit(cache=True, nogil=True)
def _varint_len(value: int) -> int:
    v = (np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63))
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _put_be(out: np.ndarray, pos: int, value: int, nbytes: int) -> None:
    """Big-endian two's complement of `value` in `nbytes` bytes."""
    v = np.int64(value)
    for j in range(nbytes):
        out[pos + nbytes - 1 - j] = np.uint8(v & 0xFF)
        v >>= 8


@numba.njit(cache=True, nogil=True)
def _encode_batches(
    out: np.ndarray,
    bounds: np.ndarray,
    first_offset: int,
    n_batches: int,
    records_per_batch: int,
    end_offset: int,
    n_main: int,
    keys: int,
    sequential: bool,
    key_seed: np.uint64,
    tombstone_seed: np.uint64,
    tombstone_threshold: np.uint64,
    value_seed: np.uint64,
    pool: np.ndarray,
    value_bytes: int,
    update_ids: np.ndarray,
    update_start: int,
    start_ms: int,
    ms_per_record: int,
    leader_epoch: int,
) -> int:
    """Encode `n_batches` uncompressed v2 batches from `first_offset` into `out`, CRC field left 0.

    bounds[b] is where batch b starts, bounds[n_batches] the end; returns that end.
    """
    span = np.uint64(pool.shape[0] - value_bytes + 1)
    ukeys = np.uint64(keys)
    value_len_size = _varint_len(value_bytes)
    pos = 0
    for b in range(n_batches):
        base = first_offset + b * records_per_batch
        n = min(records_per_batch, end_offset - base)
        start = pos
        bounds[b] = start
        pos += 61
        for i in range(n):
            offset = base + i
            if offset >= n_main:
                u = offset - n_main
                key_id = update_ids[u] if update_ids.shape[0] > 0 else update_start + u
                tomb = False
            else:
                key_id = offset if sequential and offset < keys else np.int64(_draw(key_seed, offset) % ukeys)
                tomb = (_draw(tombstone_seed, offset) >> np.uint64(11)) < tombstone_threshold
            ts_delta = i * ms_per_record
            body = 1 + _varint_len(ts_delta) + _varint_len(i) + 1 + 14 + 1
            body += 1 if tomb else value_len_size + value_bytes
            pos = _put_varint(out, pos, body)
            out[pos] = 0  # record attributes
            pos = _put_varint(out, pos + 1, ts_delta)
            pos = _put_varint(out, pos, i)
            out[pos] = 28  # zigzag(14): the key length
            out[pos + 1] = 107  # k
            out[pos + 2] = 101  # e
            out[pos + 3] = 121  # y
            out[pos + 4] = 45  # -
            k = key_id
            for d in range(5):  # ten decimal digits, two at a time
                two = k % 100
                k //= 100
                out[pos + 14 - 2 * d] = np.uint8(48 + two % 10)
                out[pos + 13 - 2 * d] = np.uint8(48 + two // 10)
            pos += 15
            if tomb:
                out[pos] = 1  # zigzag(-1): null value
                pos += 1
            else:
                pos = _put_varint(out, pos, value_bytes)
                vs = np.int64(_draw(value_seed, offset) % span)
                dst = out[pos : pos + value_bytes]
                src = pool[vs : vs + value_bytes]
                for j in range(value_bytes):  # a plain loop over views vectorises; slice assignment does not
                    dst[j] = src[j]
                pos += value_bytes
            out[pos] = 0  # no headers
            pos += 1
        base_ts = start_ms + base * ms_per_record
        _put_be(out, start, base, 8)  # baseOffset
        _put_be(out, start + 8, pos - start - 12, 4)  # batchLength
        _put_be(out, start + 12, leader_epoch, 4)  # partitionLeaderEpoch
        out[start + 16] = 2  # magic
        _put_be(out, start + 17, 0, 4)  # crc, filled in by the caller
        _put_be(out, start + 21, 0, 2)  # attributes: no codec, CreateTime, not transactional
        _put_be(out, start + 23, n - 1, 4)  # lastOffsetDelta
        _put_be(out, start + 27, base_ts, 8)  # baseTimestamp
        _put_be(out, start + 35, base_ts + (n - 1) * ms_per_record, 8)  # maxTimestamp
        _put_be(out, start + 43, -1, 8)  # producerId
        _put_be(out, start + 51, -1, 2)  # producerEpoch
        _put_be(out, start + 53, -1, 4)  # baseSequence
        _put_be(out, start + 57, n, 4)  # recordCount
    bounds[n_batches] = pos
    return pos


# --- segments --------------------------------------------------------------------------------------


class _SegmentWriter:
    """Streams batches to `<base>.log` files, rolling like `workload._PartitionWriter`, and writes each
    segment's `.index`/`.timeindex` when it is closed (from the batch sizes: the batches' offsets and
    timestamps follow from the spec)."""

    def __init__(self, directory: Path, spec: BulkSpec) -> None:
        self.dir = directory
        self.spec = spec
        self.bases = [0]
        self.size = 0  # bytes written to the current segment
        self.total = 0
        self.batch_sizes: list[int] = []  # of the current segment's batches, written or pending
        self.file: BinaryIO = open(segment_path(directory, 0, LOG_SUFFIX), "wb")  # noqa: SIM115

    def needs_roll(self, pending: int, batch_size: int) -> bool:
        """Kafka's roll rule for a batch following `pending` bytes not yet written to this segment."""
        current = self.size + pending
        return current > 0 and current + batch_size > self.spec.segment_bytes

    def write(self, parts: list[Any], size: int) -> None:
        self.file.writelines(parts)
        self.size += size
        self.total += size

    def roll(self, next_base: int) -> None:
        self._close()
        # No fsync (unlike write_checkpoint_file): thousands of rolls would each force a journal commit.
        segment_path(self.dir, next_base, SNAPSHOT_SUFFIX).write_bytes(_EMPTY_SNAPSHOT)
        self.bases.append(next_base)
        self.size = 0
        self.batch_sizes = []
        self.file = open(segment_path(self.dir, next_base, LOG_SUFFIX), "wb")  # noqa: SIM115

    def finish(self) -> None:
        self._close()

    def abort(self) -> None:
        self.file.close()

    def _close(self) -> None:
        self.file.close()
        base = self.bases[-1]
        offset_index, time_index = segment_indexes(self.spec, base, self.batch_sizes)
        segment_path(self.dir, base, INDEX_SUFFIX).write_bytes(offset_index)
        segment_path(self.dir, base, TIME_INDEX_SUFFIX).write_bytes(time_index)


def segment_indexes(spec: BulkSpec, base: int, batch_sizes: list[int]) -> tuple[bytes, bytes]:
    """`.index` and `.timeindex` of a bulk segment starting at `base` with batches of these sizes.

    `indexes.build_indexes` replayed without reading the log back: the batches of a bulk segment hold
    `records_per_batch` consecutive offsets each and the max timestamp of a batch is its last record's.
    Per batch (one `LogSegment.append` each): if more than index.interval.bytes were appended since the last
    entry, index (last offset → position) and `maybeAppend` the max timestamp so far; on roll the max
    timestamp is appended once more if above the last entry. Tests check it equals `build_indexes`.
    """
    offsets = bytearray()
    times = bytearray()
    end = spec.log_end_offset
    rpb = spec.records_per_batch
    interval = spec.index_interval_bytes
    last_time = NO_TIMESTAMP
    max_ts, max_ts_rel = NO_TIMESTAMP, 0
    since_last_entry = 0
    position = 0
    for j, size in enumerate(batch_sizes):
        last_rel = min(base + (j + 1) * rpb, end) - 1 - base
        ts = spec.start_ms + (base + last_rel) * spec.ms_per_record
        if ts > max_ts:
            max_ts, max_ts_rel = ts, last_rel
        if since_last_entry > interval:
            offsets += _OFFSET_ENTRY.pack(last_rel, position)
            if max_ts > last_time:
                times += _TIME_ENTRY.pack(max_ts, max_ts_rel)
                last_time = max_ts
            since_last_entry = 0
        since_last_entry += size
        position += size
    if max_ts > last_time:
        times += _TIME_ENTRY.pack(max_ts, max_ts_rel)
    return bytes(offsets), bytes(times)


def _clear_segments(directory: Path) -> None:
    for p in directory.iterdir():
        if _SEGMENT_FILE.fullmatch(p.name) and p.is_file():
            p.unlink()


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
    directory.mkdir(parents=True, exist_ok=True)
    _clear_segments(directory)
    plan = partition_plan(spec, topic, partition)
    end = spec.log_end_offset
    rpb = spec.records_per_batch
    batches_per_chunk = max(1, CHUNK_BYTES // spec.batch_bound)
    buf = np.empty(batches_per_chunk * spec.batch_bound, dtype=np.uint8)
    bounds = np.empty(batches_per_chunk + 1, dtype=np.int64)
    attributes = make_attributes(spec.codec)
    threshold = np.uint64(_tombstone_threshold(spec.tombstone_ratio))
    writer = _SegmentWriter(directory, spec)
    last_report = started
    try:
        for first in range(0, end, batches_per_chunk * rpb):
            n_batches = min(batches_per_chunk, -(-(end - first) // rpb))
            _encode_batches(
                buf, bounds, first, n_batches, rpb, end, spec.records_per_partition, spec.keys,
                spec.key_order == "sequential", np.uint64(plan.key_seed), np.uint64(plan.tombstone_seed), threshold,
                np.uint64(plan.value_seed), plan.pool, spec.value_bytes, plan.update_ids, plan.update_start,
                spec.start_ms, spec.ms_per_record, LEADER_EPOCH,
            )
            starts = bounds[: n_batches + 1].tolist()
            if spec.codec is Codec.NONE:
                _write_plain(writer, buf, starts, first, rpb)
            else:
                _write_compressed(writer, buf, starts, first, rpb, spec.codec, attributes)
            now = time.perf_counter()
            if progress is not None and now - last_report >= progress_interval_s:
                last_report = now
                done = min(end, first + n_batches * rpb)
                progress(BulkProgress(topic, partition, done, end, writer.total, len(writer.bases), now - started))
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    write_checkpoint_file(directory / "leader-epoch-checkpoint", encode_leader_epoch_checkpoint([EpochEntry(0, 0)]))
    write_checkpoint_file(directory / "partition.metadata", encode_partition_metadata(topic_id))
    seconds = time.perf_counter() - started
    if progress is not None:
        progress(BulkProgress(topic, partition, end, end, writer.total, len(writer.bases), seconds, done=True))
    return BulkPartitionResult(
        topic, partition, topic_id, end, writer.total, tuple(writer.bases), seconds, spec.updates_per_partition
    )


def _write_plain(writer: _SegmentWriter, buf: np.ndarray, starts: list[int], first: int, rpb: int) -> None:
    """CRC each batch in place, then write each run of batches that belong to one segment in one call."""
    mv = buf.data  # a writable memoryview of the chunk
    crc32c = _crc32c.crc32c
    pack_crc = _CRC.pack_into
    segment_bytes = writer.spec.segment_bytes
    sizes = writer.batch_sizes
    run = starts[0]
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        pack_crc(mv, s + CRC_OFFSET, crc32c(mv[s + ATTRIBUTES_OFFSET : e]))
        current = writer.size + s - run
        if current and current + e - s > segment_bytes:
            writer.write([mv[run:s]], s - run)
            writer.roll(first + b * rpb)
            sizes = writer.batch_sizes
            run = s
        sizes.append(e - s)
    writer.write([mv[run : starts[-1]]], starts[-1] - run)


def _write_compressed(
    writer: _SegmentWriter, buf: np.ndarray, starts: list[int], first: int, rpb: int, codec: Codec, attributes: int
) -> None:
    """Compress each batch's records section, fix its header (length, codec, CRC) and write it."""
    mv = buf.data  # a writable memoryview of the chunk
    parts: list[bytes] = []
    pending = 0
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        payload = compress(codec, bytes(mv[s + RECORDS_OFFSET : e]))
        header = bytearray(mv[s : s + RECORDS_OFFSET])
        _INT32.pack_into(header, LENGTH_OFFSET, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload))
        _INT16.pack_into(header, ATTRIBUTES_OFFSET, attributes)
        crc = _crc32c.crc32c(payload, _crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
        _CRC.pack_into(header, CRC_OFFSET, crc)
        batch_size = RECORDS_OFFSET + len(payload)
        if writer.needs_roll(pending, batch_size):
            writer.write(parts, pending)
            writer.roll(first + b * rpb)
            parts, pending = [], 0
        parts += (bytes(header), payload)
        pending += batch_size
        writer.batch_sizes.append(batch_size)
    writer.write(parts, pending)


# --- a whole log dir -------------------------------------------------------------------------------


def iter_partitions(spec: BulkSpec) -> Iterator[tuple[str, int]]:
    for topic in spec.topics:
        for p in range(topic.partitions):
            yield topic.name, p


def bulk_topic_ids(spec: BulkSpec) -> dict[str, str]:
    """The same deterministic topic ids `kcompact generate` gives these topics and seed."""
    return topic_ids_for(WorkloadSpec(topics=spec.topics, seed=spec.seed))


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
    ids = bulk_topic_ids(spec)
    parts = list(iter_partitions(spec))
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
