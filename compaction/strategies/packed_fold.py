"""A fold's rows packed into Arrow IPC pieces, and packed folds merged into winners: how the fused job's tasks
hand a partition's folds to the tasks that rewrite it (`compaction.spark.fused`). Without pyspark, so that the
prebuilt kernels' warm-up (`compaction.prebuild.kernels`) runs the merge in an environment without it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from compaction.format.scan import binary_buffers
from compaction.strategies.keyfold import KeyFold

PIECE_KEYS = 1 << 20
PIECE_KEY_BYTES = 1 << 28
"""Keys, and key bytes, per packed piece of a fold: a binary value of tens of MB, far below the 2 GiB Spark's
binary column (32-bit offsets) and its rows take."""

OFFSETS = pa.schema([pa.field("offset", pa.int64(), False)])
"""A chunk's winning offsets sent alone (`pack_offsets`)."""


def pack_fold(rows: tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ranked: bool
              ) -> Iterator[pa.Buffer]:
    """A fold's `rows` (`KeyFold.result`) as Arrow IPC streams of key and offset, and, when `ranked` (a strategy
    other than `offset`, whose rank is the offset alone), has_version and version: the rank `KeyFold.add` takes.
    At most `PIECE_KEYS` rows and about `PIECE_KEY_BYTES` of keys a piece, one piece at a time; one empty piece
    for an empty fold, so that its arrival is known."""
    table = _fold_table(rows, ranked)
    starts, _data = binary_buffers(rows[0])
    start, n = 0, table.num_rows
    while True:
        end = min(n, start + PIECE_KEYS, int(np.searchsorted(starts, starts[start] + PIECE_KEY_BYTES, "right")) - 1)
        end = max(end, min(n, start + 1))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, end - start))
        yield sink.getvalue()
        if end >= n:
            return
        start = end


def _fold_table(rows: tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ranked: bool) -> pa.Table:
    """A fold's `rows` as the columns `pack_fold` and `write_fold` send. Pure."""
    keys, has_version, version, offset, _dirty = rows
    columns = {"key": keys, "offset": pa.array(offset, pa.int64())}
    if ranked:
        columns |= {"has_version": pa.array(has_version, pa.int8()), "version": pa.array(version, pa.int64())}
    return pa.table(columns)


def write_fold(path: Path, rows: tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ranked: bool
               ) -> None:
    """A fold's `rows` written to the file `path` as one Arrow IPC stream of what `pack_fold`'s pieces hold
    (batches of at most `PIECE_KEYS` keys), under a temporary name renamed into place: a reader never sees part
    of it. `read_packed` gives it back as one piece for `merged_folds`."""
    _write_stream(path, _fold_table(rows, ranked))


def write_offsets(path: Path, offsets: np.ndarray) -> None:
    """`pack_offsets`' stream written to the file `path` as `write_fold` writes a fold."""
    _write_stream(path, pa.table([pa.array(offsets, pa.int64())], schema=OFFSETS))


def _write_stream(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=PIECE_KEYS)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_packed(path: Path) -> pa.Buffer:
    """The stream `write_fold` or `write_offsets` wrote to `path`, mapped (the page cache's pages, not copied)."""
    return pa.memory_map(str(path), "r").read_buffer()  # the buffer keeps the mapping


def pack_offsets(offsets: np.ndarray) -> pa.Buffer:
    """A fold's winning `offsets` alone, as one Arrow IPC stream (8 bytes a key)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, OFFSETS) as writer:
        writer.write_batch(pa.record_batch([pa.array(offsets, pa.int64())], schema=OFFSETS))
    return sink.getvalue()


def merged_folds(pieces: Sequence[pa.Buffer]) -> np.ndarray:
    """The winning offset of each key of the packed fold `pieces` (`pack_fold`'s, or a whole stream `write_fold`
    wrote), merged as the scan folds; or the offsets of one chunk's fold sent alone (`pack_offsets`,
    `write_offsets`)."""
    tables = [pa.ipc.open_stream(p).read_all() for p in pieces]
    if all(t.schema.equals(OFFSETS) for t in tables):
        return np.concatenate([t.column(0).to_numpy() for t in tables] or [np.empty(0, np.int64)])
    fold = KeyFold(sum(t.num_rows for t in tables))
    for t in tables:
        for b in t.to_batches():
            offset = b.column("offset").to_numpy()
            if "version" in b.schema.names:
                has_version, version = b.column("has_version").to_numpy(), b.column("version").to_numpy()
            else:  # `offset`'s rank: the offset alone
                has_version, version = np.zeros(len(offset), np.int8), np.zeros(len(offset), np.int64)
            fold.add(b.column("key"), has_version, version, offset, True)
    return fold.offsets()


__all__ = ["OFFSETS", "PIECE_KEYS", "PIECE_KEY_BYTES", "merged_folds", "pack_fold", "pack_offsets", "read_packed",
           "write_fold", "write_offsets"]
