"""`kcompact wal upload`: the recent part of a broker's log dir into combined objects (KIP-1176's combiner).

Per partition of the log dir (`plan_partition`):

1. The store's log for it (`compaction.wal.view`): tier end, WAL end, the epochs it knows.
2. **Fencing**: a log dir whose latest leader epoch is older than one the store knows is a deposed leader
   (or a follower behind): it uploads nothing for the partition (`FencedError`, exit 4).
3. **Where to start**, as a Kafka follower finds its truncation point (OffsetsForLeaderEpoch): the end
   offset, in the log dir's lineage, of the largest epoch <= the store's latest epoch. If the store holds
   more than that under its epoch, the log dir's newer epoch diverged there, and the upload starts at the
   divergence point; the newer epoch then truncates the store's older data (`compaction.wal.log`). Never
   below the tier's end (the tier is committed data).
4. Every batch from there on, from rolled and active segments alike (CRCs checked; an active segment's
   incomplete last batch, a write in progress, is left for the next run and reported), cut where the
   leader epoch changes.

Every batch is read and CRC-checked before anything of its partition is uploaded; the packer then reads the
segment files again, one at a time, so memory holds one file and the objects of one group, not the log dir.
Then the slices of all partitions are packed into combined objects of at most `max_object_bytes` (a batch
larger than that gets an object of its own), in groups: STARTED commit for the group, the PUTs (in
parallel, each a fresh key, never overwritten), FINISHED commit. A crash leaves STARTED objects that no
reader sees and `kcompact gc` removes; the rerun uploads the same data again under new ids.
"""

from __future__ import annotations

import itertools
import mmap
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from compaction.errors import (
    CorruptInputError,
    Failure,
    FencedError,
    KcompactError,
    TruncatedSegmentError,
    worst_exit_code,
)
from compaction.format.checkpoints import EpochEntry
from compaction.format.segment import LOG_SUFFIX, BatchHeader, iter_batch_headers, segment_path
from compaction.metadata.model import OfPartition, SegmentState, TopicPartition, new_kafka_uuid
from compaction.storage.base import ObjectStore
from compaction.tier.logdir import LocalPartition, partitions
from compaction.wal.log import PartitionLog, epoch_end
from compaction.wal.model import WalEntry, WalObject, wal_object_key
from compaction.wal.table import WalTable
from compaction.wal.view import store_log

DEFAULT_MAX_OBJECT_BYTES = 4 * 1024 * 1024
GROUP_OBJECTS = 16
"""Objects per STARTED/FINISHED commit pair: 64 MiB at the default size, so a crash re-uploads at most that."""
PUT_THREADS = 4


@dataclass
class PartitionUpload(Failure, OfPartition):
    """What one partition's upload did, or why it did nothing."""

    topic: str
    partition: int
    status: str = "up_to_date"  # uploaded | up_to_date | fenced | failed
    from_offset: int | None = None
    end_offset: int | None = None  # next offset after what was uploaded
    diverged_at: int | None = None  # the store held more than this under an older epoch
    batches: int = 0
    bytes: int = 0
    incomplete_tail_bytes: int = 0


@dataclass(frozen=True)
class _Run:
    """Consecutive batches of one partition and one leader epoch, as bytes of a local `.log`."""

    topic: str
    topic_id: str
    partition: int
    epoch: int
    data: memoryview
    headers: tuple[BatchHeader, ...]


@dataclass
class UploadReport:
    partitions: list[PartitionUpload] = field(default_factory=list)
    objects: list[WalObject] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.partitions)

    def to_dict(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "objects": len(self.objects),
            "bytes": sum(o.size for o in self.objects),
            "partitions": [p.to_dict() for p in self.partitions],
            "object_ids": [o.object_id for o in self.objects],
        }


def default_writer() -> str:
    return f"kcompact-wal-upload@{socket.gethostname()}"


def upload_from(log: PartitionLog, dir_epochs: Sequence[EpochEntry], dir_start: int, dir_end: int) -> int:
    """The first offset to upload for a log dir holding `[dir_start, dir_end)` with lineage `dir_epochs`.

    Raises FencedError for a deposed leader (see the module docstring).
    """
    store_end = log.end_offset
    if store_end is None:
        return dir_start
    latest = log.latest_epoch
    dir_latest = max((e.epoch for e in dir_epochs), default=None)
    if latest is not None and dir_latest is not None and dir_latest < latest:
        raise FencedError(
            f"{log.topic}-{log.partition}: the log dir's latest leader epoch {dir_latest} is older than epoch "
            f"{latest} in the store (from offset {log.epoch_starts[latest]}): a deposed leader uploads nothing"
        )
    start = store_end
    if latest is not None and dir_epochs:
        # The log dir's end for the store's latest epoch; before its first epoch if it has none that old.
        ended = epoch_end({e.epoch: e.start_offset for e in dir_epochs}, dir_end, latest)
        start = min(start, dir_epochs[0].start_offset if ended is None else ended)
    return max(start, log.tier_end or 0)


