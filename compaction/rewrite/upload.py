"""Executor side of a rewrite: chunk by chunk, take the inputs, rewrite, upload under fresh ids.

The task values (`compaction.tasks`) are small, frozen and picklable: the driver builds them from the plan
and ships them; the task opens the store from its spec. Every output object gets a new segment id, so nothing an
earlier (or concurrent) attempt wrote is ever overwritten; what is uploaded becomes live only when the driver
commits the metadata.

**Chunks in parallel.** Kafka's transaction-marker state runs across a round's groups; the driver computes the
state at the start of every group ahead (`compaction.strategies.transactions.states_at`, from the batches the
scan saw), so each `GroupTask` carries its own and a partition's groups are rewritten as separate tasks, on every
core. Given groups without a state, `rewrite_groups` threads the state through them in order, as one task.

**Bounded chunks.** A chunk's inputs are taken from the run's segment cache (`compaction.rewrite.cache`: the scan
already fetched them) or downloaded (`get_to_file`, streamed) into a temporary directory and memory-mapped; the
cleaned segment is built in memory (never larger than its inputs), uploaded, and the chunk's files are deleted
before the next chunk starts. The driver sizes chunks to at most min(segment.bytes, disk budget); a chunk above
`disk_budget_bytes` is refused (`DiskBudgetError`) before anything is downloaded, and the largest
temporary-directory size seen (`peak_temp_bytes`, measured after every input is in place) is reported.

**Objects.** Every output segment is two objects under the output's own id (`compaction.storage.indexes`): its
`.log`, and one `.indexes` object holding its offset, time and transaction indexes, the producer snapshot and
leader-epoch checkpoint of the group's last input, and its key filter (`compaction.bloom`): from the key hashes of
the records kept where the task's own scan hashed its inputs' keys (`SegmentInput.records`, a held segment with a
compressed batch: its output is then not decompressed again), else from a scan of the output. That scan runs beside
the rewrite, in threads: the output each input segment adds is scanned for the filter
while the next input is rewritten (`rewrite_group`'s `on_written`; the numba scan and hashing release the
interpreter). A chunk above `IN_MEMORY_BYTES` writes its `.log` into the store piece by piece as the rewrite makes
them (`_LogStream`, `ObjectStore.put_pieces`: a local store's temporary file, S3's multipart parts; a store write
waits on I/O), and never joins them (`RewriteOutput.pieces`); a smaller one puts both its objects at once. The chunk
holding most winners ends a hot partition's rewrite, and the core its earlier chunks freed takes that work, instead
of the chunk's rewrite, filter and upload running one after the other.
"""

from __future__ import annotations

import gc
import mmap
import os
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compaction.bloom.filter import KeyFilter
from compaction.bloom.segment import FilterPart, filter_part, joined_filter, known_part
from compaction.errors import ConfigError
from compaction.rewrite.cache import SegmentCache
from compaction.rewrite.group import Held, SegmentInput, TransactionState, rewrite_group
from compaction.storage.base import ObjectStore, StoreStats, shared_pool
from compaction.storage.indexes import get_parts, pack_parts, segment_keys, segment_objects
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key
from compaction.tasks import GroupTask, PartitionTask

__all__ = ["ChunkResult", "DiskBudgetError", "PartitionRewrite", "check_budget", "rewrite_groups"]


class DiskBudgetError(ConfigError):
    """A chunk would need more temporary disk than the budget allows: raise the budget (a rerun alone fails)."""


@dataclass(frozen=True)
class ChunkResult:
    """One rewritten group: the uploaded segment (`object_keys` by suffix) and what the rewrite counted."""

    group_id: int
    segment_id: str
    start_offset: int
    end_offset: int
    size: int
    max_timestamp_ms: int
    first_batch_max_timestamp_ms: int
    record_count: int
    object_keys: Mapping[str, str]
    stats: Mapping[str, int]
    seconds: float
    transactional: bool = False  # it holds a transactional or control batch


@dataclass
class PartitionRewrite:
    """The chunks one task rewrote (in order), and what it did besides (chunks, disk, requests, cache hits)."""

    groups: list[ChunkResult] = field(default_factory=list)
    chunks: int = 0
    peak_temp_bytes: int = 0
    cache_hits: int = 0
    requests: StoreStats = field(default_factory=StoreStats)


# Files carried over from the group's last member: the producer state and the epoch lineage as of its end, which
# compaction does not change (offsets, sequences and the last batch of every producer are kept).
_CARRIED = (Suffix.PRODUCER_SNAPSHOT, Suffix.LEADER_EPOCH_CHECKPOINT)


_SCRATCH: ContextVar[dict[str | None, str] | None] = ContextVar("kcompact_rewrite_scratch", default=None)


