"""The scan job: segments → one row per (scan task, partition, key) with the key's best rank there.

`mapInArrow` over `spark.range(n)`, task i scanning slice i of the segments (`scan_slices`: runs of one
partition's consecutive segments, a task per core; the descriptors travel in the closure, so no Python
task builds an input DataFrame): each executor opens the store from its picklable spec, fetches the object (into
the run's segment cache when the rewrite will need it: `compaction.rewrite.cache`), runs the numba columnar scan
and folds each segment's candidate records into one table per partition (`compaction.strategies.winner.fold_segment`
into a `compaction.strategies.keyfold.KeyFold`): the task hands Spark each key of its segments once, with its best
rank there. Rows are as narrow as the aggregation allows, since Spark pays per row and column:
the partition is an index `tp` into the run's partitions, and when every partition ranks by offset the constant
rank columns are left out; the one job leaves out `dirty`, and `tp` where the rewrite slot names the partition
(`rows_schema`). A rescan keeps its rows per segment (`seg`).

What the tasks learn besides rows travels back in a typed accumulator (`ScanTracker`: per partition a
`PartitionScan`, merged with `add`): the error that quarantines a partition (the exception itself, class kept),
filters built for clean segments that had none, the transactional and control batches the marker walk needs
(`compaction.rewrite.events`), store requests and task time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.run.tasks import TP, SegmentScanTask
from compaction.storage.base import ObjectStore, StoreSpec, StoreStats
from compaction.strategies.transactions import TxnEvent
from compaction.strategies.winner import AbortedRange, SegmentBest

if TYPE_CHECKING:
    from compaction.format.scan import SegmentScan

CHUNK_SLOT = "slot"
"""The column naming a row's rewrite slot: the scan writes it (`ScanSettings.slots`), the rewrite reads it."""

SCAN_TASK_BYTES = 2**30
"""The most segment bytes one scan task takes (a failed task is retried whole)."""

SCAN_TASK_RECORDS = 8_000_000
"""The most records one scan task takes, counted as the offsets its segments span (at least their records): a
task holds a row per distinct key of its segments (~40 bytes) until it hands them to Spark."""



@dataclass(frozen=True)
class _Descriptor:
    """One segment of a scan task: what the executor needs to fetch and scan it."""

    tp: int
    segment_id: str
    log_key: str
    dirty: bool
    filter_key: str | None
    cache: bool
    seg: int  # index among the scanned segments

ROWS = StructType(
    [
        StructField("tp", IntegerType(), False),
        StructField("key", BinaryType(), False),
        StructField("has_version", ByteType(), False),
        StructField("version", LongType(), False),
        StructField("offset", LongType(), False),
        StructField("dirty", BooleanType(), False),
    ]
)
ROWS_BY_OFFSET = StructType([f for f in ROWS.fields if f.name not in ("has_version", "version")])
_ARROW_TYPES = {"tp": pa.int32(), "key": pa.binary(), "has_version": pa.int8(), "version": pa.int64(),
                "offset": pa.int64(), "dirty": pa.bool_(), "seg": pa.int32(), CHUNK_SLOT: pa.int64()}


def rows_schema(by_offset: bool, with_segment: bool = False, with_slot: bool = False, with_tp: bool = True,
                with_dirty: bool = True) -> StructType:
    """The scan rows' schema: without the rank columns when every partition ranks by offset; with `seg`, the
    index of the row's segment among the scanned ones, when asked; without `dirty` when not `with_dirty` (the
    one job, `compaction.spark.pipeline`: nothing is clean then, every key is dirty).

    With `slot`, the rewrite slot of the row's partition, for the one job: each task then adds a marker row per
    partition it scanned (null key, offset -1), so that every slot has rows, and a rewrite task, even for a
    partition without any keyed record; `tp` is left out when not `with_tp` (each slot holds one partition).
    Spark pays for every column of every row it takes from Python, shuffles and aggregates: `make bench` P2
    lost ~0.7 s to `tp` and `dirty` of 2.4 M rows in a JVM not yet warm."""
    schema = ROWS_BY_OFFSET if by_offset else ROWS
    fields = [StructField(f.name, f.dataType, True) if with_slot and f.name == "key" else f for f in schema.fields
              if not ((f.name == "dirty" and not with_dirty) or (with_slot and f.name == "tp" and not with_tp))]
    extra = ([StructField("seg", IntegerType(), False)] if with_segment else []) + (
        [StructField(CHUNK_SLOT, LongType(), False)] if with_slot else [])
    return StructType([*fields, *extra])


def _arrow_schema(schema: StructType) -> pa.Schema:
    return pa.schema([pa.field(f.name, _ARROW_TYPES[f.name], f.nullable) for f in schema.fields])


