"""The scan job: segments → one row per (scan task, partition, key) with the key's best rank there.

`mapInArrow` over `spark.range(n)`, task i scanning slice i of the segments (`scan_slices`: runs of one
partition's consecutive segments, a task per core; the descriptors travel in the closure, so no Python
task builds an input DataFrame): each executor opens the store from its picklable spec, fetches the object (into
the run's segment cache when the rewrite will need it: `compaction.rewrite.cache`), runs the numba columnar scan
and folds each segment's candidate records into one table per partition (`compaction.strategies.winner.fold_segment`
into a `compaction.strategies.keyfold.KeyFold`): the task hands Spark each key of its segments once, with its best
rank there. Rows are as narrow as the aggregation allows, since Spark pays per row and column:
the partition is an index `tp` into the run's partitions, and when every partition ranks by offset the constant
rank columns are left out; the one job leaves out `dirty`, and `tp` where the rewrite slot names the partition.
A rescan keeps its rows per segment (`seg`). Each step that reads rows names its layout (`RowLayout`).

What the tasks learn besides rows travels back in a typed accumulator (`ScanTracker`: per partition a
`PartitionScan`, merged with `add`): the error that quarantines a partition (the exception itself, class kept),
filters built for clean segments that had none, the transactional and control batches the marker walk needs
(`compaction.rewrite.events`), store requests and task time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.metadata.model import TopicPartition
from compaction.storage.base import ObjectStore, StoreSpec, StoreStats
from compaction.strategies.transactions import TxnEvent
from compaction.strategies.winner import AbortedRange, SegmentBest
from compaction.tasks import PartitionTask, SegmentScanTask, task_groups

if TYPE_CHECKING:
    from compaction.format.scan import SegmentScan

CHUNK_SLOT = "slot"
"""The column naming a row's rewrite slot: the scan writes it (`RowLayout.by_slot`), the rewrite reads it."""

SCAN_TASK_BYTES = 2**30
"""The most segment bytes one scan task takes (a failed task is retried whole)."""

SCAN_TASK_RECORDS = 8_000_000
"""The most records one scan task takes, counted as the offsets its segments span (at least their records): a
task holds a row per distinct key of its segments (~40 bytes) until it hands them to Spark."""



@dataclass(frozen=True)
class SegmentDescriptor:
    """One segment of a scan task: what the executor needs to fetch and scan it."""

    partition_index: int  # the segment's partition among the run's (`ScanSettings.partitions`)
    segment_id: str
    log_key: str
    dirty: bool
    filter_key: str | None
    cache: bool
    seg: int  # index among the scanned segments


_COLUMNS: dict[str, tuple[DataType, pa.DataType]] = {
    "tp": (IntegerType(), pa.int32()),
    "key": (BinaryType(), pa.binary()),
    "has_version": (ByteType(), pa.int8()),
    "version": (LongType(), pa.int64()),
    "offset": (LongType(), pa.int64()),
    "dirty": (BooleanType(), pa.bool_()),
    "seg": (IntegerType(), pa.int32()),
    CHUNK_SLOT: (LongType(), pa.int64()),
}


class RowLayout(Enum):
    """The columns of the scan rows, named by the step that reads them and chosen by the driver where it asks for
    them (`compaction.spark.pipeline`): the scan tasks write them, that step reads them. Spark pays for every
    column of every row it takes from Python, shuffles and aggregates, so rows carry only what their readers need.
    Every layout has `key` and `offset`, and `has_version` and `version` after `key` when the run ranks by more
    than the offset (`ScanSettings.ranked`: with none, a key's best is its greatest offset). Besides them:

    - `tp`, the row's partition index among the run's, unless the rewrite slot names the partition;
    - `dirty`, whether the key is one of the run's dirty keys, unless every key is (the one job);
    - `seg`, the index of the row's segment among the scanned ones, in a rescan;
    - `slot`, the rewrite slot of the row's partition, in the one job by slot: each task then adds a marker row
      per partition it scanned (null key, offset -1), so that every slot has rows, and a rewrite task, even for a
      partition without any keyed record.
    """

    STEP_BY_STEP = ("tp", "key", "offset", "dirty")  # the winners, counted and tested against the filters
    RESCAN = ("tp", "key", "offset", "dirty", "seg")  # the clean segments to rewrite, rows per segment
    ONE_JOB_BY_KEY = ("tp", "key", "offset")  # the one job, some partition with several chunks: winners by key
    ONE_JOB_SHARED_SLOTS = ("tp", "key", "offset", CHUNK_SLOT)  # the one job, a slot runs several partitions
    ONE_JOB_OWN_SLOTS = ("key", "offset", CHUNK_SLOT)  # the one job, each slot runs one partition's units

    @property
    def by_slot(self) -> bool:
        """The rows carry their partition's rewrite slot, and each task a marker row per partition."""
        return self in (RowLayout.ONE_JOB_SHARED_SLOTS, RowLayout.ONE_JOB_OWN_SLOTS)

    def names(self, ranked: bool) -> tuple[str, ...]:
        if not ranked:
            return self.value
        at = self.value.index("key") + 1
        return (*self.value[:at], "has_version", "version", *self.value[at:])

    def schema(self, ranked: bool) -> StructType:
        return StructType([StructField(n, _COLUMNS[n][0], self._nullable(n)) for n in self.names(ranked)])

    def arrow_schema(self, ranked: bool) -> pa.Schema:
        return pa.schema([pa.field(n, _COLUMNS[n][1], self._nullable(n)) for n in self.names(ranked)])

    def _nullable(self, name: str) -> bool:
        return self.by_slot and name == "key"  # the marker rows'


