"""The winner of every key, as a Spark aggregate, and the winners handed to the rewrite chunk that holds them.

`best_per_key` is the winner rule (`compaction.strategies.winner`: the greatest rank (has_version, version,
offset), compared left to right) over the scan rows of a whole run: a `groupBy(tp, key)`, keys compared by their
full bytes (Spark's binary ordering), so two keys can never be confused; no key-count limit, no driver-side map.

`chunk_winners` assigns each winning offset to its rewrite chunk (a broadcast table of offset ranges) and lays
the chunks out so that each lands in a Spark partition of its own (`slot_keys`): one rewrite task per chunk, on
every core, whatever the number of topic-partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compaction.spark.local import local_frame
from compaction.spark.scan import CHUNK_SLOT


def best_per_key(rows: DataFrame, by_offset: bool, by: Sequence[str] = (), merged: bool = False) -> DataFrame:
    """Per (tp, key) its best-ranked row, and whether any of its rows is dirty; same columns as `rows` (and `by`,
    columns constant per tp that are kept: grouping by them too leaves the groups as they are, and a frame
    already partitioned by them needs no other shuffle). Rows without `tp` are one partition's per `by`; rows
    without `dirty` give winners without it.

    `merged`: each task of `rows` holds a key once already (the scan task's `KeyFold`), so the rows are shuffled
    by (tp, key) first and aggregated after it: Spark's map-side partial aggregate would only hash every row
    again to find nothing to merge (`make bench` P6: 1.5 s of the scan stage's 8.5 s).

    `by_offset`: every rank is (0, 0, offset), so the best is max(offset), which Spark aggregates in a hash
    table over fixed-width values; max(struct) falls back to a sort-based aggregate (about twice the time of
    the whole map phase in `make bench` P2). Applying it again to its own output, or to a union with more
    rows, gives the best over all of them (max of maxes).
    """
    keys = [*by, *(["tp"] if "tp" in rows.columns else []), "key"]
    dirty = [F.max("dirty").alias("dirty")] if "dirty" in rows.columns else []
    if merged:
        rows = rows.repartition(*keys)
    if by_offset:
        return rows.groupBy(*keys).agg(F.max("offset").alias("offset"), *dirty)
    best = rows.groupBy(*keys).agg(F.max(F.struct("has_version", "version", "offset")).alias("best"), *dirty)
    return best.select(*keys, "best.has_version", "best.version", "best.offset", *(["dirty"] if dirty else []))


def chunk_winners(spark: SparkSession, winners: DataFrame, chunks: Sequence[tuple[int, int, int, int]], slots: int
                  ) -> DataFrame:
    """(slot, tp, offset): every winning offset tagged with the slot of the chunk (tp, start, end, slot) holding
    it, plus one row (slot, tp, -1) per chunk, so that a chunk with no winner still gets its task (its batch
    headers and markers are rewritten too). Partitioned so that each of the `slots` slots is one Spark partition
    (see `slot_keys`)."""
    ranges = F.broadcast(local_frame(spark, list(chunks), "tp int, start long, end long, slot long"))
    tagged = winners.join(
        ranges, (winners["tp"] == ranges["tp"]) & (winners["offset"] >= ranges["start"])
        & (winners["offset"] <= ranges["end"])
    ).select(ranges[CHUNK_SLOT], winners["tp"], winners["offset"])
    markers = local_frame(spark, [(slot, tp, -1) for tp, _s, _e, slot in chunks],
                                    f"{CHUNK_SLOT} long, tp int, offset long")
    return tagged.unionByName(markers).repartition(slots, CHUNK_SLOT)


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


__all__ = ["CHUNK_SLOT", "best_per_key", "chunk_winners", "slot_keys", "spark_hash_long"]
