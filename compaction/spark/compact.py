"""The compaction data path on Spark: scan → key → (filter test → keep) → winner → rewrite, for every partition.

1. **Scan** (`mapInArrow` over segment descriptors, one task per segment): each executor opens the store from
   its picklable spec, reads the object and runs the numba columnar scan, emitting one row per record that
   can win its key (`rewrite.resolve.candidate_records`), marked dirty if its segment is not entirely
   below the first dirty offset. What is scanned: every dirty segment, and the clean segments that have no
   filter yet (their filter is built from this scan and uploaded under their own id, `filters_built`).
2. **Keys** (a shuffle): `groupBy(topic, partition, key)` keeps the best rank (has_version, version, offset)
   and whether the key is dirty. Keys are compared by their **full bytes** (Spark's binary ordering), so two
   keys can never be confused; no key-count limit, no driver-side map. This aggregate is persisted: the
   filter test and the winners both read it, so nothing is downloaded twice.
3. **Filter test** (`spark.filters`): the clean segments' filters against the dirty keys, on executors. A
   segment that may hold none of them, and that nothing else forces to be rewritten, is *kept*: not
   downloaded, not rewritten, same id and row (`compaction.bloom.skipping` says why that is safe). The
   driver then regroups the rest: kept segments end groups, chunks stay below the disk budget.
4. **Assignment**: the keys' best offsets are joined to their output group (a small broadcast table of offset
   ranges) and collected per group as a sorted offset array.
5. **Rewrite** (cogroup by partition, `applyInArrow`): one task per partition walks its groups in offset
   order — the transaction-marker state of Kafka's cleaner runs across the groups of a round — and calls the
   pyspark-free `compaction.rewrite.upload.rewrite_partition`, which uploads every output (with its filter)
   under a fresh segment id. Partitions with rewritten clean segments that were not scanned in step 1 also
   get their dirty keys with their best ranks, so those segments are read once (`rewrite.resolve`); above
   `MAX_SHIPPED_DIRTY_KEYS` dirty keys, those segments are scanned on Spark instead and their keys join the
   winners (read twice, memory bounded). Nothing is visible until the driver commits the metadata.

With no clean segment to test (a first clean, a `--force` run) steps 1, 2, 4 and 5 are what they were
before filters existed, and with no segment kept the groups are the planner's.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.bloom.filter import FilterFacts
from compaction.bloom.skipping import Verdict, merge_small, verdict
from compaction.bloom.work import PartitionWork, SegmentScanTask
from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.metadata.model import ObjectSuffix, SegmentMetadata
from compaction.rewrite.resolve import best_per_key
from compaction.rewrite.upload import PartitionTask, check_budget, rewrite_partition
from compaction.spark.filters import FilterProbe, ProbeOutcome, ProbeResult, probe_filters
from compaction.storage.base import StoreSpec

_SEGMENTS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("segment_id", StringType(), False),
        StructField("log_key", StringType(), False),
        StructField("start_offset", LongType(), False),
        StructField("dirty", BooleanType(), False),
        StructField("filter_key", StringType(), True),
    ]
)
_RECORDS = StructType(  # one row per distinct key of a scanned segment; `tp` indexes the run's partitions
    [
        StructField("tp", IntegerType(), False),
        StructField("key", BinaryType(), False),
        StructField("has_version", ByteType(), False),
        StructField("version", LongType(), False),
        StructField("offset", LongType(), False),
        StructField("dirty", BooleanType(), False),
    ]
)
_RECORDS_BY_OFFSET = StructType([f for f in _RECORDS.fields if f.name not in ("has_version", "version")])
_GROUPS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("group_id", IntegerType(), False),
        StructField("start_offset", LongType(), False),
        StructField("end_offset", LongType(), False),
    ]
)
_RESULTS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("group_id", IntegerType(), False),
        StructField("result", StringType(), False),
    ]
)
_ARROW_RECORDS = pa.schema(
    [
        pa.field("tp", pa.int32(), False),
        pa.field("key", pa.binary(), False),
        pa.field("has_version", pa.int8(), False),
        pa.field("version", pa.int64(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("dirty", pa.bool_(), False),
    ]
)
_ARROW_RECORDS_BY_OFFSET = pa.schema([f for f in _ARROW_RECORDS if f.name not in ("has_version", "version")])
_ARROW_RESULTS = pa.schema(
    [
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("group_id", pa.int32(), False),
        pa.field("result", pa.string(), False),
    ]
)

ERROR_ROW = -1
"""`group_id` of a rewrite result row that carries the partition's error."""
SUMMARY_ROW = -2
"""`group_id` of a rewrite result row that carries what the partition's task did (chunks, disk, requests)."""

