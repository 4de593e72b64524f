"""KIP-280's winner rule as Spark expressions: the rank columns of records, and the aggregate keeping the best.

The rule is `compaction.strategies.ranking` (the reference these are tested against): a record's rank is
(has_version, version, offset), a key's winner its record of greatest rank. Spark's `max` of a struct compares
field by field, left to right, so `max(struct(has_version, version, offset, ...))` is the winner, carrying what
follows the rank along; ranks end in the offset, so the carried fields never decide. Unlike `max_by`, `max` does not
depend on row order.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from compaction.config import CompactionStrategy
from compaction.strategies.ranking import RANK_FIELDS, VERSION_BYTES


def header_version(name: str) -> tuple[Column, Column]:
    """(has_version, version) of records' `headers` (an array of (key, value) structs) under the header strategy:
    the last `name` header's value as an 8-byte big-endian signed long (`ranking.header_version`)."""
    last = F.try_element_at(F.filter("headers", lambda h: h["key"] == F.lit(name)), F.lit(-1))["value"]
    has = last.isNotNull() & (F.length(last) == VERSION_BYTES)
    unsigned = F.conv(F.hex(last), 16, 10).cast("decimal(20,0)")
    sign = F.lit(str(2**63)).cast("decimal(20,0)")
    signed = F.when(unsigned >= sign, unsigned - sign - sign).otherwise(unsigned).cast("long")
    return has.cast("tinyint"), F.when(has, signed).otherwise(F.lit(0).cast("long"))


def rank_columns(strategy: CompactionStrategy, header: str | None) -> tuple[Column, Column]:
    """(has_version, version) of each record of a frame with `timestamp` and `headers`, under `strategy`."""
    if strategy is CompactionStrategy.OFFSET:
        return F.lit(0).cast("tinyint"), F.lit(0).cast("long")
    if strategy is CompactionStrategy.TIMESTAMP:
        return F.lit(1).cast("tinyint"), F.col("timestamp")
    return header_version(header or "")


def best(carried: Sequence[str] = (), *, by_offset: bool = False, where: Column | None = None) -> Column:
    """The aggregate of a group's best-ranked row: a struct of the rank's fields then `carried` (columns of the
    row), the fields named as the columns; null if no row (or none where `where` holds).

    `by_offset`: every rank is (0, 0, offset), so the struct starts at `offset`; with nothing carried the result
    is the offset itself, a max over longs that Spark aggregates in a hash table, where max of a struct falls back
    to a sort-based aggregate.
    """
    rank = ("offset",) if by_offset else RANK_FIELDS
    value = F.col("offset") if by_offset and not carried else F.struct(*rank, *carried)
    return F.max(value if where is None else F.when(where, value))


__all__ = ["best", "header_version", "rank_columns"]
