"""A partition's rows of the topic table from its consumer records, column-wise in one process (POLICY; no Spark).

A rebuild task (`compaction.topic_table.tasks.RebuildTask`) holds every record of its share of a partition's keys;
`table_rows_of` turns them into the table's rows: per key the record of greatest rank (has_version, version,
offset) (KIP-280's rule, `compaction.strategies.ranking`), folded by the compaction's `KeyFold`, kept only for keys
with a record at or above `from_offset`, tombstone winners dropped, in offset order (a rebuild of a compacted log
keeps nearly every record it reads, and its batches are then written as they were decoded, not copied). The Spark
path (`compaction.spark.table.winners`) computes the same rows with an aggregate; `tests/spark/test_table.py` holds
both to the plainly computed table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.config import CompactionStrategy
from compaction.strategies.keyfold import KeyFold
from compaction.strategies.winner import ranks
from compaction.topic_table.target import PARTITION_COLUMN, VERSION_COLUMN


def last_header_values(headers: pa.Array | pa.ChunkedArray, name: str) -> pa.Array:
    """Per record (a `list<struct<key, value>>` of headers), the value of its last header called `name`; null
    when it has none (or that header's value is null). An earlier header of the name never counts."""
    lists = headers.combine_chunks() if isinstance(headers, pa.ChunkedArray) else headers
    n = len(lists)
    flat = lists.flatten()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    parents = np.repeat(np.arange(n), lengths)
    named = np.asarray(pc.fill_null(pc.equal(pc.struct_field(flat, "key"), name), False), bool)
    at = np.flatnonzero(named)
    last = np.full(n, -1, np.int64)
    if len(at):
        owners = parents[at]
        final = np.append(owners[1:] != owners[:-1], True)  # the last match of each record (matches ascend)
        last[owners[final]] = at[final]
    values = pc.struct_field(flat, "value")
    if len(values) == 0:
        return pa.nulls(n, pa.binary())
    taken = values.take(pa.array(np.maximum(last, 0)))
    return pc.if_else(pa.array(last >= 0), taken, pa.nulls(n, taken.type))


def record_ranks(records: pa.Table, strategy: CompactionStrategy, header: str | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(has_version int8, version int64) of consumer records under `strategy`: the compaction's ranks
    (`compaction.strategies.winner.ranks`), fed the last `header` value of each record's headers."""
    if strategy is CompactionStrategy.HEADER:
        records = records.append_column("header_value", last_header_values(records["headers"], header or ""))
    rank = ranks(records, strategy)
    return rank.has_version, rank.version


def table_rows_of(records: Sequence[pa.Table], partition: int, from_offset: int, strategy: CompactionStrategy,
                  header: str | None, schema: pa.Schema) -> pa.Table:
    """The table's rows (`schema`, `compaction.topic_table.target.table_schema`) of one partition's keyed,
    committed consumer `records` (every record of each key they hold, below the partition's stable offset)."""
    return _rows(records, partition, from_offset, strategy, header, schema)[0]


def table_changes_of(records: Sequence[pa.Table], partition: int, from_offset: int, strategy: CompactionStrategy,
                     header: str | None, schema: pa.Schema) -> tuple[pa.Table, pa.Array]:
    """`table_rows_of`, and the keys whose rows they change: every key with a record at or above `from_offset`,
    those whose winner is a tombstone included (an update removes their rows and adds none)."""
    rows, keys, fresh = _rows(records, partition, from_offset, strategy, header, schema)
    return rows, keys.filter(pa.array(fresh))


def _rows(records: Sequence[pa.Table], partition: int, from_offset: int, strategy: CompactionStrategy,
          header: str | None, schema: pa.Schema) -> tuple[pa.Table, pa.Array, np.ndarray]:
    """`table_rows_of`, every key the records hold and which of them have a record at or above `from_offset`."""
    if not any(r.num_rows for r in records):
        return schema.empty_table(), pa.array([], pa.binary()), np.zeros(0, bool)
    data = pa.concat_tables(records)
    has_version, version = record_ranks(data, strategy, header)
    offsets = data["offset"].to_numpy()
    fold = KeyFold(data.num_rows)
    fold.add(data["key"].combine_chunks(), has_version, version, offsets, offsets >= from_offset)
    keys, _, _, best, fresh = fold.result()
    if len(best) == data.num_rows and fresh.all():  # every record its key's only one (a rebuild of a compacted log)
        winner = np.ones(data.num_rows, bool)
    else:
        winner = np.zeros(data.num_rows, bool)
        winner[_positions(offsets, best[fresh])] = True
    winner &= np.asarray(data["value"].is_valid(), bool)  # a tombstone winner: no row
    kept = np.flatnonzero(winner)
    rows = _filtered(data, winner)
    columns = {name: rows[name] for name in ("key", "value", "offset", "timestamp", "headers")}
    columns[PARTITION_COLUMN] = pa.array(np.full(rows.num_rows, partition, np.int32))
    if VERSION_COLUMN in schema.names:
        has = has_version[kept].astype(bool)
        columns[VERSION_COLUMN] = pa.array(version[kept], pa.int64(), mask=~has)
    out = pa.table([columns[f.name] for f in schema], schema=pa.schema([pa.field(f.name, f.type) for f in schema]))
    return out.cast(schema), keys, fresh


def _filtered(data: pa.Table, keep: np.ndarray) -> pa.Table:
    """`data.filter(keep)`, batch by batch, a batch kept whole (no copy) when all its rows are: a rebuild of a
    compacted log keeps nearly every record."""
    batches, start = [], 0
    for batch in data.to_batches():
        mask = keep[start:start + batch.num_rows]
        start += batch.num_rows
        batches.append(batch if mask.all() else batch.filter(pa.array(mask)))
    return pa.Table.from_batches(batches, schema=data.schema)


def _positions(offsets: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each of `wanted` (offsets present in `offsets`, which are distinct) is in `offsets`."""
    if len(offsets) < 2 or bool(np.all(offsets[1:] > offsets[:-1])):
        return np.searchsorted(offsets, wanted)
    ascending = np.argsort(offsets, kind="stable")
    return ascending[np.searchsorted(offsets[ascending], wanted)]


__all__ = ["last_header_values", "record_ranks", "table_changes_of", "table_rows_of"]
