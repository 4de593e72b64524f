"""Executor side of a partition's rewrite: chunk by chunk, download, rewrite, upload under fresh ids.

The values here (`PartitionTask`, `GroupTask`, `InputSegment`, `ActiveProducer`) are small, frozen and picklable:
the driver builds them from the plan and ships them to the task; the task opens the store from its spec.
Groups are rewritten in offset order because Kafka's transaction-marker state runs across a round's groups.
Every output object gets a new segment id, so nothing an earlier (or concurrent) attempt wrote is ever
overwritten; what is uploaded becomes live only when the driver commits the metadata.

**Bounded chunks.** Each group is one chunk: its input segments are downloaded into a temporary directory
(`get_to_file`, streamed) and memory-mapped, the cleaned segment is built in memory (never larger than its
inputs), uploaded, and the chunk's files are deleted before the next chunk starts. So a task holds at most
one chunk's inputs on local disk and one chunk's output in memory, whatever the partition's size. The
driver sizes chunks to at most min(segment.bytes, disk budget) (`bloom.skipping.regroup_around`); a chunk
above `disk_budget_bytes` is refused (`DiskBudgetError`) before anything is downloaded, and the largest
temporary-directory size actually seen (`peak_temp_bytes`, measured by listing the directory after every
download) is reported.

**Filters.** Every output segment gets its `.bloom` object (`compaction.bloom`), built from a scan of the
output, under the output's own id. Clean inputs the Spark scan did not read (`InputSegment.resolve`) get
their winners here, from the partition's dirty keys (`compaction.rewrite.resolve`), so they are read once.
"""

from __future__ import annotations

import gc
import mmap
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compaction.bloom.segment import segment_filter
from compaction.config import CompactionStrategy
from compaction.errors import ConfigError
from compaction.format.indexes import AbortedTxn
from compaction.format.scan import scan_segment
from compaction.rewrite.group import ActiveProducer, SegmentInput, TransactionState, rewrite_group
from compaction.rewrite.resolve import DirtyKeys, resolve_clean_segment
from compaction.storage.base import ObjectStore
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key

__all__ = [
    "ActiveProducer",
    "DiskBudgetError",
    "GroupTask",
    "InputSegment",
    "PartitionRewrite",
    "PartitionTask",
    "check_budget",
    "rewrite_partition",
]


class DiskBudgetError(ConfigError):
    """A chunk would need more temporary disk than the budget allows: raise the budget (a rerun alone fails)."""


@dataclass(frozen=True)
class InputSegment:
    segment_id: str
    start_offset: int
    end_offset: int
    keys: Mapping[str, str]  # suffix -> object key
    size: int = 0  # bytes of the `.log` object (metadata's segment_size_bytes)
    resolve: bool = False  # a clean segment the Spark scan did not read: its winners are found in the task


@dataclass(frozen=True)
class GroupTask:
    group_id: int
    start_offset: int
    end_offset: int
    inputs: tuple[InputSegment, ...]

    @property
    def size(self) -> int:
        return sum(i.size for i in self.inputs)


@dataclass(frozen=True)
class PartitionTask:
    topic: str
    topic_id: str
    partition: int
    upper_bound_offset: int
    now_ms: int
    delete_retention_ms: int
    index_interval_bytes: int
    aborted: tuple[AbortedTxn, ...]
    active_producers: Mapping[int, ActiveProducer]
    groups: tuple[GroupTask, ...]
    strategy: str = "offset"  # compaction.strategy: the Spark side ranks records with it
    strategy_header: str | None = None
    bloom_fpp: float = 0.01  # bloom.filter.fpp of the filters written with the outputs
    disk_budget_bytes: int | None = None  # the most temporary disk one chunk may use; None: no limit
    temp_dir: str | None = None  # where chunks are downloaded; None: the system's temporary directory


@dataclass
class PartitionRewrite:
    """Per group (in order) its result, and what the whole task did (chunks, disk, requests, resolved inputs)."""

    groups: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