@contextmanager
def shared_scratch() -> Iterator[None]:
    """Within it, the `rewrite_groups` calls of this thread download their chunks into one temporary directory (per
    `PartitionTask.temp_dir`), made at the first call and removed on exit, rather than one directory per call: a
    Spark task rewriting hundreds of small partitions spent as long making and removing their directories as
    rewriting some of them. A call leaves the directory as it found it (its chunk's files go when the chunk is
    done)."""
    made: dict[str | None, str] = {}
    token = _SCRATCH.set(made)
    try:
        yield
    finally:
        _SCRATCH.reset(token)
        for directory in made.values():
            shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _scratch(temp_dir: str | None) -> Iterator[str]:
    """Where a call's chunks are downloaded: the thread's shared directory (`shared_scratch`), else its own."""
    made = _SCRATCH.get()
    if made is None:
        with tempfile.TemporaryDirectory(prefix="kcompact-rewrite-", dir=temp_dir) as tmp:
            yield tmp
        return
    if temp_dir not in made:
        made[temp_dir] = tempfile.mkdtemp(prefix="kcompact-rewrite-", dir=temp_dir)
    yield made[temp_dir]


def rewrite_groups(
    store: ObjectStore,
    task: PartitionTask,
    groups: Sequence[GroupTask],
    winners: Mapping[int, Sequence[int] | np.ndarray],
    held: Mapping[str, Held] | None = None,
) -> PartitionRewrite:
    """Rewrite `groups` (of `task`, in offset order) one chunk at a time. Uploads, commits nothing.

    Args:
        winners: per group id, the sorted winning offsets Spark found within the group.
        held: the `.log` bytes of some inputs (`group.Held`, with what its scan decoded of their records), by segment
            id, that the caller already holds (the task that scanned them, `compaction.spark.fused`): read from
            memory, neither fetched nor written to disk again, their CRCs, which that scan checked, not checked
            again, and their records not decoded again for the counts.

    A group's `txn_state` is where its marker walk starts; a group without one continues from the group
    before it in `groups` (the first from the round's start).

    Raises:
        DiskBudgetError: a group's inputs exceed `task.disk_budget_bytes` (checked before any download).
        CorruptInputError (subclasses): a malformed input, naming the object and byte position.
    """
    check_budget(task, groups)
    out = PartitionRewrite()
    before = replace(store.stats)
    cache = SegmentCache(task.cache_dir) if task.cache_dir else None
    state: TransactionState | None = None
    pool = shared_pool("filter", 1)  # an output's filter, built beside its rewrite
    parts: _FilterParts | None = None
    stream: _LogStream | None = None
    with _scratch(task.temp_dir) as tmp:
        try:
            for group in groups:
                started = time.monotonic()
                if group.txn_state is not None:
                    state = group.txn_state
                elif state is None:
                    state = TransactionState.start(task.aborted)
                large = group.size > IN_MEMORY_BYTES
                parts = _FilterParts(pool if large else None, f"cleaned {group.inputs[0].segment_id}")
                segment_id = new_segment_id()
                stream = _LogStream(store, _key(task, group, segment_id, Suffix.LOG)) if large else None
                with _inputs(store, group, Path(tmp), out, cache, held or {}) as inputs:
                    downloaded = time.monotonic()
                    output, state = rewrite_group(
                        inputs,
                        np.asarray(winners.get(group.group_id, ()), dtype=np.int64),
                        upper_bound_offset=task.upper_bound_offset,
                        now_ms=task.now_ms,
                        delete_retention_ms=task.delete_retention_ms,
                        index_interval_bytes=task.index_interval_bytes,
                        active_producers=task.active_producers,
                        txn_state=state,
                        on_written=parts.add if stream is None else stream.then(parts.add),
                    )
                out.chunks += 1
                rewritten = time.monotonic()
                out.groups.append(_upload(store, task, group, segment_id, output, parts, stream, started, {
                    "download_task_ms": round(1000 * (downloaded - started)),
                    "rewrite_task_ms": round(1000 * (rewritten - downloaded)),
                }))
                stream = None
        finally:  # nothing of this call still runs in the shared pool once it returns or raises
            if parts is not None:
                parts.settle()
            if stream is not None:
                stream.abort()
    out.requests = store.stats - before
    return out


def check_budget(task: PartitionTask, groups: Sequence[GroupTask] | None = None) -> None:
    """Raise DiskBudgetError if some group (of `groups`, default the task's) needs more temporary disk than the
    budget."""
    budget = task.disk_budget_bytes
    group = max(task.groups if groups is None else groups, key=lambda g: g.size, default=None)
    if budget is not None and group is not None and group.size > budget:
        raise DiskBudgetError(
            f"{task.topic}-{task.partition}: the chunk at offset {group.start_offset} needs {group.size} bytes of "
            f"temporary disk, above the disk budget of {budget} bytes; raise --disk-budget-bytes to at least "
            f"{group.size} (a single segment is never split)"
        )


