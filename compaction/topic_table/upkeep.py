"""Keeping a topic table healthy, after each `kcompact table` run that writes.

- **Partitions the store no longer has** (a topic shrunk by hand, a partition deleted from the store) leave the
  table: their files are removed in a commit of their own, checked for conflicts like a run's.
- **Small files are compacted.** A partition is compacted (Delta's OPTIMIZE: delta-rs's bin-packing
  `optimize.compact` into `FILE_BYTES` files, a `dataChange=false` rewrite) once it holds at least `SMALL_FILES`
  files under `SMALL_FILE_BYTES` and they are more than half of its files. A file under 1 MiB costs a reader more to
  open (an object store's request latency, ~20-50 ms) than to read; a run's own files are larger on any table
  worth the name (a rebuild spreads a partition over one file per 128 MiB of input, each holding a share of its
  keys, and an update adds one file of its winners), so the rule fires on what many tiny runs leave behind, never
  right after a rebuild, and a few small files are left alone: rewriting them costs more than it saves. OPTIMIZE
  applies the deletion vectors of the files it rewrites.
- **Deletion vectors are purged** by the update that would mark a file past `compaction.spark.table.PURGE_SHARE`
  (a fifth of its rows) deleted: it rewrites that file without those rows instead, so no file is read for mostly
  deleted rows, and no separate pass is needed.
- **Removed files are vacuumed** once they were removed longer ago than the table's retention,
  `delta.deletedFileRetentionDuration` (Delta's default, one week, unless the table's properties set another):
  time travel to a version younger than that keeps working, as every Delta reader expects; so are the deletion
  vector files older than that which no live file and no file removed within it names (`TopicTable.vacuum`).

An OPTIMIZE racing a concurrent run is Delta's ordinary conflict: one of the two commits fails, a run with
`CommitConflictError` (exit 4, rerun), and nothing is lost either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction.topic_table.target import FILE_BYTES, DataFile, TopicTable

SMALL_FILE_BYTES = 1024 * 1024
SMALL_FILES = 8


@dataclass(frozen=True)
class Upkeep:
    """What an upkeep pass did."""

    partitions_dropped: tuple[int, ...] = ()
    files_dropped: int = 0
    partitions_compacted: tuple[int, ...] = ()
    files_compacted: int = 0
    files_vacuumed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"partitions_dropped": list(self.partitions_dropped), "files_dropped": self.files_dropped,
                "partitions_compacted": list(self.partitions_compacted), "files_compacted": self.files_compacted,
                "files_vacuumed": self.files_vacuumed}

    def summary(self) -> str:
        return (f"upkeep: {len(self.partitions_dropped)} partitions gone from the store dropped "
                f"({self.files_dropped} files), {len(self.partitions_compacted)} compacted ({self.files_compacted} "
                f"small files rewritten), {self.files_vacuumed} removed files vacuumed")


def crowded(files: Sequence[DataFile]) -> list[int]:
    """The partitions worth compacting: at least `SMALL_FILES` small files, making up more than half of their files."""
    small: dict[int, int] = {}
    total: dict[int, int] = {}
    for f in files:
        total[f.partition] = total.get(f.partition, 0) + 1
        if f.size < SMALL_FILE_BYTES:
            small[f.partition] = small.get(f.partition, 0) + 1
    return sorted(p for p, n in small.items() if n >= SMALL_FILES and 2 * n > total[p])


def keep_healthy(table: TopicTable, partitions: Sequence[int], now_ms: int) -> Upkeep:
    """Drop the partitions not in `partitions` (the store's), compact the crowded ones, vacuum; see the module."""
    state = table.open(partitions, create=False)
    present = set(partitions)
    gone = sorted({f.partition for f in state.files} - present)
    dropped = [f for f in state.files if f.partition in gone]
    if dropped:
        table.commit([], dropped, {}, now_ms, {"upkeep": "partitions gone from the store", "dropped": gone})
    busy = crowded([f for f in state.files if f.partition in present])
    compacted = 0
    for partition in busy:
        metrics = table.optimize(partition, FILE_BYTES)
        compacted += int(metrics.get("numFilesRemoved", 0))
    vacuumed = table.vacuum(now_ms)
    return Upkeep(tuple(gone), len(dropped), tuple(busy), compacted, len(vacuumed))


__all__ = ["SMALL_FILES", "SMALL_FILE_BYTES", "Upkeep", "crowded", "keep_healthy"]