AbortedRanges = Mapping[tuple[str, int], Sequence[tuple[int, int, int]]]  # (pid, first, last)
TP = tuple[str, int]


class _Tracker(AccumulatorParam):
    """Merges what executors report per partition: {(topic, partition): {name: value}}.

    Integers add up (counters), dicts merge (e.g. segment id -> filter key), anything else is replaced
    (an error: [message, exit code]).
    """

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        for tp, items in b.items():
            into = a.setdefault(tp, {})
            for name, value in items.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    into[name] = into.get(name, 0) + value
                elif isinstance(value, dict):
                    into[name] = {**into.get(name, {}), **value}
                else:
                    into[name] = value
        return a


def _scanner(
    spec: StoreSpec,
    aborted: AbortedRanges,
    strategies: Mapping[TP, tuple[str, str | None]],
    fpps: Mapping[TP, float],
    tracker: Accumulator,
    tps: Sequence[TP],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The scan task: per segment descriptor, one row per distinct key with its best rank (see `_RECORDS`).

    Rows are as narrow as the aggregation allows, since Spark pays per row and column: the partition is an
    index into `tps`, and when every partition ranks by offset the constant rank columns are left out."""
    from compaction.bloom.segment import segment_filter
    from compaction.errors import ObjectExistsError
    from compaction.format.scan import scan_segment
    from compaction.rewrite.resolve import candidate_records
    from compaction.strategies.winner import ranks

    index = {tp: i for i, tp in enumerate(tps)}
    by_offset = _by_offset(strategies)

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                tp = (d["topic"], d["partition"])
                strategy_name, header = strategies[tp]
                before = _requests(store)
                started = time.monotonic()
                key = d["log_key"]
                try:
                    segment = scan_segment(store.get(key), obj=store.object_uri(key), header_key=header)
                except KcompactError as exc:  # corrupt input, or a store failure retries did not cure:
                    tracker.add({tp: {"error": [f"{type(exc).__name__}: {exc}", int(exc.exit_code)]}})
                    continue  # fail this partition (its exit code says whether a rerun helps), keep the run going
                report: dict[str, Any] = {}
                if d["filter_key"] is not None:
                    with contextlib.suppress(ObjectExistsError):  # an earlier attempt wrote it, from the same bytes
                        store.put(d["filter_key"], segment_filter(segment, fpps[tp]).to_bytes())
                    report["filters_built"] = {d["segment_id"]: d["filter_key"]}
                kept = candidate_records(segment.records, aborted.get(tp, ()))
                strategy = CompactionStrategy(strategy_name)
                rank = ranks(kept, strategy)
                if rank.invalid_versions:
                    report["invalid_versions"] = rank.invalid_versions
                keys, has_version, version, offset = segment_best(kept, rank, strategy)
                report["scan_task_ms"] = round(1000 * (time.monotonic() - started))
                tracker.add({tp: {**report, **_delta(before, _requests(store))}})
                n = len(keys)
                where = pa.repeat(pa.scalar(index[tp], pa.int32()), n)
                dirty = pa.repeat(pa.scalar(d["dirty"], pa.bool_()), n)
                if by_offset:
                    yield pa.RecordBatch.from_arrays([where, keys, offset, dirty], schema=_ARROW_RECORDS_BY_OFFSET)
                else:
                    yield pa.RecordBatch.from_arrays([where, keys, has_version, version, offset, dirty],
                                                     schema=_ARROW_RECORDS)

    return scan


def segment_best(kept: pa.Table, rank: Any, strategy: CompactionStrategy) -> tuple[pa.Array, ...]:
    """(key, has_version, version, offset) of each key's best-ranked record within one segment.

    Pre-aggregating on the executor ships Spark one row per distinct key of the segment instead of one per
    record (34% fewer rows with uniform keys in `make bench` P2, far fewer with hot keys); the best over the
    run is the best of these bests. Offset strategy: a hash group-by (max offset, ~55 ms per 270k records);
    the others: sort by (key, rank) (`best_per_key`, ~100 ms).
    """
    keys = kept["key"].cast(pa.binary()).combine_chunks()
    offsets = kept["offset"].combine_chunks()
    if strategy is CompactionStrategy.OFFSET:
        best = pa.table({"key": keys, "offset": offsets}).group_by("key", use_threads=False).aggregate(
            [("offset", "max")])
        n = best.num_rows
        return (best["key"].combine_chunks(), pa.repeat(pa.scalar(0, pa.int8()), n),
                pa.repeat(pa.scalar(0, pa.int64()), n), best["offset_max"].combine_chunks())
    has_version = np.asarray(rank.has_version, np.int8)
    version = np.asarray(rank.version, np.int64)
    idx = best_per_key(keys, has_version, version, offsets.to_numpy())
    return (keys.take(idx), pa.array(has_version[idx], pa.int8()), pa.array(version[idx], pa.int64()),
            offsets.take(idx))


def _requests(store: Any) -> dict[str, int]:
    s = store.stats
    return {"gets": s.gets, "puts": s.puts, "bytes_read": s.bytes_read, "bytes_written": s.bytes_written}


def _delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {f"store_{k}": after[k] - before[k] for k in after}


def scanned_keys(
    spark: SparkSession,
    spec: StoreSpec,
    segments: Sequence[SegmentScanTask],
    aborted: AbortedRanges,
    strategies: Mapping[TP, tuple[str, str | None]],
    fpps: Mapping[TP, float],
    tracker: Accumulator,
) -> DataFrame:
    """(topic, partition, key, has_version, version, offset, dirty): per key its best-ranked scanned record.

    The winner of a key is its record with the greatest (has_version, version, offset): see
    `compaction.strategies.winner`. Struct comparison in Spark is field by field, left to right.
    """
    rows = scan_rows(spark, spec, segments, aborted, strategies, fpps, tracker)
    return _best_of_rows(rows, sorted(strategies), _by_offset(strategies))


def scan_rows(
    spark: SparkSession,
    spec: StoreSpec,
    segments: Sequence[SegmentScanTask],
    aborted: AbortedRanges,
    strategies: Mapping[TP, tuple[str, str | None]],
    fpps: Mapping[TP, float],
    tracker: Accumulator,
) -> DataFrame:
    """The scan job's output before Spark aggregates it: per segment one row per distinct key (`_RECORDS`, or
    `_RECORDS_BY_OFFSET` when every partition ranks by offset; `tp` indexes `sorted(strategies)`)."""
    slices = scan_slices(segments, spark.sparkContext.defaultParallelism)
    described = [(s.topic, s.partition, s.segment_id, s.log_key, s.start_offset, s.dirty, s.filter_key)
                 for part in slices for s in part]
    descriptors = spark.createDataFrame(spark.sparkContext.parallelize(described, max(1, len(slices))), _SEGMENTS)
    return descriptors.mapInArrow(_scanner(spec, aborted, strategies, fpps, tracker, sorted(strategies)),
                                  _RECORDS_BY_OFFSET if _by_offset(strategies) else _RECORDS)


def _by_offset(strategies: Mapping[TP, tuple[str, str | None]]) -> bool:
    """Every partition ranks by offset: a key's best is its greatest offset (see `_best_per_key`)."""
    return all(strategy == CompactionStrategy.OFFSET for strategy, _header in strategies.values())


