"""The scan job: segments → one row per (segment, key) with the key's best rank in that segment.

`mapInArrow` over segment descriptors cut into tasks of ~`SCAN_TASK_BYTES` (`scan_slices`): each executor opens
the store from its picklable spec, fetches the object (into the run's segment cache when the rewrite will need
it: `compaction.rewrite.cache`), runs the numba columnar scan and pre-aggregates per key
(`compaction.strategies.winner.segment_best`). Rows are as narrow as the aggregation allows, since Spark pays per
row and column: the partition is an index `tp` into the run's partitions, and when every partition ranks by
offset the constant rank columns are left out (`rows_schema`).

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

import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.run.tasks import TP, SegmentScanTask
from compaction.storage.base import StoreSpec, StoreStats
from compaction.strategies.transactions import TxnEvent
from compaction.strategies.winner import AbortedRange

SCAN_TASK_BYTES = 256 * 2**20
"""Segment bytes one scan task aims at. A Python task costs ~55 ms whatever it does (`make bench` P5: a
run's fixed cost), so a task per segment made a run of 40 small segments spend 4 s on task overhead alone."""

_SEGMENTS = StructType(
    [
        StructField("tp", IntegerType(), False),
        StructField("segment_id", StringType(), False),
        StructField("log_key", StringType(), False),
        StructField("dirty", BooleanType(), False),
        StructField("filter_key", StringType(), True),
        StructField("cache", BooleanType(), False),
        StructField("seg", IntegerType(), False),
    ]
)
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
_ARROW_ROWS = pa.schema([pa.field(f.name, t, False) for f, t in zip(
    ROWS.fields, (pa.int32(), pa.binary(), pa.int8(), pa.int64(), pa.int64(), pa.bool_()), strict=True)])
_ARROW_ROWS_BY_OFFSET = pa.schema([f for f in _ARROW_ROWS if f.name not in ("has_version", "version")])


def rows_schema(by_offset: bool, with_segment: bool = False) -> StructType:
    """The scan rows' schema: without the rank columns when every partition ranks by offset; with `seg`, the
    index of the row's segment among the scanned ones, when asked."""
    schema = ROWS_BY_OFFSET if by_offset else ROWS
    return StructType([*schema.fields, StructField("seg", IntegerType(), False)]) if with_segment else schema


@dataclass(frozen=True)
class ScanSettings:
    """What every scan task of a run needs to know about its partitions (indexed by `tp`)."""

    spec: StoreSpec
    strategies: tuple[tuple[str, str | None], ...]  # per tp: (compaction.strategy, header name)
    aborted: tuple[tuple[AbortedRange, ...], ...]  # per tp
    fpps: tuple[float, ...]  # per tp: rate of the filters the scan builds
    cache_dir: str | None = None
    with_segment: bool = False  # rows carry `seg`: which scanned segment they come from

    @property
    def by_offset(self) -> bool:
        """Every partition ranks by offset: a key's best is its greatest offset."""
        return all(CompactionStrategy(s) is CompactionStrategy.OFFSET for s, _h in self.strategies)


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
    requests: StoreStats = field(default_factory=StoreStats)

    def add(self, other: PartitionScan) -> PartitionScan:
        self.error = self.error or other.error
        self.filters_built.update(other.filters_built)
        self.events.update(other.events)
        self.scanned.update(other.scanned)
        self.cached.update(other.cached)
        self.invalid_versions += other.invalid_versions
        self.scan_task_ms += other.scan_task_ms
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


def _scanner(settings: ScanSettings, tracker: Accumulator) -> Callable[[Iterator[pa.RecordBatch]],
                                                                      Iterator[pa.RecordBatch]]:
    from compaction.bloom.segment import segment_filter
    from compaction.errors import ObjectExistsError
    from compaction.format.scan import scan_segment
    from compaction.rewrite.cache import SegmentCache
    from compaction.rewrite.events import txn_events
    from compaction.strategies.winner import segment_best

    cache = SegmentCache(settings.cache_dir) if settings.cache_dir else None
    base = _ARROW_ROWS_BY_OFFSET if settings.by_offset else _ARROW_ROWS
    schema = base.append(pa.field("seg", pa.int32(), False)) if settings.with_segment else base

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = settings.spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                tp, sid, key = d["tp"], d["segment_id"], d["log_key"]
                strategy, header = settings.strategies[tp]
                before, started = replace(store.stats), time.monotonic()
                report = PartitionScan()
                try:
                    cached = d["cache"] and cache is not None
                    data = cache.fetch(store, key, sid) if cached and cache is not None else store.get(key)
                    report.scanned[sid] = len(data)
                    if cached:
                        report.cached[sid] = len(data)
                    segment = scan_segment(data, obj=store.object_uri(key), header_key=header)
                except KcompactError as exc:  # corrupt input, or a store failure retries did not cure:
                    report.error = exc  # fail this partition (its exit code says whether a rerun helps)
                    report.requests = store.stats - before
                    tracker.add({tp: report})
                    continue
                if d["filter_key"] is not None:
                    with contextlib.suppress(ObjectExistsError):  # an earlier attempt wrote it, from the same bytes
                        store.put(d["filter_key"], segment_filter(segment, settings.fpps[tp]).to_bytes())
                    report.filters_built[sid] = d["filter_key"]
                best = segment_best(segment.records, settings.aborted[tp], CompactionStrategy(strategy))
                events = txn_events(segment)
                if events:
                    report.events[sid] = tuple(events)
                report.invalid_versions = best.invalid_versions
                report.scan_task_ms = round(1000 * (time.monotonic() - started))
                report.requests = store.stats - before
                tracker.add({tp: report})
                n = len(best.keys)
                where = pa.repeat(pa.scalar(tp, pa.int32()), n)
                dirty = pa.repeat(pa.scalar(d["dirty"], pa.bool_()), n)
                columns = ([where, best.keys, best.offset, dirty] if settings.by_offset
                           else [where, best.keys, best.has_version, best.version, best.offset, dirty])
                if settings.with_segment:
                    columns.append(pa.repeat(pa.scalar(d["seg"], pa.int32()), n))
                yield pa.RecordBatch.from_arrays(columns, schema=schema)

    return scan


def scan_rows(spark: SparkSession, settings: ScanSettings, segments: Sequence[SegmentScanTask],
              tps: Mapping[TP, int], tracker: Accumulator) -> DataFrame:
    """Per scanned segment one row per distinct key with its best rank (`rows_schema`); `tps` indexes the run's
    partitions, `seg` (when asked) indexes `segments`. Lazy: the scan runs when the rows are first used."""
    index = {s.segment_id: i for i, s in enumerate(segments)}
    slices = scan_slices(segments, spark.sparkContext.defaultParallelism)
    described = [(tps[(s.topic, s.partition)], s.segment_id, s.log_key, s.dirty, s.filter_key, s.cache,
                  index[s.segment_id]) for part in slices for s in part]
    descriptors = spark.createDataFrame(spark.sparkContext.parallelize(described, max(1, len(slices))), _SEGMENTS)
    return descriptors.mapInArrow(_scanner(settings, tracker), rows_schema(settings.by_offset,
                                                                           settings.with_segment))


def scan_slices(segments: Sequence[SegmentScanTask], parallelism: int) -> list[list[SegmentScanTask]]:
    """The segments cut into scan tasks: at least 2 per core (while there are segments), more when the bytes
    call for it (SCAN_TASK_BYTES each); largest segments first into the lightest task. Pure.

    The slices are sized as `SparkContext.parallelize` cuts a list (slice i holds items [i*L//n, (i+1)*L//n)),
    so parallelising their concatenation gives each task exactly one slice.
    """
    total = sum(s.size for s in segments)
    n = min(len(segments), max(2 * parallelism, -(-total // SCAN_TASK_BYTES)))
    if n == 0:
        return []
    counts = [(i + 1) * len(segments) // n - i * len(segments) // n for i in range(n)]
    slices: list[list[SegmentScanTask]] = [[] for _ in range(n)]
    loads = [0] * n
    for s in sorted(segments, key=lambda s: -s.size):
        i = min((i for i in range(n) if len(slices[i]) < counts[i]), key=lambda i: loads[i])
        slices[i].append(s)
        loads[i] += s.size
    return slices


__all__ = ["ROWS", "ROWS_BY_OFFSET", "SCAN_TASK_BYTES", "PartitionScan", "ScanSettings", "ScanTracker",
           "rows_schema", "scan_rows", "scan_slices"]
