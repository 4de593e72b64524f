"""The records of a bulk partition: seeded draws, the numba kernel that encodes them, and the plain reference.

Record `offset` of a partition is a pure function of the spec, the partition's seeded draws and the offset:
its key, whether it is a tombstone and where its value starts in the value pool are counter-based hashes
(SplitMix64 of seed + offset·γ, `bloom.hashing.mix64`), so any run of offsets can be encoded without the
ones before it. `encode_batches` writes whole runs of uncompressed v2 batches into one buffer (CRC left to
the caller); `reference_records` computes the same records in plain Python for the tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compaction.bloom.hashing import MASK64, mix64, reference_mix64
from compaction.format.batch import RECORDS_OFFSET
from compaction.format.varint_kernels import put_varint, varint_size
from compaction.generate.bulk_spec import BulkSpec
from compaction.kernels import kernel

VALUE_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"
POOL_BYTES = 64 * 1024
"""Values are `value_bytes` slices of a seeded pool of POOL_BYTES + value_bytes printable bytes."""
LEADER_EPOCH = 0
GAMMA = 0x9E3779B97F4A7C15
"""SplitMix64's increment: record `offset` draws from the state seed + offset·γ."""
_GAMMA_U = np.uint64(GAMMA)


@dataclass(frozen=True)
class PartitionDraws:
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


def partition_draws(spec: BulkSpec, topic: str, partition: int) -> PartitionDraws:
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
    return PartitionDraws(key_seed, tombstone_seed, value_seed, pool, update_start, update_ids)


def tombstone_threshold(ratio: float) -> int:
    """A record is a tombstone iff the top 53 bits of its hash are below this."""
    return round(ratio * 2**53)


def _draw_py(seed: int, offset: int) -> int:
    return reference_mix64((seed + (offset - 1) * GAMMA) & MASK64)  # mix64 adds the last γ


def reference_records(spec: BulkSpec, topic: str, partition: int) -> Iterator[tuple[int, int, bytes, bytes | None]]:
    """(offset, timestamp, key, value) of every record of a partition, in plain Python (slow; for tests)."""
    draws = partition_draws(spec, topic, partition)
    pool = draws.pool.tobytes()
    span = len(pool) - spec.value_bytes + 1
    threshold = tombstone_threshold(spec.tombstone_ratio)
    n = spec.records_per_partition
    for offset in range(spec.log_end_offset):
        if offset >= n:
            key_id, tomb = draws.updated_key(offset - n), False
        else:
            if spec.key_order == "sequential" and offset < spec.keys:
                key_id = offset
            else:
                key_id = _draw_py(draws.key_seed, offset) % spec.keys
            tomb = (_draw_py(draws.tombstone_seed, offset) >> 11) < threshold
        start = _draw_py(draws.value_seed, offset) % span
        value = None if tomb else pool[start : start + spec.value_bytes]
        yield offset, spec.start_ms + offset * spec.ms_per_record, b"key-%010d" % key_id, value


def encode_batches(spec: BulkSpec, draws: PartitionDraws, out: np.ndarray, bounds: np.ndarray, first_offset: int,
                   n_batches: int) -> None:
    """Encode `n_batches` uncompressed v2 batches from `first_offset` into `out`, CRC fields left 0.

    bounds[b] is where batch b starts, bounds[n_batches] where the last one ends.
    """
    _encode_batches(
        out, bounds, first_offset, n_batches, spec.records_per_batch, spec.log_end_offset,
        spec.records_per_partition, spec.keys, spec.key_order == "sequential", np.uint64(draws.key_seed),
        np.uint64(draws.tombstone_seed), np.uint64(tombstone_threshold(spec.tombstone_ratio)),
        np.uint64(draws.value_seed), draws.pool, spec.value_bytes, draws.update_ids, draws.update_start,
        spec.start_ms, spec.ms_per_record, LEADER_EPOCH,
    )


@kernel(nogil=True)
def _draw(seed: np.uint64, offset: int) -> Any:
    """SplitMix64 at state seed + offset·γ: uniform 64 bits, a pure function of seed and offset."""
    return mix64(seed + np.uint64(offset) * _GAMMA_U - _GAMMA_U)  # mix64 adds the last γ