def _best_of_rows(rows: DataFrame, tps: Sequence[TP], by_offset: bool) -> DataFrame:
    """The scan rows (`_RECORDS`, or `_RECORDS_BY_OFFSET`) aggregated to one row per (tp, key), then widened to
    `scanned_keys`' columns: topic and partition looked up from `tps`, constant ranks filled in."""
    if by_offset:
        best = rows.groupBy("tp", "key").agg(F.max("offset").alias("offset"), F.max("dirty").alias("dirty"))
        ranked = best.select("tp", "key", F.lit(0).cast("byte").alias("has_version"),
                             F.lit(0).cast("long").alias("version"), "offset", "dirty")
    else:
        agg = rows.groupBy("tp", "key").agg(F.max(F.struct("has_version", "version", "offset")).alias("best"),
                                            F.max("dirty").alias("dirty"))
        ranked = agg.select("tp", "key", "best.has_version", "best.version", "best.offset", "dirty")
    position = F.col("tp") + 1
    topics = F.element_at(F.array(*[F.lit(t) for t, _p in tps]), position)
    partitions = F.element_at(F.array(*[F.lit(p) for _t, p in tps]), position)
    return ranked.select(topics.alias("topic"), partitions.cast("int").alias("partition"), "key", "has_version",
                         "version", "offset", "dirty")


