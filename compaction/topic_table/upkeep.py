"""Keeping a topic table healthy, after each `kcompact table` run that writes, through Delta's own commands
(`compaction.spark.delta_table`).

- **Partitions the store no longer has** (a topic shrunk by hand, a partition deleted from the store) leave the
  table: Delta's DELETE of their rows, in a commit of its own.
- **Small files are compacted.** A partition is compacted (Delta's OPTIMIZE: bin-packing, a `dataChange=false`
  rewrite) once it holds at least `SMALL_FILES` files under `SMALL_FILE_BYTES` and they are more than half of its
  files. A file under 1 MiB costs a reader more to open (an object store's request latency, ~20-50 ms) than to
  read; a run's own files are larger on any table worth the name, so the rule fires on what many tiny runs leave
  behind, never right after a rebuild, and a few small files are left alone: rewriting them costs more than it
  saves. OPTIMIZE also rewrites the files of those partitions whose deletion vectors delete more than
  `spark.databricks.delta.optimize.maxDeletedRowsRatio` of their rows (Delta's purge).
- **Removed files are vacuumed** (Delta's VACUUM) once some were removed longer ago than the table's retention,
  `delta.deletedFileRetentionDuration` (Delta's default, one week, unless the table's properties set another):
  time travel to a version younger than that keeps working, as every Delta reader expects. It runs only when
  delta-rs's dry run finds something to delete (`TopicTable.removable`), as `LITE` (from the log's removes, no
  listing) unless Delta says the log no longer holds them (`compaction.spark.delta_table.vacuum`).

Each commit carries the run's id in its `userMetadata` (no applied offsets: `compaction.topic_table.target` reads
them from the run's own commits). An OPTIMIZE or DELETE racing a concurrent run is Delta's ordinary conflict: one of
the two commits fails, a run with `CommitConflictError` (exit 4, rerun), and nothing is lost either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compaction.topic_table.target import DataFile, TopicTable, app_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def keep_healthy(spark: SparkSession, table: TopicTable, run_id: str, partitions: Sequence[int], now_ms: int
                 ) -> Upkeep:
    """Drop the partitions not in `partitions` (the store's), compact the crowded ones, vacuum; see the module."""
    from compaction.spark import delta_table as delta

    state = table.open(partitions)
    if state.version < 0:
        return Upkeep()
    delta.configure(spark, table.uri, table.options)
    present = set(partitions)
    gone = sorted({f.partition for f in state.files} - present)
    busy = crowded([f for f in state.files if f.partition in present])

    def stamp(what: str) -> delta.Stamp:
        return delta.Stamp(app_id(table.topic), None, {"kcompact_table": table.topic, "run_id": run_id,
                                                       "upkeep": what, "clock": now_ms})

    if gone:
        delta.delete_partitions(spark, table.spark_path, gone, stamp("partitions gone from the store"))
    if busy:
        delta.optimize(spark, table.spark_path, busy, stamp("small files compacted"))
    if table.removable():
        delta.vacuum(spark, table.spark_path, stamp("vacuum"))
    counts = {"DELETE": 0, "OPTIMIZE": 0, "VACUUM END": 0}
    for info in table.landed(run_id, state.version).values():
        if (operation := info.get("operation")) in counts:
            metrics = info.get("operationMetrics") or {}
            counts[operation] += int(metrics.get("numDeletedFiles", 0) if operation == "VACUUM END"
                                     else metrics.get("numRemovedFiles", 0))
    return Upkeep(tuple(gone), counts["DELETE"], tuple(busy), counts["OPTIMIZE"], counts["VACUUM END"])


__all__ = ["SMALL_FILES", "SMALL_FILE_BYTES", "Upkeep", "crowded", "keep_healthy"]