# Companions copied from the group's last member: the producer state and the epoch lineage as of its end,
# which compaction does not change (offsets, sequences and the last batch of every producer are kept).
_CARRIED = (Suffix.PRODUCER_SNAPSHOT, Suffix.LEADER_EPOCH_CHECKPOINT)


def rewrite_partition(
    store: ObjectStore,
    task: PartitionTask,
    winners: Mapping[int, Sequence[int] | np.ndarray],
    dirty: DirtyKeys | None = None,
) -> PartitionRewrite:
    """Rewrite every group of `task` in order, one chunk at a time. Uploads, commits nothing.

    Args:
        winners: per group id, the sorted winning offsets Spark found within the group.
        dirty: the partition's dirty keys with their best ranks; needed when some input has `resolve` set.

    Raises:
        DiskBudgetError: a group's inputs exceed `task.disk_budget_bytes` (checked before any download).
        CorruptInputError (subclasses): a malformed input, naming the object and byte position.
    """
    check_budget(task)
    out = PartitionRewrite()
    summary = _Summary(budget=task.disk_budget_bytes)
    state = TransactionState.start(task.aborted)
    superseded = np.empty(0, np.int64)
    with tempfile.TemporaryDirectory(prefix="kcompact-rewrite-", dir=task.temp_dir) as tmp:
        for group in task.groups:
            started = time.monotonic()
            with _downloaded(store, group, Path(tmp), summary) as inputs:
                downloaded = time.monotonic()
                found, newly = _resolved_winners(task, group, inputs, dirty, summary)
                superseded = np.union1d(superseded, newly)
                spark_winners = np.asarray(winners.get(group.group_id, ()), dtype=np.int64)
                group_winners = np.union1d(np.setdiff1d(spark_winners, superseded), found)
                output, state = rewrite_group(
                    inputs,
                    group_winners,
                    upper_bound_offset=task.upper_bound_offset,
                    now_ms=task.now_ms,
                    delete_retention_ms=task.delete_retention_ms,
                    index_interval_bytes=task.index_interval_bytes,
                    active_producers=task.active_producers,
                    txn_state=state,
                )
            summary.chunks += 1
            rewritten = time.monotonic()
            result = _upload(store, task, group, output, started)
            result["stats"] |= {  # executor time of this chunk, in ms (summed into the partition's stats)
                "download_task_ms": round(1000 * (downloaded - started)),
                "rewrite_task_ms": round(1000 * (rewritten - downloaded)),
                "upload_task_ms": round(1000 * (time.monotonic() - rewritten)),
            }
            out.groups.append((group.group_id, result))
    out.summary = summary.to_dict(store)
    return out


def check_budget(task: PartitionTask) -> None:
    """Raise DiskBudgetError if some group of `task` needs more temporary disk than its budget."""
    budget = task.disk_budget_bytes
    group = max(task.groups, key=lambda g: g.size, default=None)
    if budget is not None and group is not None and group.size > budget:
        raise DiskBudgetError(
            f"{task.topic}-{task.partition}: the chunk at offset {group.start_offset} needs {group.size} bytes of "
            f"temporary disk, above the disk budget of {budget} bytes; raise --disk-budget-bytes to at least "
            f"{group.size} (a single segment is never split)"
        )


@dataclass
class _Summary:
    budget: int | None
    chunks: int = 0
    peak_temp_bytes: int = 0
    resolved: dict[str, int] = field(default_factory=dict)  # segment id -> dirty keys it really holds

    def measure(self, directory: Path) -> None:
        used = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
        self.peak_temp_bytes = max(self.peak_temp_bytes, used)

    def to_dict(self, store: ObjectStore) -> dict[str, Any]:
        s = store.stats
        return {
            "chunks": self.chunks,
            "peak_temp_bytes": self.peak_temp_bytes,
            "disk_budget_bytes": self.budget,
            "resolved": self.resolved,
            "store": {"gets": s.gets, "puts": s.puts, "bytes_read": s.bytes_read, "bytes_written": s.bytes_written},
        }