def _segment_runs(part: LocalPartition, topic_id: str, start: int, result: PartitionUpload, *,
                  end: int | None = None, verify: bool = True) -> Iterator[_Run]:
    """The batches at or above `start` (and below `end`), as runs of one epoch each, one segment file at a time.

    Only the file being read is in memory (plus what the caller still holds of earlier runs).
    """
    bases = part.segment_bases()
    first = max((i for i, b in enumerate(bases) if b <= start), default=0)
    for i, base in enumerate(bases[first:], first):
        if end is not None and base >= end:
            return
        path = segment_path(part.directory, base, LOG_SUFFIX)
        active = i == len(bases) - 1
        data = _read(path)
        headers: list[BatchHeader] = []
        try:
            for h in iter_batch_headers(data, obj=str(path), verify_crc=verify):
                if end is not None and h.base_offset >= end:
                    break
                if h.base_offset + h.last_offset_delta >= start:
                    headers.append(h)
        except TruncatedSegmentError as exc:
            if not active or exc.position is None:
                raise
            # A batch being appended to the active segment: upload up to it; the next run takes it.
            result.incomplete_tail_bytes = len(data) - exc.position
        yield from _by_epoch(part, topic_id, memoryview(data), headers)


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return b""
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m[:]


def _by_epoch(part: LocalPartition, topic_id: str, data: memoryview, headers: list[BatchHeader]) -> Iterator[_Run]:
    run: list[BatchHeader] = []
    for h in headers:
        if run and h.partition_leader_epoch != run[0].partition_leader_epoch:
            yield _Run(part.topic, topic_id, part.partition, run[0].partition_leader_epoch, data, tuple(run))
            run = []
        run.append(h)
    if run:
        yield _Run(part.topic, topic_id, part.partition, run[0].partition_leader_epoch, data, tuple(run))


def _local_end(part: LocalPartition) -> tuple[int, int]:
    """(first offset, next offset) of the log dir's partition, from its first and last segment."""
    bases = part.segment_bases()
    if not bases:
        return 0, 0
    path = segment_path(part.directory, bases[-1], LOG_SUFFIX)
    end = bases[-1]
    try:
        for h in iter_batch_headers(_read(path), obj=str(path)):
            end = h.base_offset + h.last_offset_delta + 1
    except TruncatedSegmentError:
        pass  # the active segment's batch in progress: counted by the upload itself
    return bases[0], end


def plan_partition(part: LocalPartition, log: PartitionLog) -> tuple[PartitionUpload, Callable[[], Iterator[_Run]]]:
    """What to upload for one partition (see the module docstring): its counts, and the runs to upload, read
    again lazily when the packer gets to them. Every batch is CRC-checked here, before anything is uploaded;
    raises what `upload_from` raises and CorruptInputError for a malformed local log."""
    result = PartitionUpload(part.topic, part.partition)
    topic_id = part.topic_id
    dir_start, dir_end = _local_end(part)
    epochs = part.leader_epochs()
    start = upload_from(log, epochs, dir_start, dir_end)
    store_end = log.end_offset
    if store_end is not None and start < store_end:
        result.diverged_at = start
    if start < dir_start:
        raise CorruptInputError(
            f"the store's log of {part.topic}-{part.partition} ends at offset {start}, but the log dir starts at "
            f"{dir_start}: offsets {start}..{dir_start - 1} are in neither (tier them first)",
            obj=str(part.directory),
        )
    result.from_offset = start
    last: BatchHeader | None = None
    for run in _segment_runs(part, topic_id, start, result) if start < dir_end else ():
        result.batches += len(run.headers)
        result.bytes += sum(h.size for h in run.headers)
        last = run.headers[-1]
    if last is None:
        return result, lambda: iter(())
    end = last.base_offset + last.last_offset_delta + 1
    result.end_offset, result.status = end, "uploaded"
    # The second read stops where the first did: a broker appending meanwhile adds nothing unchecked.
    return result, lambda: _segment_runs(part, topic_id, start, PartitionUpload(part.topic, part.partition),
                                         end=end, verify=False)


def pack(runs: Iterable[_Run], max_object_bytes: int) -> Iterator[tuple[list[WalEntry], list[memoryview]]]:
    """Cut `runs` (in order) into objects of at most `max_object_bytes`, at batch boundaries.

    Yields each object's entries and the byte pieces that make it up, in order. A batch larger than
    `max_object_bytes` gets an object of its own.
    """
    entries: list[WalEntry] = []
    parts: list[memoryview] = []
    size = 0
    for run in runs:
        hs = run.headers
        i = 0
        while i < len(hs):
            j, taken = i, 0
            while j < len(hs) and (size + taken + hs[j].size <= max_object_bytes or size + taken == 0):
                taken += hs[j].size
                j += 1
            if j > i:
                chunk = hs[i:j]
                _append(entries, _entry(run, chunk, size))
                parts.append(run.data[chunk[0].position : chunk[-1].position + chunk[-1].size])
                size += taken
                i = j
            if i < len(hs):  # the object is full
                yield entries, parts
                entries, parts, size = [], [], 0
    if entries:
        yield entries, parts