@dataclass(frozen=True)
class ScanSettings:
    """What every scan task of a run needs to know about its partitions (indexed by `tp`)."""

    spec: StoreSpec
    strategies: tuple[tuple[str, str | None], ...]  # per tp: (compaction.strategy, header name)
    aborted: tuple[tuple[AbortedRange, ...], ...]  # per tp
    fpps: tuple[float, ...]  # per tp: rate of the filters the scan builds
    cache_dir: str | None = None
    with_segment: bool = False  # rows carry `seg`: which scanned segment they come from
    slots: tuple[int, ...] = ()  # per tp the rewrite slot its rows carry (`slot`); -1: no rows. () = no column
    with_tp: bool = True  # with slots: rows carry `tp` (False when each slot holds one partition)
    with_dirty: bool = True  # rows carry `dirty` (False when every key is dirty: the one job)
    rows_per_batch: int = 1 << 20  # rows per Arrow batch handed to Spark (binary keys: < 2 GiB a batch)

    @property
    def by_offset(self) -> bool:
        """Every partition ranks by offset: a key's best is its greatest offset."""
        return all(CompactionStrategy(s) is CompactionStrategy.OFFSET for s, _h in self.strategies)

    def schema(self) -> StructType:
        """The rows the scan hands Spark (`rows_schema`)."""
        return rows_schema(self.by_offset, self.with_segment, bool(self.slots), self.with_tp, self.with_dirty)


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
    """Merges `PartitionScan` reports by tp across tasks."""

    def zero(self, value: dict[int, PartitionScan]) -> dict[int, PartitionScan]:
        return {}

    def addInPlace(self, a: dict[int, PartitionScan], b: dict[int, PartitionScan]) -> dict[int, PartitionScan]:
        for tp, report in b.items():
            a[tp] = a[tp].add(report) if tp in a else report
        return a