ROWS = RowLayout.STEP_BY_STEP.schema(ranked=True)
"""The scan rows of a run that ranks by more than the offset, before the filter test."""


@dataclass(frozen=True)
class PartitionScanSettings:
    """What every scan task needs to know about one partition of the run."""

    strategy: CompactionStrategy
    header: str | None  # the header the strategy ranks by
    aborted: tuple[AbortedRange, ...]
    fpp: float  # rate of the filters the scan builds
    rewrite_slot: int | None = None  # the one job: the slot its rows carry; None: none of its rows is rewritten

    @classmethod
    def of(cls, task: PartitionTask) -> PartitionScanSettings:
        return cls(task.strategy, task.strategy_header,
                   tuple((t.producer_id, t.first_offset, t.last_offset) for t in task.aborted), task.bloom_fpp)


@dataclass(frozen=True)
class ScanSettings:
    """What every scan task of a run needs to know: the store, its partitions (by partition index) and the rows'
    layout: which step reads them, and whether they carry the rank columns."""

    spec: StoreSpec
    partitions: tuple[PartitionScanSettings, ...]
    layout: RowLayout
    ranked: bool  # some partition ranks by more than the offset
    cache_dir: str | None = None
    rows_per_batch: int = 1 << 20  # rows per Arrow batch handed to Spark (binary keys: < 2 GiB a batch)

    @classmethod
    def of(cls, spec: StoreSpec, tasks: Sequence[PartitionTask], cache_dir: str | None = None,
           rows_per_batch: int = 1 << 20) -> ScanSettings:
        """The settings of a scan of `tasks`' partitions (their order gives the partition indexes), rows laid out
        for the step-by-step path's winners (`RowLayout.STEP_BY_STEP`)."""
        partitions = tuple(PartitionScanSettings.of(t) for t in tasks)
        ranked = any(p.strategy is not CompactionStrategy.OFFSET for p in partitions)
        return cls(spec, partitions, RowLayout.STEP_BY_STEP, ranked, cache_dir, rows_per_batch)

    @property
    def by_offset(self) -> bool:
        """Every partition ranks by offset: a key's best is its greatest offset."""
        return not self.ranked

    def schema(self) -> StructType:
        return self.layout.schema(self.ranked)

    def arrow_schema(self) -> pa.Schema:
        return self.layout.arrow_schema(self.ranked)

    def laid_out(self, layout: RowLayout) -> ScanSettings:
        return replace(self, layout=layout)

    def by_slot(self, slots: Mapping[int, int], layout: RowLayout) -> ScanSettings:
        """The settings of the one job by slot, rows laid out as `layout` (one of the two `RowLayout.by_slot`): per
        partition index the rewrite slot its rows carry (`slots`; a partition without one hands Spark no row)."""
        assert layout.by_slot, layout
        partitions = tuple(replace(p, rewrite_slot=slots.get(i)) for i, p in enumerate(self.partitions))
        return replace(self, partitions=partitions, layout=layout)