IN_MEMORY_BYTES = 16 << 20
"""A chunk of at most this many bytes is read into memory rather than mapped: for a small partition's segment,
mapping and unmapping the file cost more than reading it."""


@contextmanager
def _inputs(store: ObjectStore, group: GroupTask, tmp: Path, out: PartitionRewrite, cache: SegmentCache | None,
            held: Mapping[str, Held]) -> Iterator[list[SegmentInput]]:
    """The group's inputs: those `held` as they are (counted as cache hits: not fetched again), the others in
    `tmp` (from the run's cache, else linked from a local store or downloaded), memory-mapped (a group of at most
    `IN_MEMORY_BYTES`: read); gone on exit."""
    files: list[Path] = []
    maps: list[mmap.mmap] = []
    views: list[memoryview] = []
    try:
        inputs = []
        for seg in group.inputs:
            key = seg.keys[Suffix.LOG.value]
            if seg.segment_id in held:
                out.cache_hits += 1
                h = held[seg.segment_id]  # the scan that holds them checked their CRCs and decoded their records
                inputs.append(SegmentInput(h.data, seg.start_offset, store.object_uri(key), verified=True,
                                           records=h.records))
                continue
            path = tmp / f"{seg.start_offset:020d}-{seg.segment_id}.log"
            files.append(path)
            size = cache.take(seg.segment_id, path) if cache is not None else None
            if size is not None:
                out.cache_hits += 1
            else:  # a local store's file is linked (no byte copied), else downloaded
                size = store.link_to_file(key, path)
                if size is None:
                    size = store.get_to_file(key, path)
            out.peak_temp_bytes = max(out.peak_temp_bytes, _used(tmp))
            data: bytes | memoryview = b""
            if size and group.size <= IN_MEMORY_BYTES:
                data = path.read_bytes()
            elif size:
                with open(path, "rb") as f:
                    maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                views.append(memoryview(maps[-1]))
                data = views[-1]
            inputs.append(SegmentInput(data, seg.start_offset, store.object_uri(key)))
        yield inputs
    finally:
        inputs = []
        _release(views, maps, failing=sys.exc_info()[1] is not None)
        for path in files:
            path.unlink(missing_ok=True)


def _used(directory: Path) -> int:
    return sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())


def _release(views: list[memoryview], maps: list[mmap.mmap], *, failing: bool = False) -> None:
    """Unmap the inputs: a deleted file keeps its disk space while a mapping of it lives.

    While the chunk is `failing`, the error's traceback may still hold a slice of an input: the mapping then
    goes with the traceback, and the chunk's own error (a corrupt input, say) is what the task reports, not a
    BufferError from cleaning up after it."""
    for attempt in range(2):
        try:
            for v in views:
                v.release()
            for m in maps:
                m.close()
            return
        except BufferError:  # a slice of an input outlived the rewrite: collect it, then retry once
            if attempt and not failing:
                raise
            if attempt:
                return
            gc.collect()


class _FilterParts:
    """The output's filter, built piece by piece in `pool`'s thread while the rewrite goes on: `add` is
    `rewrite_group`'s `on_written` (the numba scan and hashing release the interpreter). Without a pool (a small
    chunk, whose handing over to a thread cost more than its pieces), each piece is built at once."""

    def __init__(self, pool: ThreadPoolExecutor | None, obj: str) -> None:
        self.pool, self.obj = pool, obj
        self.parts: list[Future[FilterPart]] = []

    def add(self, data: bytes | memoryview, hashes: np.ndarray | None = None) -> None:
        """The piece `data`, given the hashes of its data records' keys if the rewrite knew them (no decoding
        then: only its batch headers are walked)."""
        if hashes is not None:
            done: Future[FilterPart] = Future()
            done.set_result(known_part(data, hashes, obj=self.obj))
            self.parts.append(done)
            return
        if self.pool is not None:
            self.parts.append(self.pool.submit(filter_part, data, obj=self.obj))
            return
        done = Future()
        done.set_result(filter_part(data, obj=self.obj))
        self.parts.append(done)

    def filter(self, fpp: float) -> KeyFilter:
        return joined_filter([f.result() for f in self.parts], fpp)

    def settle(self) -> None:
        """Cancel the pieces not started and wait for the others (their results, or errors, are not needed)."""
        for f in self.parts:
            f.cancel()
        wait(self.parts)


Written = Callable[[bytes | memoryview, np.ndarray | None], None]
"""`rewrite_group`'s `on_written`."""


