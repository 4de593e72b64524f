"""The one job without a shuffle of rows: scan, fold and rewrite of a partition in Python tasks.

When each partition of the one job (`compaction.spark.pipeline`) is one chunk, and its whole log fits what one
scan task takes anyway (`SCAN_TASK_BYTES`, `SCAN_TASK_RECORDS`: the fold holds a row per distinct key, ~40 bytes),
the task that scans a partition's segments has every record of the partition: its fold (`KeyFold`) is the
partition's winners, and the same task can rewrite the chunk from them at once. Nothing crosses into the JVM but
one outcome row per chunk: no rows handed to Spark, no shuffle, no aggregate. The tasks are the rewrite's slots
(`compaction.spark.pipeline.rewrite_slots`: partitions packed by bytes, as many tasks as cores), so the path is
taken when there are at least as many slots as cores (`fits`).

A partition cut into several chunks (a hot partition, whose chunks have slots of their own so that it uses every
core) is folded by parts: the task of each of its chunks' slots scans and folds one part of its segments (`_parts`:
runs of segments of about equal bytes, so that the tasks end together; they need not match the chunks, whose bytes
follow the rewrite's costs), and hands the fold, packed (Arrow IPC, a few binary rows instead of a row per key), to
the slots whose chunks need it; in Spark local mode as a file in the run's cache directory that a row names
(`folds_dir`), not through the JVM. Those merge the folds they receive into the partition's winners and rewrite their
chunk: a job of two stages, every segment fetched and decoded once. Under the `offset` strategy a chunk needs only
the parts that reach its first offset (a record is beaten by a later one only), and a chunk that needs one part
alone receives that part's winning offsets, not its fold; under the others, every part's fold. The merge holds a
row per key of the partition, so a partition above `FOLD_RECORDS` offsets, or one of whose parts is larger than a
scan task, keeps the shuffle.

With fewer slots than cores (one partition of one chunk; small partitions packed into fewer tasks), the largest
partitions of one unit whose segments the run caches are folded by parts the same way (`spread`): each part after
the first by a task of its own, added after the slots' tasks, which sends its fold to the unit's slot; that slot
merges every part's fold and rewrites the unit in the second stage. Without it such a run shuffled its rows and
aggregated them in Spark in its one slot's task, on one core.

A partition that is one unit and at most `HELD_BYTES` (any size, on a local store: its segments are mapped) is
rewritten from the very bytes its scan fetched: neither fetched again nor copied through the run's disk cache.

The results are those of the shuffle path: the fold is the scan's own (`compaction.strategies.winner.fold_segment`),
the rewrite the rewrite job's (`compaction.spark.rewrite_job.run_unit`), and what the scan learns (reports, filters
built, transactional batches) reaches the driver through the same accumulator. A segment that fails its scan fails
its partition (the tracker carries the error): no chunk that needs its part's fold is rewritten, and nothing of the
partition is committed (a chunk that did not need it may have been rewritten: its objects are never referenced).
"""

from __future__ import annotations

import pickle
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa
from pyspark import Accumulator, Broadcast
from pyspark.sql import SparkSession

from compaction.config import CompactionStrategy
from compaction.metadata.model import TopicPartition
from compaction.rewrite.facts import RecordBits
from compaction.rewrite.group import Held
from compaction.rewrite.upload import shared_scratch
from compaction.spark import scan as scan_job
from compaction.spark.rewrite_job import RewriteUnit, UnitOutcome, outcome_batch, outcomes_of, run_unit
from compaction.spark.scan import CHUNK_SLOT, ScanSettings, ScanTask, SegmentDescriptor, describe, positions
from compaction.spark.winners import slot_keys
from compaction.storage.base import ObjectStore, shared_pool
from compaction.strategies.packed_fold import (
    merged_folds,
    pack_fold,
    pack_offsets,
    read_packed,
    write_fold,
    write_offsets,
)
from compaction.tasks import SegmentScanTask

if TYPE_CHECKING:
    from compaction.strategies.keyfold import KeyFold

