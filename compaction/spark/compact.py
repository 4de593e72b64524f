"""The compaction data path on Spark: scan → key → winner → rewrite, for every eligible partition at once.

1. **Scan** (`mapInArrow` over segment descriptors, one task per segment): each executor opens the store from
   its picklable spec, reads the object and runs the numba columnar scan, emitting one row per record that
   can win its key: keyed, not a control record, not in an aborted transaction.
2. **Winners** (a shuffle): `groupBy(topic, partition, key).max(offset)` — the offset strategy. Keys are
   compared by their **full bytes** (Spark's binary ordering), so two keys can never be confused: no hash,
   no collision bound to argue about. There is no key-count limit and no driver-side map; the only
   per-key state lives in the shuffle, bounded by the cluster. (Measured: an aggregate is ~2.5x cheaper than a
   window `row_number` dedup here, see dependencies.md.)
3. **Assignment**: winners are joined to their output group (Kafka's groupSegmentsBySize, planned on the
   driver; a small broadcast table of offset ranges) and collected per group as a sorted offset array.
4. **Rewrite** (`groupBy(topic, partition).applyInArrow`): one task per partition walks its groups in offset
   order — the transaction-marker state of Kafka's cleaner runs across the groups of a round — and calls the
   pyspark-free `compaction.rewrite.rewrite_group` for each, uploading every output under a fresh segment
   id. Nothing is visible until the driver commits the metadata.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.errors import KcompactError
from compaction.rewrite.upload import PartitionTask, rewrite_partition
from compaction.storage.base import StoreSpec
from compaction.storage.layout import Suffix

_SEGMENTS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("log_key", StringType(), False),
        StructField("start_offset", LongType(), False),
    ]
)
_RECORDS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("key", BinaryType(), False),
        StructField("has_version", ByteType(), False),
        StructField("version", LongType(), False),
        StructField("offset", LongType(), False),
    ]
)
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
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("key", pa.binary(), False),
        pa.field("has_version", pa.int8(), False),
        pa.field("version", pa.int64(), False),
        pa.field("offset", pa.int64(), False),
    ]
)
_ARROW_RESULTS = pa.schema(
    [
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("group_id", pa.int32(), False),
        pa.field("result", pa.string(), False),
    ]
)

AbortedRanges = Mapping[tuple[str, int], Sequence[tuple[int, int, int]]]  # (pid, first, last)


@dataclass(frozen=True)
class SegmentScanTask:
    topic: str
    partition: int
    log_key: str
    start_offset: int


class _Problems(AccumulatorParam):
    """Merges per-partition counters and errors raised on executors: {(topic, partition): {name: value}}."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        for tp, items in b.items():
            into = a.setdefault(tp, {})
            for name, value in items.items():
                into[name] = into.get(name, 0) + value if isinstance(value, int) else value
        return a


def _scanner(
    spec: StoreSpec, aborted: AbortedRanges, strategies: Mapping[tuple[str, int], tuple[str, str | None]],
    problems: Accumulator,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    from compaction.config import CompactionStrategy
    from compaction.errors import CorruptInputError
    from compaction.format.scan import scan_segment
    from compaction.strategies.winner import ranks

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                tp = (d["topic"], d["partition"])
                strategy_name, header = strategies[tp]
                strategy = CompactionStrategy(strategy_name)
                key = d["log_key"]
                try:
                    records = scan_segment(store.get(key), obj=store.object_uri(key), header_key=header).records
                except CorruptInputError as exc:  # quarantine the partition, keep the run going
                    problems.add({tp: {"error": f"{type(exc).__name__}: {exc}"}})
                    continue
                keep = pc.and_(pc.invert(records["control"]), pc.is_valid(records["key"]))
                ranges = aborted.get(tp, ())
                if ranges:
                    keep = pc.and_(keep, pc.invert(_in_aborted(records, ranges)))
                kept = records.filter(keep)
                rank = ranks(kept, strategy)
                if rank.invalid_versions:
                    problems.add({tp: {"invalid_versions": rank.invalid_versions}})
                n = kept.num_rows
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([d["topic"]] * n, pa.string()),
                        pa.array([d["partition"]] * n, pa.int32()),
                        kept["key"].cast(pa.binary()).combine_chunks(),
                        pa.array(rank.has_version, pa.int8()),
                        pa.array(rank.version, pa.int64()),
                        kept["offset"].combine_chunks(),
                    ],
                    schema=_ARROW_RECORDS,
                )

    return scan


def _in_aborted(records: pa.Table, ranges: Sequence[tuple[int, int, int]]) -> pa.ChunkedArray:
    """Records of transactional batches that an AbortedTxn(pid, first..last) covers."""
    hit = pc.equal(records["offset"], -1)  # all false
    for pid, first, last in ranges:
        covered = pc.and_(
            pc.equal(records["producer_id"], pid),
            pc.and_(
                pc.greater_equal(records["batch_base_offset"], first),
                pc.less_equal(records["batch_base_offset"], last),
            ),
        )
        hit = pc.or_(hit, covered)
    return pc.and_(hit, records["transactional"])