SCAN_TASK_BYTES = 256 * 2**20
"""Segment bytes one scan task aims at. A Python task costs ~55 ms whatever it does (`make bench` P5: a
run's fixed cost), so a task per segment made a run of 40 small segments spend 4 s on task overhead alone."""


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


def winners_by_group(
    spark: SparkSession, keys: DataFrame, groups: Sequence[tuple[str, int, int, int, int]]
) -> DataFrame:
    """(topic, partition, group_id, winners: sorted array<long>) for every group that holds a winner."""
    ranges = F.broadcast(spark.createDataFrame(list(groups), _GROUPS))
    joined = keys.join(
        ranges,
        (keys["topic"] == ranges["topic"])
        & (keys["partition"] == ranges["partition"])
        & (keys["offset"] >= ranges["start_offset"])
        & (keys["offset"] <= ranges["end_offset"]),
    )
    return joined.groupBy(ranges["topic"], ranges["partition"], ranges["group_id"]).agg(
        F.sort_array(F.collect_list(keys["offset"])).alias("winners")
    )


def group_winners(groups: pa.Table) -> dict[int, np.ndarray]:
    """Per group id its sorted winning offsets, from the rewrite's rows (group_id, winners: list<long>), where a
    group may appear more than once (its winners, and an empty row that makes every group present). Straight
    from the Arrow buffers: no Python int per offset."""
    parts: dict[int, list[np.ndarray]] = {}
    lists = groups["winners"].combine_chunks()
    ids = groups["group_id"].to_numpy()
    for i, group_id in enumerate(ids):
        value = lists[i]
        if value.is_valid and len(value.values):
            parts.setdefault(int(group_id), []).append(value.values.to_numpy())
        else:
            parts.setdefault(int(group_id), [])
    return {g: np.sort(np.concatenate(p)) if len(p) > 1 else (p[0] if p else np.empty(0, np.int64))
            for g, p in parts.items()}