def _append(entries: list[WalEntry], e: WalEntry) -> None:
    """Add `e`, merged into the object's last entry when it continues it (the next segment file of the same
    partition and epoch): one entry, one ranged GET for a reader."""
    last = entries[-1] if entries else None
    continues = last is not None and last.end_position == e.start_position
    if last is not None and continues and (last.tp, last.leader_epoch) == (e.tp, e.leader_epoch):
        entries[-1] = replace(last, end_offset=e.end_offset, end_position=e.end_position,
                              max_timestamp_ms=max(last.max_timestamp_ms, e.max_timestamp_ms),
                              record_count=last.record_count + e.record_count)
    else:
        entries.append(e)


def _entry(run: _Run, batch: Sequence[BatchHeader], start: int) -> WalEntry:
    size = sum(h.size for h in batch)
    return WalEntry(
        topic=run.topic,
        topic_id=run.topic_id,
        partition=run.partition,
        start_offset=batch[0].base_offset,
        end_offset=batch[-1].base_offset + batch[-1].last_offset_delta,
        leader_epoch=run.epoch,
        start_position=start,
        end_position=start + size,
        max_timestamp_ms=max(h.max_timestamp for h in batch),
        record_count=sum(h.records_count for h in batch),
    )


def upload_logdir(
    logdir: Path,
    store: ObjectStore,
    now_ms: int,
    *,
    broker_id: int = 0,
    max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
    writer: str | None = None,
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
) -> UploadReport:
    """Upload every partition of `logdir` above what the store holds (see the module docstring).

    A partition that fails (corrupt local log, deposed leader) is reported with its error and exit code;
    the others are uploaded.
    """
    if max_object_bytes < 1:
        raise ValueError(f"max_object_bytes must be positive, not {max_object_bytes}")
    writer = writer or default_writer()
    table = WalTable.in_store(store, create=not dry_run)
    view = store_log(store)
    report = UploadReport()
    readers: list[Callable[[], Iterator[_Run]]] = []
    for part in partitions(logdir):
        try:
            result, reader = plan_partition(part, view.partition(part.topic, part.partition))
            readers.append(reader)
        except KcompactError as exc:
            result = PartitionUpload(part.topic, part.partition,
                                     status="fenced" if isinstance(exc, FencedError) else "failed",
                                     **exc.outcome_fields())
        report.partitions.append(result)
    if dry_run:
        return report
    objects = pack(itertools.chain.from_iterable(r() for r in readers), max_object_bytes)
    try:
        while True:
            group = [next(objects, None) for _ in range(GROUP_OBJECTS)]
            built = [g for g in group if g is not None]
            if not built:
                break
            report.objects.extend(_upload_group(store, table, built, broker_id, writer, now_ms))
            if progress is not None:
                progress(f"{len(report.objects)} objects, {sum(o.size for o in report.objects)} bytes uploaded")
            if len(built) < GROUP_OBJECTS:
                break
    except KcompactError as exc:  # the store or the table failed: partitions with data still to go failed
        _fail_unfinished(report, exc)
    return report


def _fail_unfinished(report: UploadReport, exc: KcompactError) -> None:
    done: dict[TopicPartition, int] = {}
    for o in report.objects:
        for e in o.entries:
            done[e.tp] = max(done.get(e.tp, -1), e.end_offset + 1)
    for p in report.partitions:
        if p.status == "uploaded" and done.get(p.tp, -1) < (p.end_offset or 0):
            p.status = "failed"
            p.fail(exc)


def _upload_group(
    store: ObjectStore,
    table: WalTable,
    built: list[tuple[list[WalEntry], list[memoryview]]],
    broker_id: int,
    writer: str,
    now_ms: int,
) -> list[WalObject]:
    objects = []
    for entries, parts in built:
        object_id = new_kafka_uuid()
        objects.append(
            WalObject(
                object_id=object_id,
                key=wal_object_key(object_id),
                size=sum(len(p) for p in parts),
                state=SegmentState.COPY_SEGMENT_STARTED,
                broker_id=broker_id,
                writer=writer,
                created_ms=now_ms,
                event_timestamp_ms=now_ms,
                entries=tuple(entries),
            )
        )
    table.record_started(objects, now_ms)
    with ThreadPoolExecutor(PUT_THREADS) as pool:
        list(pool.map(lambda o, parts: store.put(o.key, b"".join(parts)), objects, [p for _e, p in built]))
    return table.change_state([o.object_id for o in objects], SegmentState.COPY_SEGMENT_FINISHED, now_ms)