def winners_by_group(
    spark: SparkSession,
    spec: StoreSpec,
    segments: Sequence[SegmentScanTask],
    groups: Sequence[tuple[str, int, int, int, int]],
    aborted: AbortedRanges,
    strategies: Mapping[tuple[str, int], tuple[str, str | None]],
    problems: Accumulator,
) -> DataFrame:
    """(topic, partition, group_id, winners: sorted array<long>) for every group that holds a winner.

    The winner of a key is its record with the greatest (has_version, version, offset): see
    `compaction.strategies.winner`. Struct comparison in Spark is field by field, left to right.
    """
    descriptors = spark.createDataFrame(
        [(s.topic, s.partition, s.log_key, s.start_offset) for s in segments], _SEGMENTS
    ).repartition(max(1, len(segments)), "log_key")
    records = descriptors.mapInArrow(_scanner(spec, aborted, strategies, problems), _RECORDS)
    best = F.max(F.struct("has_version", "version", "offset"))
    winners = records.groupBy("topic", "partition", "key").agg(best.getField("offset").alias("offset"))
    ranges = F.broadcast(spark.createDataFrame(list(groups), _GROUPS))
    joined = winners.join(
        ranges,
        (winners["topic"] == ranges["topic"])
        & (winners["partition"] == ranges["partition"])
        & (winners["offset"] >= ranges["start_offset"])
        & (winners["offset"] <= ranges["end_offset"]),
    )
    return joined.groupBy(ranges["topic"], ranges["partition"], ranges["group_id"]).agg(
        F.sort_array(F.collect_list(winners["offset"])).alias("winners")
    )


def _rewriter(
    spec: StoreSpec, tasks: Mapping[tuple[str, int], PartitionTask]
) -> Callable[[pa.Table], pa.Table]:
    def rewrite(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        topic, partition = rows[0]["topic"], rows[0]["partition"]
        winners = {r["group_id"]: r["winners"] or [] for r in rows}
        task = tasks[(topic, partition)]
        store = spec.open()
        try:
            results = rewrite_partition(store, task, winners)
        except KcompactError as exc:  # quarantine this partition: what it uploaded stays unreferenced (gc)
            results = [(-1, {"error": f"{type(exc).__name__}: {exc}", "exit_code": int(exc.exit_code)})]
        return pa.Table.from_pylist(
            [{"topic": topic, "partition": partition, "group_id": g, "result": json.dumps(res)}
             for g, res in results],
            schema=_ARROW_RESULTS,
        )

    return rewrite


@dataclass(frozen=True)
class StageResult:
    """Per partition the rewrite results of its groups (in order), and the wall time of each phase."""

    groups: dict[tuple[str, int], list[dict[str, Any]]]
    map_seconds: float
    rewrite_seconds: float
    problems: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # "error", counters


def stage_partitions(
    spark: SparkSession,
    spec: StoreSpec,
    tasks: Sequence[PartitionTask],
    aborted: AbortedRanges,
) -> StageResult:
    """Run scan → winners → rewrite for `tasks`. Uploads the output segments (fresh ids); commits nothing."""
    if not tasks:
        return StageResult({}, 0.0, 0.0)
    segments = [
        SegmentScanTask(t.topic, t.partition, seg.keys[Suffix.LOG.value], seg.start_offset)
        for t in tasks
        for g in t.groups
        for seg in g.inputs
    ]
    groups = [(t.topic, t.partition, g.group_id, g.start_offset, g.end_offset) for t in tasks for g in t.groups]
    strategies = {(t.topic, t.partition): (t.strategy, t.strategy_header) for t in tasks}
    problems = spark.sparkContext.accumulator({}, _Problems())
    started = time.monotonic()
    by_group = winners_by_group(spark, spec, segments, groups, aborted, strategies, problems).persist()
    by_group.count()  # materialise the map phase (scan + winners) so its time is its own
    map_seconds = time.monotonic() - started
    all_groups = spark.createDataFrame(
        [(t.topic, t.partition, g.group_id) for t in tasks for g in t.groups],
        StructType([_GROUPS["topic"], _GROUPS["partition"], _GROUPS["group_id"]]),
    )
    work = all_groups.join(by_group, ["topic", "partition", "group_id"], "left").select(
        "topic", "partition", "group_id", F.coalesce("winners", F.array().cast(ArrayType(LongType()))).alias("winners")
    )
    task_map = {(t.topic, t.partition): t for t in tasks}
    results = work.groupBy("topic", "partition").applyInArrow(_rewriter(spec, task_map), _RESULTS).collect()
    by_group.unpersist()
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    found: dict[tuple[str, int], dict[str, Any]] = {tp: dict(v) for tp, v in problems.value.items()}
    for row in sorted(results, key=lambda r: (r.topic, r.partition, r.group_id)):
        result = json.loads(row.result)
        if "error" in result:
            found.setdefault((row.topic, row.partition), {})["error"] = result["error"]
        else:
            out.setdefault((row.topic, row.partition), []).append(result)
    return StageResult(out, map_seconds, time.monotonic() - started - map_seconds, found)