FOLD_RECORDS = 16_000_000
"""The most offsets a partition cut into chunks may span for its chunks' tasks to merge its folds (a row per
distinct key, ~40 bytes and the key's own, in each task that merges them)."""

HELD_BYTES = 64 << 20
"""The most `.log` bytes of a partition that is one unit for its task to hold from its scan to its rewrite, on a
store whose objects are fetched (S3): the rewrite then reads them from memory, where a larger partition's
segments go through the run's disk cache (`compaction.rewrite.cache`). For a small partition's segment, the cache
file's create, copy, read, move and delete cost more than its scan. On a local store the segments are mapped
(`ObjectStore.view`: page cache, not the task's memory), so such a partition is held whatever its size: its
segments are neither copied into the cache nor read from it (P2K's 483 MB partitions spent ~10% of their tasks'
time copying, BENCHMARKS.md P10)."""

UNITS_IN_FLIGHT = 32
"""The most partitions rewritten at once from the bytes they scanned (`FusedUnit.hold`, at most `HELD_BYTES` each)
that a task works on at once when the store's requests wait on the network (S3): such a partition is a few round
trips one after another (its segments' GETs, the GET of the parts its output carries, the PUT of its two objects),
and a task of hundreds of small partitions otherwise waits on each in turn. As many as the S3 client's connections
(`s3_client.S3_PUT_THREADS`, not imported: it imports boto3, which a task on a local store never needs; a test keeps
the two equal), and as far as `HELD_IN_FLIGHT_BYTES` holds them (`units_in_flight`). One at a time on a
local store, whose requests do not wait."""

HELD_IN_FLIGHT_BYTES = 256 << 20
"""The most `.log` bytes the partitions a task works on at once may hold together, counted at its largest: four of
`HELD_BYTES`, 32 of a few MB. At four at a time whatever their size, a compaction of 1,000 small partitions on S3
waited out ~250 ms of round trips per partition 8 at a time over two cores (BENCHMARKS.md, P11 on S3)."""