@kernel(nogil=True)
def _put_be(out: np.ndarray, pos: int, value: int, nbytes: int) -> None:
    """Big-endian two's complement of `value` in `nbytes` bytes."""
    v = np.int64(value)
    for j in range(nbytes):
        out[pos + nbytes - 1 - j] = np.uint8(v & 0xFF)
        v >>= 8


@kernel(nogil=True)
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
    threshold: np.uint64,
    value_seed: np.uint64,
    pool: np.ndarray,
    value_bytes: int,
    update_ids: np.ndarray,
    update_start: int,
    start_ms: int,
    ms_per_record: int,
    leader_epoch: int,
) -> int:
    span = np.uint64(pool.shape[0] - value_bytes + 1)
    ukeys = np.uint64(keys)
    value_len_size = varint_size(value_bytes)
    pos = 0
    for b in range(n_batches):
        base = first_offset + b * records_per_batch
        n = min(records_per_batch, end_offset - base)
        start = pos
        bounds[b] = start
        pos += RECORDS_OFFSET
        for i in range(n):
            offset = base + i
            if offset >= n_main:
                u = offset - n_main
                key_id = update_ids[u] if update_ids.shape[0] > 0 else update_start + u
                tomb = False
            else:
                key_id = offset if sequential and offset < keys else np.int64(_draw(key_seed, offset) % ukeys)
                tomb = (_draw(tombstone_seed, offset) >> np.uint64(11)) < threshold
            value_start = np.int64(-1) if tomb else np.int64(_draw(value_seed, offset) % span)
            pos = _put_record(out, pos, i, i * ms_per_record, key_id, pool, value_start, value_bytes, value_len_size)
        base_ts = start_ms + base * ms_per_record
        _put_batch_header(out, start, pos, base, n, base_ts, base_ts + (n - 1) * ms_per_record, leader_epoch)
    bounds[n_batches] = pos
    return pos


@kernel(nogil=True)
def _put_record(out: np.ndarray, pos: int, offset_delta: int, ts_delta: int, key_id: int, pool: np.ndarray,
                value_start: int, value_bytes: int, value_len_size: int) -> int:
    """Record `key_id` at `pos`: its value `pool[value_start:][:value_bytes]`, or null if `value_start` < 0."""
    tomb = value_start < 0
    body = 1 + varint_size(ts_delta) + varint_size(offset_delta) + 1 + 14 + 1
    body += 1 if tomb else value_len_size + value_bytes
    pos = put_varint(out, pos, body)
    out[pos] = 0  # record attributes
    pos = put_varint(out, pos + 1, ts_delta)
    pos = put_varint(out, pos, offset_delta)
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
        pos = put_varint(out, pos, value_bytes)
        dst = out[pos : pos + value_bytes]
        src = pool[value_start : value_start + value_bytes]
        for j in range(value_bytes):  # a plain loop over views vectorises; slice assignment does not
            dst[j] = src[j]
        pos += value_bytes
    out[pos] = 0  # no headers
    return pos + 1


@kernel(nogil=True)
def _put_batch_header(out: np.ndarray, start: int, end: int, base_offset: int, n: int, base_ts: int, max_ts: int,
                      leader_epoch: int) -> None:
    """The 61-byte header of the batch of `n` records at out[start:end]: no codec, CreateTime, no producer."""
    _put_be(out, start, base_offset, 8)  # baseOffset
    _put_be(out, start + 8, end - start - 12, 4)  # batchLength
    _put_be(out, start + 12, leader_epoch, 4)  # partitionLeaderEpoch
    out[start + 16] = 2  # magic
    _put_be(out, start + 17, 0, 4)  # crc, filled in by the caller
    _put_be(out, start + 21, 0, 2)  # attributes: no codec, CreateTime, not transactional
    _put_be(out, start + 23, n - 1, 4)  # lastOffsetDelta
    _put_be(out, start + 27, base_ts, 8)  # baseTimestamp
    _put_be(out, start + 35, max_ts, 8)  # maxTimestamp
    _put_be(out, start + 43, -1, 8)  # producerId
    _put_be(out, start + 51, -1, 2)  # producerEpoch
    _put_be(out, start + 53, -1, 4)  # baseSequence
    _put_be(out, start + 57, n, 4)  # recordCount