@dataclass
class PartitionScan:
    """What the scan tasks of one partition reported; `add` merges two reports."""

    error: KcompactError | None = None
    filters_built: dict[str, str] = field(default_factory=dict)  # segment id -> new .bloom key
    events: dict[str, tuple[TxnEvent, ...]] = field(default_factory=dict)  # segment id -> marker-walk batches
    scanned: dict[str, int] = field(default_factory=dict)  # segment id -> bytes fetched and scanned
    cached: dict[str, int] = field(default_factory=dict)  # segment id -> bytes left in the run's cache
    invalid_versions: int = 0
    scan_task_ms: int = 0
    ended: float = 0.0  # wall clock (epoch s) when its last scan of a segment ended
    requests: StoreStats = field(default_factory=StoreStats)

    def add(self, other: PartitionScan) -> PartitionScan:
        self.error = self.error or other.error
        self.filters_built.update(other.filters_built)
        self.events.update(other.events)
        self.scanned.update(other.scanned)
        self.cached.update(other.cached)
        self.invalid_versions += other.invalid_versions
        self.scan_task_ms += other.scan_task_ms
        self.ended = max(self.ended, other.ended)
        self.requests = self.requests + other.requests
        return self


class ScanTracker(AccumulatorParam):
    """Merges `PartitionScan` reports by partition index across tasks."""

    def zero(self, value: dict[int, PartitionScan]) -> dict[int, PartitionScan]:
        return {}

    def addInPlace(self, a: dict[int, PartitionScan], b: dict[int, PartitionScan]) -> dict[int, PartitionScan]:
        for index, report in b.items():
            a[index] = a[index].add(report) if index in a else report
        return a


