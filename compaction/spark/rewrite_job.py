"""The rewrite job: one Spark task per rewrite chunk (or per partition when the disk budget asks for it).

Each task receives its chunk's winning offsets (`compaction.spark.winners.chunk_winners`), opens the store from
its spec and calls the pyspark-free `compaction.rewrite.upload.rewrite_groups`, which takes the inputs from the
run's segment cache (or the store), rewrites and uploads under fresh ids. What comes back is one typed
`UnitOutcome` per task (a dataclass, pickled into a binary column: errors keep their class).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from compaction.errors import KcompactError
from compaction.rewrite.upload import PartitionRewrite, rewrite_groups
from compaction.run.tasks import GroupTask, PartitionTask
from compaction.spark.winners import CHUNK_SLOT
from compaction.storage.base import StoreSpec, StoreStats

_OUTCOMES = pa.schema([pa.field("tp", pa.int32(), False), pa.field("outcome", pa.binary(), False)])


@dataclass(frozen=True)
class RewriteUnit:
    """What one rewrite task does: `groups` of partition `tp` (in offset order)."""

    tp: int
    task: PartitionTask
    groups: tuple[GroupTask, ...]


@dataclass(frozen=True)
class UnitOutcome:
    """What one rewrite task did, or the error that fails its partition (nothing of it is committed)."""

    tp: int
    rewrite: PartitionRewrite | None = None
    error: KcompactError | None = None
    requests: StoreStats = field(default_factory=StoreStats)


def split_winners(offsets: np.ndarray, groups: Sequence[GroupTask]) -> dict[int, np.ndarray]:
    """Sorted winning offsets per group id, from the unsorted offsets of the groups' task. Pure."""
    ordered = np.sort(offsets[offsets >= 0])
    out = {}
    for g in groups:
        low = int(np.searchsorted(ordered, g.start_offset, "left"))
        high = int(np.searchsorted(ordered, g.end_offset, "right"))
        out[g.group_id] = ordered[low:high]
    return out


def _rewriter(spec: StoreSpec, units: Mapping[int, RewriteUnit]) -> Callable[[pa.Table], pa.Table]:
    def rewrite(chunk: pa.Table) -> pa.Table:
        unit = units[chunk[CHUNK_SLOT][0].as_py()]
        store = spec.open()
        try:
            winners = split_winners(chunk["offset"].to_numpy(), unit.groups)
            outcome = UnitOutcome(unit.tp, rewrite_groups(store, unit.task, unit.groups, winners))
        except KcompactError as exc:  # quarantine this partition: what it uploaded stays unreferenced (gc)
            outcome = UnitOutcome(unit.tp, error=exc, requests=store.stats)
        return pa.table({"tp": [unit.tp], "outcome": [pickle.dumps(outcome)]}, schema=_OUTCOMES)

    return rewrite


def run_rewrites(spec: StoreSpec, chunks: DataFrame, units: Mapping[int, RewriteUnit]) -> list[UnitOutcome]:
    """Run every unit on `chunks` (slot, offset) rows laid out by `chunk_winners`; one outcome per unit."""
    rows = chunks.groupBy(CHUNK_SLOT).applyInArrow(_rewriter(spec, units), "tp int, outcome binary").collect()
    return [pickle.loads(row.outcome) for row in rows]


__all__ = ["RewriteUnit", "UnitOutcome", "run_rewrites", "split_winners"]