def units_in_flight(sizes: Sequence[int], most: int = UNITS_IN_FLIGHT, budget: int = HELD_IN_FLIGHT_BYTES) -> int:
    """How many of a task's held partitions, of `sizes` `.log` bytes each, it works on at once: at most `most`, and
    as many of its largest as `budget` holds (at least one). Pure."""
    return max(1, min(most, len(sizes), budget // max(1, max(sizes, default=1))))

_EXCHANGED = pa.schema([pa.field(CHUNK_SLOT, pa.int64(), False), pa.field("tp", pa.int32()),
                        pa.field("chunk", pa.int32()), pa.field("fold", pa.binary()), pa.field("at", pa.string()),
                        pa.field("outcome", pa.binary())])


@dataclass(frozen=True)
class FusedUnit:
    """One chunk and what its slot's task folds first: every segment of the partition (in offset order) when the
    chunk is its partition's only one, rewritten at once; else one part of the partition's segments (`_parts`;
    none when the partition has fewer segments than chunks), whose fold goes to the slot keys `send_to`, and only
    its winning offsets to the slot keys `offsets_to` (slots whose units of the partition need no other part: the
    part's fold is then their winners). The part's number among the run's is `chunk` (-1: no part). `hold`: the
    task keeps the bytes its scan fetched for the rewrite (`HELD_BYTES`; its segments are then not cached)."""

    unit: RewriteUnit
    segments: tuple[SegmentDescriptor, ...]
    send_to: tuple[int, ...] | None = None
    offsets_to: tuple[int, ...] = ()
    chunk: int = 0
    hold: bool = False
    held: int = 0
    """The `.log` bytes the task holds for it when `hold` (its segments'), else 0."""


@dataclass(frozen=True)
class MergedUnit:
    """A chunk of a partition cut into several, rewritten in the second stage from the folds of `chunks` (the
    numbers of the parts whose folds it waits for)."""

    unit: RewriteUnit
    chunks: frozenset[int]


def fits(slots: Sequence[Sequence[RewriteUnit]], scans: Sequence[SegmentScanTask], parallelism: int) -> bool:
    """Whether the one job's `slots` can fold and rewrite their partitions without a shuffle of rows: the slots,
    with the fold parts of the partitions `spread` cuts, keep every core busy; a partition that is one unit (and
    not cut) is no larger than a scan task's bytes or records; a partition of several units, or cut, spans at
    most `FOLD_RECORDS` offsets, each of its fold parts (`_parts`) is no more than a scan task's bytes, and every
    segment scanned is an input of one of its units. Pure."""
    cut = spread(slots, scans, parallelism)
    if len(slots) + sum(n - 1 for n in cut.values()) < parallelism:
        return False
    by_tp = _by_partition(scans)
    units_of: dict[int, list[RewriteUnit]] = {}
    for u in (u for units in slots for u in units):
        units_of.setdefault(u.partition_index, []).append(u)
    for index, units in units_of.items():
        part = by_tp.get(TopicPartition(units[0].task.topic, units[0].task.partition), [])
        offsets = sum(s.offsets for s in part)
        if len(units) == 1 and index not in cut:
            if sum(s.size for s in part) > scan_job.SCAN_TASK_BYTES or offsets > scan_job.SCAN_TASK_RECORDS:
                return False
        elif not _all_inputs(units, part) or offsets > FOLD_RECORDS or any(
                sum(s.size for s in p) > scan_job.SCAN_TASK_BYTES for p in _parts(part, cut.get(index, len(units)))):
            return False
    return True


def spread(slots: Sequence[Sequence[RewriteUnit]], scans: Sequence[SegmentScanTask], parallelism: int
           ) -> dict[int, int]:
    """When the rewrite has fewer slots than cores (one partition of one chunk, say), the partitions of one unit
    whose segments the fused job's first stage folds in several tasks anyway: partition index -> parts (at least
    two, each at least one segment), the largest partitions first, until every core has a task. The unit's slot
    merges the parts' folds and rewrites it in the second stage, as for a partition of several units; without it
    a one-partition topic of 12.5 M offsets aggregated its rows in Spark on one core while the other idled
    (BENCHMARKS.md, P10 overflow). Only a partition whose segments go into the run's cache is cut (its rewrite,
    in another task than some of its scans, then fetches none of them again). Empty when every core has a slot.
    Pure."""
    short = parallelism - len(slots)
    if short <= 0:
        return {}
    units = Counter(u.partition_index for units in slots for u in units)
    tp_of = {u.partition_index: TopicPartition(u.task.topic, u.task.partition) for units in slots for u in units}
    by_tp = _by_partition(scans)
    sizes = sorted(((sum(s.size for s in by_tp.get(tp_of[i], [])), i) for i, n in units.items() if n == 1),
                   reverse=True)
    cut: dict[int, int] = {}
    for _size, index in sizes:
        part = by_tp.get(tp_of[index], [])
        extra = min(short, len(part) - 1)
        if extra > 0 and all(s.cache for s in part):
            cut[index] = 1 + extra
            short -= extra
        if short <= 0:
            break
    return cut


def _by_partition(scans: Sequence[SegmentScanTask]) -> dict[TopicPartition, list[SegmentScanTask]]:
    """`scans` by partition, each in offset order. Pure."""
    by_tp: dict[TopicPartition, list[SegmentScanTask]] = {}
    for s in sorted(scans, key=lambda s: s.start_offset):
        by_tp.setdefault(s.tp, []).append(s)
    return by_tp


def _all_inputs(units: Sequence[RewriteUnit], scans: Sequence[SegmentScanTask]) -> bool:
    """Whether each of one partition's `scans` is an input of one of its `units`. Pure."""
    inputs = {i.segment_id for u in units for g in u.groups for i in g.inputs}
    return all(s.segment_id in inputs for s in scans)


def _parts(scans: Sequence[SegmentScanTask], n: int) -> list[list[SegmentScanTask]]:
    """A partition's `scans` cut into at most `n` runs of consecutive segments (offset order) of about equal
    bytes, none empty: what each of its chunks' tasks folds in the first stage. They need not match the chunks
    (whose bytes follow the rewrite's costs), so the first stage's tasks end together. Pure."""
    ordered = sorted(scans, key=lambda s: s.start_offset)
    n = min(n, len(ordered))
    total = sum(s.size for s in ordered)
    parts: list[list[SegmentScanTask]] = [[] for _ in range(n)]
    done = 0
    for i, s in enumerate(ordered):
        j = min(n - 1, done * n // max(1, total))
        j = max(j, n - (len(ordered) - i))  # leave a segment for each part after this one
        j = min(j, next((k for k, p in enumerate(parts) if not p), n - 1))  # fill the parts in order
        parts[j].append(s)
        done += s.size
    return parts


def _needs(unit: RewriteUnit, part_end: int | None, strategy: CompactionStrategy) -> bool:
    """Whether `unit`'s winners depend on the records of a fold part of its partition that ends before offset
    `part_end` (None: the partition's last part): under `offset` only a part reaching the unit's first offset or
    later can hold a record that beats one of the unit's. Pure."""
    if strategy is not CompactionStrategy.OFFSET or part_end is None:
        return True
    return part_end > unit.groups[0].start_offset


class _FusedTask:
    """The `mapInArrow` function of the fused job's first (or only) stage: task i folds the units of slot i, one
    after the other. A unit that is its partition's only one is rewritten at once; the fold of a unit of a
    partition cut into several goes to the slots that merge it. Without such units (`keys` None) the task hands
    back its pickled `UnitOutcome`s; with them, rows of `_EXCHANGED`, each to the slot key it names: the packed
    pieces of each fold (`pack_fold`), and the outcomes, which the second stage passes on."""

    def __init__(self, settings: ScanSettings, tracker: Accumulator, slots: Broadcast[list[list[FusedUnit]]],
                 keys: Sequence[int] | None, folds_dir: str | None = None) -> None:
        self.settings = settings
        self.tracker = tracker
        self.slots = slots
        self.keys = keys
        self.folds_dir = folds_dir
        self.in_flight = 1 if settings.spec.scheme == "file" else UNITS_IN_FLIGHT  # decided by the driver

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from compaction.strategies.keyfold import KeyFold

        scan = ScanTask(self.settings, self.tracker, [])
        slots: list[list[FusedUnit]] = self.slots.value
        store = self.settings.spec.open()
        outcomes: list[tuple[int, UnitOutcome]] = []
        with store.deferred_sync(), shared_scratch():  # objects durable together before any outcome; one scratch dir
            for slot in (i for ids in batches for i in ids.column(0).to_pylist()):
                units = slots[slot]
                alone = [f for f in units if f.hold and f.send_to is None]
                at_once = units_in_flight([f.held for f in alone], self.in_flight)
                if at_once > 1:
                    outcomes += [(slot, o) for o in self._at_once(store, slot, alone, at_once) if o is not None]
                    units = [f for f in units if not (f.hold and f.send_to is None)]
                for fused in units:
                    held: dict[str, Held] | None = {} if fused.hold else None
                    fold = self._fold(scan, store, fused.segments, KeyFold(), held)
                    if fold is None:  # its partition failed (the tracker says why): no rewrite, no fold sent
                        continue
                    if fused.send_to is None:
                        outcomes.append((slot, run_unit(store, fused.unit, slot, fold.offsets(), held)))
                        continue
                    winners = fold.offsets() if fused.offsets_to else None
                    rows = fold.result() if fused.send_to else None
                    del fold  # its table freed: what is sent is a copy of its rows, packed a piece at a time
                    strategy = self.settings.partitions[fused.unit.partition_index].strategy
                    ranked = strategy is not CompactionStrategy.OFFSET
                    if self.folds_dir is not None:  # written once, however many slots read it; a row names it
                        if rows is not None:
                            write_fold(path := _fold_file(self.folds_dir, "fold", fused.chunk), rows, ranked)
                            yield from _fold_rows(fused, fused.send_to, at=path)
                        if winners is not None:
                            write_offsets(path := _fold_file(self.folds_dir, "offsets", fused.chunk), winners)
                            yield from _fold_rows(fused, fused.offsets_to, at=path)
                        continue
                    for piece in pack_fold(rows, ranked) if rows is not None else ():
                        yield from _fold_rows(fused, fused.send_to, piece)
                    if winners is not None:
                        yield from _fold_rows(fused, fused.offsets_to, pack_offsets(winners))
        if self.keys is None:
            yield outcome_batch([o for _slot, o in outcomes])
        elif outcomes:
            n = len(outcomes)
            yield pa.RecordBatch.from_pydict({
                CHUNK_SLOT: [self.keys[slot] for slot, _o in outcomes], "tp": [None] * n, "chunk": [None] * n,
                "fold": [None] * n, "at": [None] * n, "outcome": [pickle.dumps(o) for _slot, o in outcomes]},
                schema=_EXCHANGED)

    def _at_once(self, store: ObjectStore, slot: int, units: Sequence[FusedUnit], at_once: int
                 ) -> list[UnitOutcome | None]:
        """Scan, fold and rewrite each of `units` (partitions rewritten at once from the bytes they scanned),
        `at_once` at a time; their outcomes in order (None: its partition failed its scan). Each unit's
        requests go through a fork of `store`, so that its reports count its own."""
        from compaction.strategies.keyfold import KeyFold

        scan = ScanTask(self.settings, cast("Accumulator", _Locked(self.tracker)), [])  # it only adds

        turns = threading.BoundedSemaphore(at_once)  # the process pool has `in_flight` threads; this task, at_once

        def one(fused: FusedUnit) -> UnitOutcome | None:
            with turns:
                own = store.fork()
                held: dict[str, Held] = {}
                fold = self._fold(scan, own, fused.segments, KeyFold(), held)
                return None if fold is None else run_unit(own, fused.unit, slot, fold.offsets(), held)

        running = [shared_pool(f"units-{self.in_flight}", self.in_flight).submit(one, fused) for fused in units]
        try:
            return [f.result() for f in running]
        finally:  # after a bug's exception (it fails the task), the units not started are not
            for f in running:
                f.cancel()

    def _fold(self, scan: ScanTask, store: ObjectStore, segments: Sequence[SegmentDescriptor], fold: KeyFold,
              held: dict[str, Held] | None = None) -> KeyFold | None:
        """`fold` with the keys of `segments` folded in, or None when one failed its scan (reported); each segment's
        bytes into `held` (by segment id), when given, with what its scan decoded of its records (the rewrite's
        counts: `facts.RecordBits`)."""
        from compaction.strategies.winner import fold_segment

        first = 0
        for i, d in enumerate(segments):
            if i == 1:
                first = fold.keys
            elif i == 2:  # once: each reserve beyond the table copies it, as a growth does
                fold.reserve(expected_keys(first, fold.keys, len(segments) - 2))
            scanned = scan.fetch(store, d)
            if scanned is None:
                return None
            if i == 0:  # at most a key per record
                fold.reserve(min(scanned.segment.records.num_rows, FIRST_RESERVE))
            if held is not None:
                held[d.segment_id] = Held(scanned.data, RecordBits.of_scan(scanned.segment.records,
                                                                           scanned.segment.batch_fields))
            partition = self.settings.partitions[d.partition_index]
            scan.done(d, scanned, fold_segment(fold, scanned.segment.records, partition.aborted, partition.strategy,
                                               d.dirty))
        return fold


FIRST_RESERVE = 1 << 20
"""The most keys the fused fold reserves its table for before its first segment (as many as the segment has
records, up to this: ~64 MB of table): a fold that started at `KeyFold`'s few thousand keys doubled its table ~8
times over its first two segments, each growth a new table filled again (a P2K partition folded in one warm
process: its table's growths 0.17-0.20 s of a 1.0-1.1 s fold, 0.10-0.14 s with the reserve)."""

RESERVE_MARGIN = 1.15
"""How far above `expected_keys`' estimate the fused fold reserves its table: an estimate a little short would
have the table grow (four times, past a million keys) for the last few keys."""


def expected_keys(first: int, second: int, left: int) -> int:
    """The distinct keys a fold will hold after `left` more segments like the two it folded (`first` keys after
    one, `second` after two), times `RESERVE_MARGIN`. New keys are taken to fall from segment to segment by the
    ratio the second brought against the first, as keys drawn again from a fixed set do (1 M keys over 8 segments of
    P2K's shape: ~0.8 a segment); where that ratio is 1 or more (every key new), they keep coming at the second's
    count. Pure."""
    new = second - first
    if first <= 0 or new <= 0 or left <= 0:
        return second
    q = new / first
    more = new * left if q >= 1 else new * q * (1 - q ** left) / (1 - q)
    return int((second + more) * RESERVE_MARGIN)


class _Locked:
    """An accumulator that threads of one task add to: `Accumulator.add` is a read and a write of its value."""

    def __init__(self, accumulator: Accumulator) -> None:
        self._accumulator, self._lock = accumulator, threading.Lock()

    def add(self, term: object) -> None:
        with self._lock:
            self._accumulator.add(term)


def _fold_rows(fused: FusedUnit, keys: Sequence[int], piece: pa.Buffer | None = None, at: Path | None = None
               ) -> Iterator[pa.RecordBatch]:
    """A row per slot key of `keys` sending it `piece` (of the fold of `fused`'s part), built on the piece's own
    buffer (a binary column built from Python bytes copied a 90 MB fold at ~0.3 s), or naming the file `at` that
    holds the whole fold (`write_fold`, `write_offsets`)."""
    fold = pa.nulls(1, pa.binary()) if piece is None else pa.Array.from_buffers(
        pa.binary(), 1, [None, pa.py_buffer(np.array([0, piece.size], np.int32)), piece])
    path = pa.array([None if at is None else str(at)], pa.string())
    for key in keys:
        yield pa.RecordBatch.from_arrays(
            [pa.array([key], pa.int64()), pa.array([fused.unit.partition_index], pa.int32()),
             pa.array([fused.chunk], pa.int32()), fold, path, pa.nulls(1, pa.binary())], schema=_EXCHANGED)


def _fold_file(folds_dir: str, kind: str, chunk: int) -> Path:
    """The file of part `chunk`'s fold (`kind` "fold") or winning offsets ("offsets") in `folds_dir`: a task of
    the first stage run again writes the same file again."""
    return Path(folds_dir) / f"{kind}-{chunk}.arrow"


def _read_fold(at: str, chunk: int) -> pa.Buffer:
    """The fold (or offsets) of part `chunk` a first-stage task wrote to the file `at`, mapped."""
    try:
        return read_packed(Path(at))
    except FileNotFoundError:  # the run's cache directory went away under the job: nothing of it is committed
        raise RuntimeError(f"the fold of part {chunk} that the fused job's first stage wrote to {at} is gone; the "
                           "run's cache directory must stay until the job ends") from None


class _MergeTask:
    """The `mapInArrow` function of the fused job's second stage: for each slot key its rows name, the units of
    that slot (`plan`: key -> (slot, `MergedUnit`s)), each partition's received folds merged into its winners and
    its units rewritten from them; the first stage's outcomes passed on. A partition missing a fold it needs
    failed in the first stage (the tracker says why) and is not rewritten."""

    def __init__(self, settings: ScanSettings, plan: Broadcast[dict[int, tuple[int, list[MergedUnit]]]]) -> None:
        self.settings = settings
        self.plan = plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        folds: dict[tuple[int, int], dict[int, list[pa.Buffer]]] = {}  # (slot key, tp) -> chunk -> pieces
        outcomes: list[UnitOutcome] = []
        for batch in batches:
            key, tp, chunk, fold, at, outcome = (batch.column(c) for c in _EXCHANGED.names)
            for i in range(batch.num_rows):
                if outcome[i].is_valid:
                    outcomes.append(pickle.loads(outcome[i].as_py()))
                else:
                    part = chunk[i].as_py()
                    piece = fold[i].as_buffer() if fold[i].is_valid else _read_fold(at[i].as_py(), part)
                    folds.setdefault((key[i].as_py(), tp[i].as_py()), {}).setdefault(part, []).append(piece)
        plan = self.plan.value
        store = self.settings.spec.open()
        with store.deferred_sync(), shared_scratch():  # objects durable together before any outcome; one scratch dir
            for key in sorted({k for k, _tp in folds}):
                slot, units = plan[key]
                by_tp: dict[int, list[MergedUnit]] = {}
                for m in units:
                    by_tp.setdefault(m.unit.partition_index, []).append(m)
                for index, merged in by_tp.items():
                    received = folds.get((key, index), {})
                    needed = frozenset().union(*(m.chunks for m in merged))
                    if not needed <= received.keys():
                        continue
                    offsets = merged_folds([p for c in sorted(needed) for p in received[c]])
                    outcomes.extend(run_unit(store, m.unit, slot, offsets) for m in merged)
        yield outcome_batch(outcomes)


def exchange_plan(slots: Sequence[Sequence[RewriteUnit]], scans: Sequence[SegmentScanTask],
                  index_of: Mapping[TopicPartition, int], strategy_of: Mapping[int, CompactionStrategy],
                  keys: Sequence[int], mapped: bool = False, cut: Mapping[int, int] | None = None
                  ) -> tuple[list[list[FusedUnit]], dict[int, list[MergedUnit]]]:
    """What each slot's task does in the fused job's first stage (its units, in order), and the units each slot
    rewrites in the second (empty when no partition is cut into several units or parts: one stage). The first
    stage has a task more for each part past the first of the partitions `cut` names (`spread`'s: partition index
    -> parts), after the slots' own: it folds that part and sends the fold to the unit's slot. `strategy_of` gives a
    partition index's strategy, `keys` each task's key (`slot_keys`). `mapped`: the store maps its objects (a
    local store, `ObjectStore.view`), so a partition that is one unit is held whatever its size. `fits` must hold.
    Pure."""
    by_tp = _by_partition(scans)
    seg_of = positions(scans)  # once: a run of 10,000 partitions describes 10,000 parts
    tp_of = {index: tp for tp, index in index_of.items()}
    placed: dict[int, list[tuple[int, RewriteUnit]]] = {}  # partition index -> (slot, unit)
    for slot, units in enumerate(slots):
        for u in units:
            placed.setdefault(u.partition_index, []).append((slot, u))
    planned: dict[int, FusedUnit] = {}  # id(unit) -> how its first stage runs it
    merges: dict[int, list[MergedUnit]] = {}  # slot -> its units merged in the second stage
    cut = cut or {}
    extra: list[list[FusedUnit]] = []  # the first stage's tasks after the slots': a part of a cut partition each
    chunk = 0
    for index, at in placed.items():
        part = by_tp.get(tp_of[index], [])
        if len(at) == 1 and index in cut:  # its parts folded by its slot's task and tasks of their own
            slot, unit = at[0]
            if not _all_inputs([unit], part):
                raise ValueError("the fused job planned where fits() does not hold")
            parts = _parts(part, cut[index])
            numbers = range(chunk, chunk + len(parts))
            chunk += len(parts)
            merges.setdefault(slot, []).append(MergedUnit(unit, frozenset(numbers)))
            folded = [FusedUnit(unit, tuple(describe(seg_of, [p], index_of)[0]), (keys[slot],), (), n)
                      for p, n in zip(parts, numbers, strict=True)]
            planned[id(unit)] = folded[0]
            extra += [[f] for f in folded[1:]]
            continue
        if len(at) == 1:
            described = describe(seg_of, [part], index_of)[0]
            size = sum(s.size for s in part)
            hold = mapped or size <= HELD_BYTES
            if hold:  # the rewrite reads the scan's bytes: nothing to cache
                described = [replace(d, cache=False) for d in described]
            planned[id(at[0][1])] = FusedUnit(at[0][1], tuple(described), hold=hold, held=size if hold else 0)
            continue
        at.sort(key=lambda su: su[1].groups[0].start_offset)
        if not _all_inputs([u for _s, u in at], part):
            raise ValueError("the fused job planned where fits() does not hold")
        parts = _parts(part, len(at))
        numbers = range(chunk, chunk + len(parts))
        chunk += len(parts)
        ends = [p[0].start_offset for p in parts[1:]] + [None]
        needs = {id(u): frozenset(n for n, end in zip(numbers, ends, strict=True) if _needs(u, end, strategy_of[index]))
                 for _s, u in at}
        wanted: dict[int, frozenset[int]] = {}  # slot -> the parts its units of the partition need
        for slot, u in at:
            wanted[slot] = wanted.get(slot, frozenset()) | needs[id(u)]
            merges.setdefault(slot, []).append(MergedUnit(u, needs[id(u)]))
        for j, (_slot, u) in enumerate(at):  # the task of the j-th chunk's slot folds the j-th part
            if j >= len(parts):
                planned[id(u)] = FusedUnit(u, (), (), (), -1)
                continue
            n = numbers[j]
            to = sorted(keys[w] for w, parts_of_slot in wanted.items() if n in parts_of_slot)
            alone = {keys[w] for w, parts_of_slot in wanted.items() if parts_of_slot == {n}}
            planned[id(u)] = FusedUnit(u, tuple(describe(seg_of, [parts[j]], index_of)[0]),
                                       tuple(k for k in to if k not in alone), tuple(k for k in to if k in alone), n)
    return [[planned[id(u)] for u in units] for units in slots] + extra, merges


def folds_dir(spark: SparkSession, settings: ScanSettings) -> str | None:
    """Where the fused job's first stage writes the folds it hands on, each once, for the second stage's tasks to
    map: a directory of the run's cache (`ScanSettings.cache_dir`, removed when the job ends), when every task runs
    on this machine (Spark local mode). Elsewhere (None) a fold travels as rows through Spark's shuffle: a task of
    the second stage may run on another node. Through the shuffle, the hot partition of P6 (two chunks) moved its
    folds (116 MB, two parts' keys and offsets) into the JVM and back in ~1.3 s of the first chunk's second-stage
    task, which then merged them; mapped from the files, in ~0 s (BENCHMARKS.md, P6)."""
    if settings.cache_dir is None or not str(spark.sparkContext.master).startswith("local"):
        return None
    return str(Path(settings.cache_dir) / "folds")


def fold_and_rewrite(spark: SparkSession, settings: ScanSettings, scans: Sequence[SegmentScanTask],
                     index_of: Mapping[TopicPartition, int], tracker: Accumulator,
                     slots: Sequence[Sequence[RewriteUnit]], *, parallelism: int) -> list[UnitOutcome]:
    """The one job of a task per slot, and one per extra fold part (see the module docstring and `exchange_plan`):
    one stage when every partition is one unit, two when some partition is cut into several units or parts; one
    outcome per unit whose partition scanned cleanly. The scan reports go to `tracker`. `fits` must hold for
    `parallelism` cores."""
    strategies = {i: p.strategy for i, p in enumerate(settings.partitions)}
    cut = spread(slots, scans, parallelism)
    tasks = len(slots) + sum(n - 1 for n in cut.values())
    keys = slot_keys(tasks)
    first, merges = exchange_plan(slots, scans, index_of, strategies, keys, settings.spec.scheme == "file", cut)
    shipped = spark.sparkContext.broadcast(first)
    plan = spark.sparkContext.broadcast({keys[s]: (s, m) for s, m in merges.items()}) if merges else None
    try:
        ids = spark.range(0, tasks, numPartitions=max(1, tasks))  # task i runs slot i (or extra part i - slots)
        if plan is None:
            rows = ids.mapInArrow(_FusedTask(settings, tracker, shipped, None), "outcome binary").collect()
        else:
            exchanged = ids.mapInArrow(_FusedTask(settings, tracker, shipped, keys, folds_dir(spark, settings)),
                                       f"{CHUNK_SLOT} long, tp int, chunk int, fold binary, at string, outcome binary")
            rows = exchanged.repartition(tasks, CHUNK_SLOT).mapInArrow(
                _MergeTask(settings, plan), "outcome binary").collect()
    finally:
        shipped.unpersist()
        if plan is not None:
            plan.unpersist()
    return outcomes_of(rows)


__all__ = ["FOLD_RECORDS", "HELD_BYTES", "FusedUnit", "MergedUnit", "exchange_plan", "fits", "fold_and_rewrite",
           "folds_dir", "spread"]