def _rewriter(spec: StoreSpec, tasks: Mapping[TP, PartitionTask]) -> Callable[[pa.Table, pa.Table], pa.Table]:
    from compaction.rewrite.resolve import DirtyKeys

    def rewrite(groups: pa.Table, dirty: pa.Table) -> pa.Table:
        if groups.num_rows == 0:  # dirty keys of a partition with nothing to rewrite
            return _ARROW_RESULTS.empty_table()
        topic, partition = groups["topic"][0].as_py(), groups["partition"][0].as_py()
        winners = group_winners(groups)
        task = tasks[(topic, partition)]
        store = spec.open()
        results: list[tuple[int, dict[str, Any]]]
        try:
            needs = any(i.resolve for g in task.groups for i in g.inputs)
            done = rewrite_partition(store, task, winners, DirtyKeys.from_table(dirty) if needs else None)
            results = [*done.groups, (SUMMARY_ROW, done.summary)]
        except KcompactError as exc:  # quarantine this partition: what it uploaded stays unreferenced (gc)
            results = [(ERROR_ROW, {"error": f"{type(exc).__name__}: {exc}", "exit_code": int(exc.exit_code)}),
                       (SUMMARY_ROW, {"store": _requests(store)})]
        return pa.Table.from_pylist(
            [{"topic": topic, "partition": partition, "group_id": g, "result": json.dumps(res)}
             for g, res in results],
            schema=_ARROW_RESULTS,
        )

    return rewrite


@dataclass
class PartitionStage:
    """What staging did for one partition: its final task, the rewrite results, the filter test."""

    task: PartitionTask
    results: list[dict[str, Any]] = field(default_factory=list)  # one per group, in order
    kept: tuple[SegmentMetadata, ...] = ()
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # clean segment id -> verdict
    probes: dict[str, ProbeResult] = field(default_factory=dict)  # clean segment id -> filter test result
    filters_built: dict[str, str] = field(default_factory=dict)  # segment id -> new .bloom key
    dirty_keys: int = 0
    summary: dict[str, Any] = field(default_factory=dict)  # the rewrite task's summary
    counters: dict[str, int] = field(default_factory=dict)  # scan and probe counters (requests, versions)
    error: str | None = None
    exit_code: int = 0


@dataclass(frozen=True)
class StageResult:
    """Per partition what staging did, and the wall time of each phase (for the whole run)."""

    partitions: dict[TP, PartitionStage]
    map_seconds: float
    rewrite_seconds: float


def _add(into: dict[str, int], counts: Mapping[str, Any], prefix: str = "") -> None:
    for name, value in counts.items():
        if isinstance(value, int) and not isinstance(value, bool):
            into[prefix + name] = into.get(prefix + name, 0) + value


def stage_partitions(
    spark: SparkSession, spec: StoreSpec, works: Sequence[PartitionWork], aborted: AbortedRanges
) -> StageResult:
    """Run scan → keys → filter test → winners → rewrite for `works`. Uploads outputs (fresh ids) and the
    filters built on the way; commits nothing."""
    if not works:
        return StageResult({}, 0.0, 0.0)
    stages = {w.tp: PartitionStage(w.task) for w in works}
    started = time.monotonic()
    scans = [s for w in works for s in w.scans()]
    strategies = {w.tp: (w.task.strategy, w.task.strategy_header) for w in works}
    fpps = {w.tp: w.task.bloom_fpp for w in works}
    tracker = spark.sparkContext.accumulator({}, _Tracker())
    keys = scanned_keys(spark, spec, scans, aborted, strategies, fpps, tracker).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = keys.groupBy("topic", "partition").agg(F.sum(F.col("dirty").cast("long")).alias("dirty")).collect()
        for row in counts:  # materialises the scan and the keys; dirty counts size the filter test
            stages[(row.topic, row.partition)].dirty_keys = int(row.dirty or 0)
        _collect_tracked(stages, tracker.value)
        live = [w for w in works if stages[w.tp].error is None]
        outcome = probe_filters(spark, spec, keys, _probes(live, stages), {w.tp: stages[w.tp].dirty_keys for w in live})
        map_seconds = time.monotonic() - started
        _decide(live, stages, outcome)
        rescans = _rescans(live, stages)
        tasks = _reshape(live, stages, {s.segment_id for s in [*scans, *rescans]})
        winners = keys
        if rescans:  # partitions with too many dirty keys to ship: their rewritten clean segments, scanned
            again = spark.sparkContext.accumulator({}, _Tracker())
            more = scanned_keys(spark, spec, rescans, aborted, strategies, fpps, again)
            winners = _best_per_key(keys.unionByName(more), _by_offset(strategies))
        results = _rewrite(spark, spec, winners, keys, tasks) if tasks else []
        if rescans:
            _collect_tracked(stages, again.value)
    finally:
        keys.unpersist()
    for row in results:
        _record(stages[(row.topic, row.partition)], row.group_id, json.loads(row.result))
    return StageResult(stages, map_seconds, time.monotonic() - started - map_seconds)