class ScanTask:
    """The `mapInArrow` function of a scan: task i fetches and scans the segments of slice i (`SegmentDescriptor`s)
    and hands Spark its rows (`ScanSettings.layout`); each segment's report goes to the `tracker`. The fused one
    job (`compaction.spark.fused`) calls its `fetch` and `done` for segments it folds itself."""

    def __init__(self, settings: ScanSettings, tracker: Accumulator, slices: Sequence[Sequence[SegmentDescriptor]]
                 ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.slices = slices

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from compaction.strategies.keyfold import KeyFold
        from compaction.strategies.winner import fold_segment, folded, segment_best

        store = self.settings.spec.open()
        layout = self.settings.layout
        folds: dict[int, KeyFold] = {}  # partition index -> the fold of its segments in this task
        seen: dict[int, None] = {}
        for ids in batches:
            for d in (d for i in ids.column(0).to_pylist() for d in self.slices[i]):
                seen[d.partition_index] = None
                scanned = self.fetch(store, d)
                if scanned is None:
                    continue
                partition = self.settings.partitions[d.partition_index]
                if layout is RowLayout.RESCAN:  # rows stay per segment
                    best = segment_best(scanned.segment.records, partition.aborted, partition.strategy)
                    self.done(d, scanned, best.invalid_versions)
                    yield from self._rows(d.partition_index, best, np.full(len(best.keys), d.dirty), d.seg)
                    continue
                fold = folds.setdefault(d.partition_index, KeyFold())
                self.done(d, scanned, fold_segment(fold, scanned.segment.records, partition.aborted,
                                                    partition.strategy, d.dirty))
        for index, fold in folds.items():  # one row per key of the task's segments of the partition
            if self._rewritten(index):
                merged, dirty = folded(fold, 0)
                yield from self._rows(index, merged, dirty, None)
        if layout.by_slot:
            for index in seen:
                if self._rewritten(index):
                    yield from self._rows(index, _MARKER, np.zeros(1, bool), None)

    def _rewritten(self, index: int) -> bool:
        """Whether the rows of partition `index` are wanted: in the one job, only those of a rewrite slot."""
        return not self.settings.layout.by_slot or self.settings.partitions[index].rewrite_slot is not None

    def fetch(self, store: ObjectStore, d: SegmentDescriptor) -> ScannedSegment | None:
        """Fetch and check one segment, build its filter when asked; None: it failed its partition (reported)."""
        from compaction.format.scan import scan_segment
        from compaction.rewrite.cache import SegmentCache

        cache = SegmentCache(self.settings.cache_dir) if d.cache and self.settings.cache_dir else None
        partition = self.settings.partitions[d.partition_index]
        before, started = replace(store.stats), time.monotonic()
        report = PartitionScan()
        try:
            data = cache.fetch(store, d.log_key, d.segment_id) if cache is not None else store.view(d.log_key)
            report.scanned[d.segment_id] = len(data)
            if cache is not None:
                report.cached[d.segment_id] = len(data)
            segment = scan_segment(data, obj=store.object_uri(d.log_key), header_key=partition.header)
        except KcompactError as exc:  # corrupt input, or a store failure retries did not cure:
            report.error = exc  # fail this partition (its exit code says whether a rerun helps)
            report.requests = store.stats - before
            self.tracker.add({d.partition_index: report})
            return None
        self._learn(store, d, segment, report)
        report.requests = store.stats - before
        return ScannedSegment(segment, report, started, data)

    def _learn(self, store: ObjectStore, d: SegmentDescriptor, segment: SegmentScan, report: PartitionScan) -> None:
        """What the scan learns of a segment besides its keys: its filter, when it has none, and its transactional
        and control batches (the marker walk's input)."""
        from compaction.bloom.segment import segment_filter
        from compaction.errors import ObjectExistsError
        from compaction.rewrite.events import txn_events

        if d.filter_key is not None:
            fpp = self.settings.partitions[d.partition_index].fpp
            with contextlib.suppress(ObjectExistsError):  # an earlier attempt wrote it, from the same bytes
                store.put(d.filter_key, segment_filter(segment, fpp).to_bytes())
            report.filters_built[d.segment_id] = d.filter_key
        events = txn_events(segment)
        if events:
            report.events[d.segment_id] = tuple(events)

    def done(self, d: SegmentDescriptor, scanned: ScannedSegment, invalid_versions: int) -> None:
        """The segment's report, once its records are folded (their time is the scan's too)."""
        report = scanned.report
        report.invalid_versions = invalid_versions
        report.scan_task_ms = round(1000 * (time.monotonic() - scanned.started))
        report.ended = time.time()
        self.tracker.add({d.partition_index: report})

    def _rows(self, index: int, best: SegmentBest, dirty: np.ndarray, seg: int | None
              ) -> Iterator[pa.RecordBatch]:
        """`best`'s keys of partition `index` as Arrow batches in the layout's columns."""
        schema, step = self.settings.arrow_schema(), self.settings.rows_per_batch
        constants = {"tp": pa.scalar(index, pa.int32()), "seg": pa.scalar(seg, pa.int32()),
                     CHUNK_SLOT: pa.scalar(self.settings.partitions[index].rewrite_slot, pa.int64())}
        for at in range(0, max(1, len(best.keys)), step):
            n = min(step, len(best.keys) - at)
            yield pa.RecordBatch.from_arrays([_column(name, best, dirty, constants, at, n) for name in schema.names],
                                             schema=schema)


def _column(name: str, best: SegmentBest, dirty: np.ndarray, constants: Mapping[str, pa.Scalar], at: int, n: int
            ) -> pa.Array:
    """Rows `at` to `at + n` of the scan rows' column `name`: `best`'s, the dirty flags', or one of the
    `constants` of the batch's partition (`tp`, `seg`, `slot`) repeated."""
    match name:
        case "key":
            keys = best.keys.slice(at, n)
            return keys.cast(pa.binary()) if keys.type != pa.binary() else keys
        case "has_version" | "version" | "offset":
            return getattr(best, name).slice(at, n)
        case "dirty":
            return pa.array(dirty[at:at + n], pa.bool_())
        case _:
            return pa.repeat(constants[name], n)


@dataclass(frozen=True)
class ScannedSegment:
    """A segment a scan task fetched and decoded, with its report so far, when its scan started, and its bytes (a
    fused task's rewrite of the partition reads them again: `compaction.spark.fused`)."""

    segment: SegmentScan
    report: PartitionScan
    started: float
    data: bytes | memoryview


_MARKER = SegmentBest(pa.nulls(1, pa.binary()), pa.array([0], pa.int8()), pa.array([0], pa.int64()),
                      pa.array([-1], pa.int64()), 0)
"""The marker row's columns: no key, offset -1 (never a winner: `compaction.spark.rewrite_job` skips it)."""


def scan_rows(spark: SparkSession, settings: ScanSettings, segments: Sequence[SegmentScanTask],
              index_of: Mapping[TopicPartition, int], tracker: Accumulator) -> DataFrame:
    """Per scan task and partition one row per distinct key with its best rank over the task's segments of that
    partition, in the columns of `settings.layout` (per segment in a rescan, `seg` indexing `segments`; with a
    marker row per task and partition in the one job); `index_of` gives each partition's index among the run's.
    Lazy: the scan runs when the rows are first used."""
    slices = scan_slices(segments, spark.sparkContext.defaultParallelism)
    described = describe(segments, slices, index_of)
    ids = spark.range(0, len(described), numPartitions=max(1, len(described)))  # task i scans slice i
    return ids.mapInArrow(ScanTask(settings, tracker, described), settings.schema())


def describe(segments: Sequence[SegmentScanTask] | Mapping[str, int], parts: Sequence[Sequence[SegmentScanTask]],
             index_of: Mapping[TopicPartition, int]) -> list[list[SegmentDescriptor]]:
    """`parts` (lists of some of `segments`) as the descriptors a task scans: `index_of` gives each partition's
    index among the run's, a segment's position in `segments` its `seg`. `segments` may be given as those positions
    already (`positions`), for a caller describing parts one at a time. Pure."""
    index = segments if isinstance(segments, Mapping) else positions(segments)
    return [[SegmentDescriptor(index_of[s.tp], s.segment_id, s.log_key, s.dirty, s.filter_key, s.cache,
                               index[s.segment_id]) for s in part] for part in parts]


def positions(segments: Sequence[SegmentScanTask]) -> dict[str, int]:
    """Each segment's position in `segments`, by id (`describe`)."""
    return {s.segment_id: i for i, s in enumerate(segments)}


def scan_slices(segments: Sequence[SegmentScanTask], parallelism: int) -> list[list[SegmentScanTask]]:
    """The segments cut into scan tasks: one per core (`parallelism`), more when the bytes or the records call
    for it (`SCAN_TASK_BYTES`, `SCAN_TASK_RECORDS`), never more than the segments. Pure.

    A task takes runs of one partition's consecutive segments (a partition's whole log when it is no larger
    than a task's share of the bytes) and reduces them to one row per key (a `KeyFold`). Spark pays per row
    it takes from Python, shuffles and aggregates, and a partition cut into T runs hands it up to T rows per
    key: so tasks are as few and as large as the cores allow. Runs go largest first into the lightest task,
    which scans its segments in offset order per partition (two runs of a partition may land in one task).
    """
    total = sum(s.size for s in segments)
    records = sum(s.offsets for s in segments)
    n = min(len(segments), max(parallelism, -(-total // SCAN_TASK_BYTES), -(-records // SCAN_TASK_RECORDS)))
    if n == 0:
        return []
    share = max(1, -(-total // n))
    runs: list[list[SegmentScanTask]] = []
    by_tp: dict[TopicPartition, list[SegmentScanTask]] = {}
    for s in segments:
        by_tp.setdefault(s.tp, []).append(s)
    for part in by_tp.values():
        part = sorted(part, key=lambda s: s.start_offset)
        size = sum(s.size for s in part)
        k = max(1, min(len(part), round(size / share)))  # this partition's runs, of about a share each
        cut: list[list[SegmentScanTask]] = [[] for _ in range(k)]
        before = 0
        for s in part:  # a segment goes to the run its middle byte falls in
            cut[min(k - 1, (2 * before + s.size) * k // (2 * size)) if size else 0].append(s)
            before += s.size
        runs.extend(r for r in cut if r)
    runs = _split_to(runs, n)
    groups = task_groups([sum(s.size for s in run) for run in runs], n)
    return [sorted((s for i in group for s in runs[i]), key=lambda s: (s.topic, s.partition, s.start_offset))
            for group in groups]


def _split_to(runs: list[list[SegmentScanTask]], n: int) -> list[list[SegmentScanTask]]:
    """`runs` with the largest split in halves (by segment count) until there are `n` runs or none has two
    segments: every core gets work even when a few partitions hold every segment."""
    runs = list(runs)
    while len(runs) < n:
        longest = max(range(len(runs)), key=lambda i: (len(runs[i]) > 1, sum(s.size for s in runs[i])))
        run = runs[longest]
        if len(run) < 2:
            break
        runs[longest:longest + 1] = [run[: len(run) // 2], run[len(run) // 2:]]
    return runs


__all__ = ["ROWS", "SCAN_TASK_BYTES", "SCAN_TASK_RECORDS", "PartitionScan", "PartitionScanSettings", "RowLayout",
           "ScanSettings", "ScanTask", "ScanTracker", "SegmentDescriptor", "describe", "positions", "scan_rows",
           "scan_slices"]