class _LogStream:
    """A large chunk's `.log`, written into the store piece by piece while the rewrite goes on (`put_pieces`, in
    a thread of its own: a store write waits on I/O): each piece the rewrite adds is handed over as it comes
    (`then`), so that when the rewrite ends only its last piece is left to write. The chunk holding most winners
    ends a hot partition's run, and its output's write had waited for its whole rewrite: on P6's hot partition,
    1.2-2.0 s after a rewrite of 0.8-0.9 s (BENCHMARKS.md P6)."""

    _END = object()
    _ABORT = object()

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.key = key
        self._pieces: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._put = shared_pool("log-stream", 2).submit(store.put_pieces, key, self._taken())

    def _taken(self) -> Iterator[bytes | memoryview]:
        while (piece := self._pieces.get()) is not self._END:
            if piece is self._ABORT:
                raise _StreamAborted(self.key)
            yield piece

    def then(self, add: Written) -> Written:
        """`rewrite_group`'s `on_written`: the piece handed to the write, then to `add` (the filter's)."""
        def written(data: bytes | memoryview, hashes: np.ndarray | None = None) -> None:
            self._pieces.put(data)
            add(data, hashes)
        return written

    def close(self) -> float:
        """Wait for the object to be in place (raising the write's error); the seconds waited."""
        waiting = time.monotonic()
        self._pieces.put(self._END)
        self._put.result()
        return time.monotonic() - waiting

    def abort(self) -> None:
        """Stop the write (nothing is created) and wait for it to end."""
        self._pieces.put(self._ABORT)
        wait([self._put])


class _StreamAborted(Exception):
    """A streamed `.log`'s write stopped because its rewrite failed: nothing of it was created."""


def _key(task: PartitionTask, group: GroupTask, segment_id: str, suffix: Suffix) -> str:
    return segment_object_key(task.topic, task.topic_id, task.partition, group.start_offset, segment_id, suffix)


def _put_all(store: ObjectStore, objects: Mapping[str, bytes]) -> float:
    """Put every object at once (`ObjectStore.put_many`: nothing references them before the commit); the seconds it
    took."""
    started = time.monotonic()
    store.put_many(objects)
    return time.monotonic() - started


def _upload(store: ObjectStore, task: PartitionTask, group: GroupTask, segment_id: str, output: Any,
            filters: _FilterParts, stream: _LogStream | None, started: float, times: dict[str, int]) -> ChunkResult:

    def key(suffix: Suffix) -> str:
        return _key(task, group, segment_id, suffix)

    parts = {
        Suffix.OFFSET_INDEX: output.offset_index,
        Suffix.TIME_INDEX: output.time_index,
    }
    if output.txn_index:
        parts[Suffix.TXN_INDEX] = output.txn_index
    last = group.inputs[-1]
    carried = {suffix: last.keys[suffix.value] for suffix in _CARRIED if suffix.value in last.keys}
    parts.update(get_parts(store, carried))  # read, not copied: they go in the new segment's .indexes object
    filtering = time.monotonic()
    if filters.pool is None:  # a small chunk: its filter is all but built, and both objects go in one round
        parts[Suffix.BLOOM] = filters.filter(task.bloom_fpp).to_bytes()
        filtered = time.monotonic()
        objects, keys = segment_objects(key, output.log, parts)
        upload_seconds = _put_all(store, objects)
    else:  # a large chunk: its .log was written while the rewrite went on (the caller aborts it if this raises)
        if stream is None:
            raise ValueError("a chunk whose filter is built beside its rewrite streams its .log")
        bloom = filters.filter(task.bloom_fpp).to_bytes()
        filtered = time.monotonic()
        upload_seconds = stream.close()  # the seconds its write went on after the filter was built
        keys = segment_keys(key, [*parts, Suffix.BLOOM])  # the .log is written: neither joined nor put again
        upload_seconds += _put_all(store, {keys[Suffix.INDEXES]: pack_parts({**parts, Suffix.BLOOM: bloom})})
    times = {**times, "rewrite_task_ms": times["rewrite_task_ms"] + round(1000 * (filtered - filtering))}
    stats = output.stats
    return ChunkResult(
        group_id=group.group_id,
        segment_id=segment_id,
        start_offset=group.start_offset,
        end_offset=group.end_offset,
        size=output.size,
        max_timestamp_ms=stats.max_timestamp,
        first_batch_max_timestamp_ms=stats.first_batch_max_timestamp,
        record_count=stats.records_written,
        object_keys={s.value: k for s, k in keys.items()},
        stats={**stats.to_dict(), **times, "upload_task_ms": round(1000 * upload_seconds)},
        seconds=time.monotonic() - started,
        transactional=output.transactional,
    )