MAX_SHIPPED_DIRTY_KEYS = 4_000_000
"""Above this many dirty keys, a partition's rewritten clean segments are scanned on Spark (read twice)
instead of being resolved in the rewrite task, which would have to hold every dirty key (~30-60 bytes
each with its rank: ~200 MiB at this bound). With 1% filters such a partition tests positive almost
everywhere anyway (1 - 0.99^D), so little reading is saved there."""


def _rescans(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage]) -> list[SegmentScanTask]:
    """The clean segments to scan a second time: rewritten ones of partitions above MAX_SHIPPED_DIRTY_KEYS
    that the first scan did not read."""
    out = []
    for w in works:
        stage = stages[w.tp]
        if stage.dirty_keys <= MAX_SHIPPED_DIRTY_KEYS:
            continue
        kept = {s.segment_id for s in stage.kept}
        for s in w.clean:
            if s.object_key(ObjectSuffix.BLOOM) is not None and s.segment_id not in kept | stage.filters_built.keys():
                log = s.object_key(ObjectSuffix.LOG) or ""
                out.append(SegmentScanTask(*w.tp, s.segment_id, log, s.start_offset, False,
                                           size=s.segment_size_bytes))
    return out


def _best_per_key(rows: DataFrame, by_offset: bool = False) -> DataFrame:
    """`scanned_keys`' per-key best, again over its rows from two scans that may repeat a key (max of maxes).

    `by_offset`: every row's rank is (0, 0, offset) — all partitions use the offset strategy — so the best is
    max(offset), which Spark aggregates in a hash table over fixed-width values. max(struct) cannot: it falls
    back to a sort-based aggregate, about twice the time of the whole map phase (`make bench`, P2).
    """
    if by_offset:
        agg = rows.groupBy("topic", "partition", "key").agg(F.max("offset").alias("offset"),
                                                              F.max("dirty").alias("dirty"))
        return agg.select("topic", "partition", "key", F.lit(0).cast("byte").alias("has_version"),
                          F.lit(0).cast("long").alias("version"), "offset", "dirty")
    best = F.max(F.struct("has_version", "version", "offset"))
    agg = rows.groupBy("topic", "partition", "key").agg(best.alias("best"), F.max("dirty").alias("dirty"))
    return agg.select("topic", "partition", "key", "best.has_version", "best.version", "best.offset", "dirty")


def _collect_tracked(stages: Mapping[TP, PartitionStage], tracked: Mapping[TP, Mapping[str, Any]]) -> None:
    for tp, items in tracked.items():
        stage = stages[tp]
        if "error" in items:
            message, code = items["error"]
            stage.error, stage.exit_code = str(message), int(code)
        stage.filters_built.update(items.get("filters_built", {}))
        _add(stage.counters, items)


def _probes(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage]) -> list[FilterProbe]:
    out = []
    for w in works:
        built = stages[w.tp].filters_built
        for s in w.clean:
            key = s.object_key(ObjectSuffix.BLOOM) or built.get(s.segment_id)
            if key is not None:
                out.append(FilterProbe(w.task.topic, w.task.partition, s.segment_id, key))
    return out


