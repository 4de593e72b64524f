"""The winner of every key, as a Spark aggregate, and the winners handed to the rewrite chunk that holds them.

`best_per_key` is the winner rule (`compaction.strategies.ranking`: the greatest rank (has_version, version,
offset), compared left to right) over the scan rows of a whole run: a `groupBy(tp, key)`, keys compared by their
full bytes (Spark's binary ordering), so two keys can never be confused; no key-count limit, no driver-side map.

`chunk_winners` assigns each winning offset to its rewrite chunk (a search among the chunks' offset ranges), packs
each chunk's offsets into few rows and lays the chunks out so that each rewrite task's (slot's) chunks land in a Spark
partition of their own (`slot_keys`): the tasks are exactly the ones `compaction.spark.pipeline.rewrite_slots`
packed, on every core, whatever the number of topic-partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compaction.spark.local import local_frame
from compaction.spark.ranking import best
from compaction.spark.scan import CHUNK_SLOT
from compaction.strategies.ranking import RANK_FIELDS


def best_per_key(rows: DataFrame, by_offset: bool, by: Sequence[str] = (), merged: bool = False) -> DataFrame:
    """Per (tp, key) its best-ranked row (`compaction.spark.ranking.best`), and whether any of its rows is dirty;
    same columns as `rows` (and `by`, columns constant per tp that are kept: grouping by them too leaves the groups
    as they are, and a frame already partitioned by them needs no other shuffle). Rows without `tp` are one
    partition's per `by`; rows without `dirty` give winners without it.

    `merged`: each task of `rows` holds a key once already (the scan task's `KeyFold`), so the rows are shuffled
    by (tp, key) first and aggregated after it: Spark's map-side partial aggregate would only hash every row
    again to find nothing to merge.

    `by_offset`: every rank is (0, 0, offset), so the best is max(offset), a hash aggregate (see `best`). Applying
    it again to its own output, or to a union with more rows, gives the best over all of them (max of maxes).
    """
    keys = [*by, *(["tp"] if "tp" in rows.columns else []), "key"]
    dirty = [F.max("dirty").alias("dirty")] if "dirty" in rows.columns else []
    if merged:
        rows = rows.repartition(*keys)
    if by_offset:
        return rows.groupBy(*keys).agg(best(by_offset=True).alias("offset"), *dirty)
    ranked = rows.groupBy(*keys).agg(best().alias("best"), *dirty)
    return ranked.select(*keys, *(f"best.{f}" for f in RANK_FIELDS), *(["dirty"] if dirty else []))


PACKED = "offsets"
"""The column of a packed winners row: its chunk's winning offsets as little-endian int64s, one after the other."""

PACK_LIMIT = 1 << 14
"""The most offsets one packed row carries (128 KiB): Spark hands a Python task up to
`spark.sql.execution.arrow.maxRecordsPerBatch` rows (10,000 by default) in one Arrow batch, whose binary column
must stay under 2 GiB."""

_PACK_ROWS = 1 << 10
"""Packed rows per Arrow batch `pack_offsets` yields (128 MiB at most)."""


class Chunk(NamedTuple):
    """A rewrite chunk as `chunk_winners` sends it its winners: the offsets [start, end] of one partition (by its
    index among the run's) and the slot of the rewrite task that runs it."""

    partition_index: int
    start_offset: int
    end_offset: int
    slot: int


def chunk_winners(spark: SparkSession, winners: DataFrame, chunks: Sequence[Chunk], slots: int) -> DataFrame:
    """(slot, tp, offsets): every winning offset of (tp, offset) `winners` assigned to the chunk holding it,
    packed per chunk into few rows (`pack_offsets`), plus one empty row per chunk, so that a chunk with no winner
    still gets its task (its batch headers and markers are rewritten too). Partitioned so that each of the
    `slots` slots is one Spark partition (see `slot_keys`).

    The winners were decided by the aggregate before this; what follows only moves them to their chunk. Moved
    one row per offset, they would cost Spark its per-row work twice more (a shuffle write and read of every
    winner, and a broadcast join to find each one's chunk); packed, a task of the aggregate hands the shuffle a
    row per chunk and `PACK_LIMIT` offsets."""
    schema = f"{CHUNK_SLOT} long, tp int, {PACKED} binary"
    packed = winners.select("tp", "offset").mapInArrow(pack_offsets(chunks), schema)
    markers = local_frame(spark, [(c.slot, c.partition_index, b"") for c in chunks], schema)
    return packed.unionByName(markers).repartition(slots, CHUNK_SLOT)


_PACKED_ROWS = pa.schema([pa.field(CHUNK_SLOT, pa.int64()), pa.field("tp", pa.int32()), pa.field(PACKED, pa.binary())])


class _ChunkRanges(NamedTuple):
    """One partition's chunks, in offset order, as arrays a search runs on."""

    starts: np.ndarray
    ends: np.ndarray
    slots: np.ndarray


def pack_offsets(chunks: Sequence[Chunk]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function of `chunk_winners`: (tp, offset) batches in, (slot, tp, offsets) rows out, an
    offset kept when a chunk of its partition holds it (start <= offset <= end)."""
    ranges: dict[int, _ChunkRanges] = {}
    for index in sorted({c.partition_index for c in chunks}):
        ordered = sorted(c for c in chunks if c.partition_index == index)
        ranges[index] = _ChunkRanges(*(np.array([getattr(c, f) for c in ordered], np.int64)
                                       for f in ("start_offset", "end_offset", "slot")))

    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held: dict[tuple[int, int], list[np.ndarray]] = {}  # (slot, partition index) -> sorted runs of offsets
        for batch in batches:
            _hold(batch, ranges, held)
        slots, indexes, blobs = [], [], []
        for (slot, index), parts in held.items():
            offsets = np.sort(np.concatenate(parts)).astype("<i8", copy=False)  # sorted runs: a merge for the task
            for at in range(0, len(offsets), PACK_LIMIT):
                slots.append(slot)
                indexes.append(index)
                blobs.append(offsets[at:at + PACK_LIMIT].tobytes())
        for at in range(0, len(slots), _PACK_ROWS):
            yield pa.RecordBatch.from_arrays([pa.array(slots[at:at + _PACK_ROWS], pa.int64()),
                                              pa.array(indexes[at:at + _PACK_ROWS], pa.int32()),
                                              pa.array(blobs[at:at + _PACK_ROWS], pa.binary())], schema=_PACKED_ROWS)

    return pack


def _hold(batch: pa.RecordBatch, ranges: Mapping[int, _ChunkRanges], held: dict[tuple[int, int], list[np.ndarray]]
          ) -> None:
    """The offsets of (tp, offset) `batch` that a chunk holds, added to `held` under (its slot, tp)."""
    indexes = batch.column(0).to_numpy(zero_copy_only=False)
    offsets = batch.column(1).to_numpy(zero_copy_only=False)
    for index in np.unique(indexes).tolist():
        if index not in ranges:
            continue
        starts, ends, slot_of = ranges[index]
        ours = indexes == index
        mine = offsets if ours.all() else offsets[ours]
        at = np.searchsorted(starts, mine, "right") - 1
        inside = (at >= 0) & (mine <= ends[np.maximum(at, 0)])
        for i in np.unique(at[inside]).tolist():
            held.setdefault((int(slot_of[i]), index), []).append(mine[inside & (at == i)])


def slot_keys(n: int) -> list[int]:
    """n values whose Spark hash lands each in its own partition of n: `repartition(n, slot)` then gives every
    chunk a task of its own. Spark's `HashPartitioning` is pmod(murmur3(value, 42), n); a dense 0..n-1 column
    would collide (two chunks in one task, serialised) for most n. Pure."""
    keys: list[int] = []
    taken: set[int] = set()
    candidate = 0
    while len(keys) < n:
        bucket = spark_hash_long(candidate) % n
        if bucket not in taken:
            taken.add(bucket)
            keys.append(candidate)
        candidate += 1
    return sorted(keys, key=lambda k: spark_hash_long(k) % n)


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of a bigint (Murmur3_x86_32.hashLong), as a signed 32-bit int."""
    low, high = value & _M32, (value >> 32) & _M32
    h1 = _mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


__all__ = ["CHUNK_SLOT", "PACKED", "Chunk", "best_per_key", "chunk_winners", "pack_offsets", "slot_keys",
           "spark_hash_long"]