def _scanner(settings: ScanSettings, tracker: Accumulator, slices: Sequence[Sequence[_Descriptor]]
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    from compaction.bloom.segment import segment_filter
    from compaction.errors import ObjectExistsError
    from compaction.format.scan import scan_segment
    from compaction.rewrite.cache import SegmentCache
    from compaction.rewrite.events import txn_events
    from compaction.strategies.keyfold import KeyFold
    from compaction.strategies.winner import fold_segment, folded, segment_best

    cache = SegmentCache(settings.cache_dir) if settings.cache_dir else None
    schema = _arrow_schema(settings.schema())

    def scan_one(store: ObjectStore, d: _Descriptor) -> ScannedSegment | None:
        """Fetch and check one segment; its report goes to the tracker (None: it failed its partition)."""
        tp, sid, key = d.tp, d.segment_id, d.log_key
        _strategy, header = settings.strategies[tp]
        before, started = replace(store.stats), time.monotonic()
        report = PartitionScan()
        try:
            cached = d.cache and cache is not None
            data = cache.fetch(store, key, sid) if cached and cache is not None else store.get(key)
            report.scanned[sid] = len(data)
            if cached:
                report.cached[sid] = len(data)
            segment = scan_segment(data, obj=store.object_uri(key), header_key=header)
        except KcompactError as exc:  # corrupt input, or a store failure retries did not cure:
            report.error = exc  # fail this partition (its exit code says whether a rerun helps)
            report.requests = store.stats - before
            tracker.add({tp: report})
            return None
        if d.filter_key is not None:
            with contextlib.suppress(ObjectExistsError):  # an earlier attempt wrote it, from the same bytes
                store.put(d.filter_key, segment_filter(segment, settings.fpps[tp]).to_bytes())
            report.filters_built[sid] = d.filter_key
        events = txn_events(segment)
        if events:
            report.events[sid] = tuple(events)
        if cached and cache is not None:
            cache.put_events(sid, events)
        report.requests = store.stats - before
        return ScannedSegment(segment, report, started)

    def done(d: _Descriptor, scanned: ScannedSegment, invalid_versions: int) -> None:
        """The segment's report, once its records are folded (their time is the scan's too)."""
        report = scanned.report
        report.invalid_versions = invalid_versions
        report.scan_task_ms = round(1000 * (time.monotonic() - scanned.started))
        report.ended = time.time()
        tracker.add({d.tp: report})

    def rows(tp: int, best: SegmentBest, dirty: np.ndarray, seg: int | None) -> Iterator[pa.RecordBatch]:
        step = settings.rows_per_batch
        for at in range(0, max(1, len(best.keys)), step):
            n = min(step, len(best.keys) - at)
            keys = best.keys.slice(at, n)
            keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
            columns = {"key": keys, "offset": best.offset.slice(at, n)}
            if not settings.by_offset:
                columns.update(has_version=best.has_version.slice(at, n), version=best.version.slice(at, n))
            if "tp" in schema.names:
                columns["tp"] = pa.repeat(pa.scalar(tp, pa.int32()), n)
            if "dirty" in schema.names:
                columns["dirty"] = pa.array(dirty[at:at + n], pa.bool_())
            if seg is not None:
                columns["seg"] = pa.repeat(pa.scalar(seg, pa.int32()), n)
            if settings.slots:
                columns[CHUNK_SLOT] = pa.repeat(pa.scalar(settings.slots[tp], pa.int64()), n)
            yield pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = settings.spec.open()
        folds: dict[int, KeyFold] = {}  # tp -> the fold of its segments in this task
        seen: dict[int, None] = {}
        for ids in batches:
            for d in (d for i in ids.column(0).to_pylist() for d in slices[i]):
                seen[d.tp] = None
                scanned = scan_one(store, d)
                if scanned is None:
                    continue
                strategy = CompactionStrategy(settings.strategies[d.tp][0])
                if settings.with_segment:  # the rescan: rows stay per segment
                    best = segment_best(scanned.segment.records, settings.aborted[d.tp], strategy)
                    done(d, scanned, best.invalid_versions)
                    yield from rows(d.tp, best, np.full(len(best.keys), d.dirty), d.seg)
                    continue
                fold = folds.setdefault(d.tp, KeyFold())
                done(d, scanned, fold_segment(fold, scanned.segment.records, settings.aborted[d.tp], strategy,
                                              d.dirty))
        for tp, fold in folds.items():  # one row per key of the task's segments of tp
            if settings.slots and settings.slots[tp] < 0:
                continue  # nothing of tp is rewritten
            merged, dirty = folded(fold, 0)
            yield from rows(tp, merged, dirty, None)
        if settings.slots:
            for tp in seen:
                if settings.slots[tp] >= 0:
                    yield from rows(tp, _MARKER, np.zeros(1, bool), None)

    return scan


@dataclass(frozen=True)
class ScannedSegment:
    """A segment a scan task fetched and decoded, with its report so far and when its scan started."""

    segment: SegmentScan
    report: PartitionScan
    started: float


_MARKER = SegmentBest(pa.nulls(1, pa.binary()), pa.array([0], pa.int8()), pa.array([0], pa.int64()),
                      pa.array([-1], pa.int64()), 0)
"""The marker row's columns: no key, offset -1 (never a winner: `compaction.spark.rewrite_job` skips it)."""


def scan_rows(spark: SparkSession, settings: ScanSettings, segments: Sequence[SegmentScanTask],
              tps: Mapping[TP, int], tracker: Accumulator) -> DataFrame:
    """Per scan task and partition one row per distinct key with its best rank over the task's segments of that
    partition (`rows_schema`; per segment with `seg`, which indexes `segments`, and with a marker row per task
    and partition when `settings.slots` is set); `tps` indexes the run's partitions. Lazy: the scan runs when
    the rows are first used."""
    index = {s.segment_id: i for i, s in enumerate(segments)}
    slices = scan_slices(segments, spark.sparkContext.defaultParallelism)
    described = [[_Descriptor(tps[(s.topic, s.partition)], s.segment_id, s.log_key, s.dirty, s.filter_key, s.cache,
                              index[s.segment_id]) for s in part] for part in slices]
    ids = spark.range(0, len(described), numPartitions=max(1, len(described)))  # task i scans slice i
    return ids.mapInArrow(_scanner(settings, tracker, described), settings.schema())


def scan_slices(segments: Sequence[SegmentScanTask], parallelism: int) -> list[list[SegmentScanTask]]:
    """The segments cut into scan tasks: one per core (`parallelism`), more when the bytes or the records call
    for it (`SCAN_TASK_BYTES`, `SCAN_TASK_RECORDS`), never more than the segments. Pure.

    A task takes runs of one partition's consecutive segments (a partition's whole log when it is no larger
    than a task's share of the bytes) and reduces them to one row per key (a `KeyFold`). Spark pays per row
    it takes from Python, shuffles and aggregates, and a partition cut into T runs hands it up to T rows per
    key: so tasks are as few and as large as the cores allow (`make bench` P6: one partition of 1.5 GB handed
    Spark 9.3 M rows from 8 tasks, 4.5 M from 2, for 2.4 M keys). Runs go largest first into the lightest task,
    which scans its segments in offset order per partition (two runs of a partition may land in one task).
    """
    total = sum(s.size for s in segments)
    records = sum(s.offsets for s in segments)
    n = min(len(segments), max(parallelism, -(-total // SCAN_TASK_BYTES), -(-records // SCAN_TASK_RECORDS)))
    if n == 0:
        return []
    share = max(1, -(-total // n))
    runs: list[list[SegmentScanTask]] = []
    by_tp: dict[TP, list[SegmentScanTask]] = {}
    for s in segments:
        by_tp.setdefault((s.topic, s.partition), []).append(s)
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
    slices: list[list[SegmentScanTask]] = [[] for _ in range(min(n, len(runs)))]
    loads = [0] * len(slices)
    for run in sorted(runs, key=lambda r: -sum(s.size for s in r)):
        i = min(range(len(slices)), key=lambda i: (loads[i], len(slices[i])))
        slices[i].extend(run)
        loads[i] += sum(s.size for s in run)
    return [sorted(part, key=lambda s: (s.topic, s.partition, s.start_offset)) for part in slices]


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


__all__ = ["ROWS", "ROWS_BY_OFFSET", "SCAN_TASK_BYTES", "SCAN_TASK_RECORDS", "PartitionScan", "ScanSettings",
           "ScanTracker", "rows_schema", "scan_rows", "scan_slices"]