@contextmanager
def _downloaded(store: ObjectStore, group: GroupTask, tmp: Path, summary: _Summary) -> Iterator[list[SegmentInput]]:
    """The group's inputs, downloaded into `tmp` and memory-mapped; every file is gone on exit."""
    files: list[Path] = []
    maps: list[mmap.mmap] = []
    views: list[memoryview] = []
    try:
        inputs = []
        for seg in group.inputs:
            key = seg.keys[Suffix.LOG.value]
            path = tmp / f"{seg.start_offset:020d}-{seg.segment_id}.log"
            files.append(path)
            size = store.get_to_file(key, path)
            summary.measure(tmp)
            data: bytes | memoryview = b""
            if size:
                with open(path, "rb") as f:
                    maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                views.append(memoryview(maps[-1]))
                data = views[-1]
            inputs.append(SegmentInput(data, seg.start_offset, store.object_uri(key)))
        yield inputs
    finally:
        inputs = []
        _release(views, maps)
        for path in files:
            path.unlink(missing_ok=True)


def _release(views: list[memoryview], maps: list[mmap.mmap]) -> None:
    """Unmap the inputs: a deleted file keeps its disk space while a mapping of it lives."""
    for attempt in range(2):
        try:
            for v in views:
                v.release()
            for m in maps:
                m.close()
            return
        except BufferError:  # a slice of an input outlived the rewrite: collect it, then retry once
            if attempt:
                raise
            gc.collect()


def _resolved_winners(
    task: PartitionTask, group: GroupTask, inputs: Sequence[SegmentInput], dirty: DirtyKeys | None,
    summary: _Summary,
) -> tuple[np.ndarray, np.ndarray]:
    """Winners and superseded offsets of the group's inputs that Spark did not scan."""
    found: list[np.ndarray] = [np.empty(0, np.int64)]
    superseded: list[np.ndarray] = [np.empty(0, np.int64)]
    ranges = [(t.producer_id, t.first_offset, t.last_offset) for t in task.aborted]
    for seg, data in zip(group.inputs, inputs, strict=True):
        if not seg.resolve:
            continue
        if dirty is None:
            raise ValueError(f"{data.obj}: a clean input to resolve in the task needs the partition's dirty keys")
        r = resolve_clean_segment(
            data.data, obj=data.obj, strategy=CompactionStrategy(task.strategy), header=task.strategy_header,
            aborted=ranges, dirty=dirty,
        )
        found.append(r.winners)
        superseded.append(r.superseded)
        summary.resolved[seg.segment_id] = r.dirty_found
    return np.concatenate(found), np.concatenate(superseded)


def _upload(store: ObjectStore, task: PartitionTask, group: GroupTask, output: Any, started: float) -> dict[str, Any]:
    segment_id = new_segment_id()

    def key(suffix: Suffix) -> str:
        return segment_object_key(task.topic, task.topic_id, task.partition, group.start_offset, segment_id, suffix)

    objects = {
        Suffix.LOG: output.log,
        Suffix.OFFSET_INDEX: output.offset_index,
        Suffix.TIME_INDEX: output.time_index,
    }
    if output.txn_index:
        objects[Suffix.TXN_INDEX] = output.txn_index
    last = group.inputs[-1]
    for suffix in _CARRIED:
        if suffix.value in last.keys:
            objects[suffix] = store.get(last.keys[suffix.value])
    scan = scan_segment(output.log, obj=f"cleaned {key(Suffix.LOG)}", verify_crc=False)
    objects[Suffix.BLOOM] = segment_filter(scan, task.bloom_fpp).to_bytes()
    for suffix, data in objects.items():
        store.put(key(suffix), data)
    stats = output.stats
    return {
        "group_id": group.group_id,
        "segment_id": segment_id,
        "start_offset": group.start_offset,
        "end_offset": group.end_offset,
        "size": len(output.log),
        "max_timestamp_ms": stats.max_timestamp,
        "first_batch_max_timestamp_ms": stats.first_batch_max_timestamp,
        "record_count": stats.records_written,
        "object_keys": {s.value: key(s) for s in objects},
        "stats": stats.to_dict(),
        "seconds": time.monotonic() - started,
    }