def _decide(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], outcome: ProbeOutcome) -> None:
    """Per partition the verdict of each clean segment, and the segments kept."""
    for w in works:
        stage = stages[w.tp]
        _add(stage.counters, outcome.requests.get(w.tp, {}), "store_")
        for s in w.clean:
            probe = outcome.results.get((*w.tp, s.segment_id))
            if probe is not None:
                stage.probes[s.segment_id] = probe
            stage.verdicts[s.segment_id] = _verdict(probe, w.task.now_ms)
        could = {i for i, v in stage.verdicts.items() if v.kept}
        kept = merge_small(w.segments, could, w.segment_bytes)
        stage.verdicts.update({i: Verdict.MERGED for i in could - kept})
        stage.kept = tuple(s for s in w.segments if s.segment_id in kept)


def _reshape(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], scanned: set[str]
             ) -> dict[TP, PartitionTask]:
    """Per partition the task over what is left to rewrite (regrouped, chunks checked against the budget)."""
    tasks = {}
    for w in works:
        stage = stages[w.tp]
        try:
            stage.task = w.reshaped({s.segment_id for s in stage.kept}, scanned)
            check_budget(stage.task)
        except KcompactError as exc:
            stage.error, stage.exit_code = f"{type(exc).__name__}: {exc}", int(exc.exit_code)
            continue
        tasks[w.tp] = stage.task
    return tasks


def _verdict(probe: ProbeResult | None, now_ms: int) -> Verdict:
    if probe is None or not probe.readable:
        return verdict(None, 0, now_ms)
    return verdict(FilterFacts(probe.horizon_ms, probe.transactional), probe.positives, now_ms)


def _rewrite(
    spark: SparkSession, spec: StoreSpec, winners: DataFrame, keys: DataFrame, tasks: Mapping[TP, PartitionTask]
) -> list[Any]:
    """The rewrite job: `winners` (per-key best) assigned to groups, `keys`' dirty rows for in-task resolving."""
    groups = [(t.topic, t.partition, g.group_id, g.start_offset, g.end_offset)
              for t in tasks.values() for g in t.groups]
    by_group = winners_by_group(spark, winners, groups)
    all_groups = spark.createDataFrame(
        [(t.topic, t.partition, g.group_id) for t in tasks.values() for g in t.groups],
        StructType([_GROUPS["topic"], _GROUPS["partition"], _GROUPS["group_id"]]),
    )
    # every group present (one with no winner still has its batches' headers and markers to rewrite), by a
    # union with empty rows: a join would shuffle the winners' arrays once more
    empty = all_groups.select("topic", "partition", "group_id", F.array().cast(ArrayType(LongType())).alias("winners"))
    work = by_group.select("topic", "partition", "group_id", "winners").unionByName(empty)
    resolving = [tp for tp, t in tasks.items() if any(i.resolve for g in t.groups for i in g.inputs)]
    wanted = spark.createDataFrame(resolving, "topic string, partition int")
    dirty = keys.filter(F.col("dirty")).join(F.broadcast(wanted), ["topic", "partition"]).select(
        "topic", "partition", "key", "has_version", "version", "offset"
    )
    return (
        work.groupBy("topic", "partition")
        .cogroup(dirty.groupBy("topic", "partition"))
        .applyInArrow(_rewriter(spec, tasks), _RESULTS)
        .collect()
    )


def _record(stage: PartitionStage, group_id: int, result: dict[str, Any]) -> None:
    if group_id == ERROR_ROW:
        stage.error, stage.exit_code = str(result["error"]), int(result.get("exit_code", 3))
    elif group_id == SUMMARY_ROW:
        stage.summary = result
        _add(stage.counters, result.get("store", {}), "store_")
    else:
        stage.results.append(result)
        stage.results.sort(key=lambda r: r["group_id"])

