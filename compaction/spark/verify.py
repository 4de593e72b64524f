"""`kcompact verify` on Spark: the same comparison as `compaction.verify`'s reference path, with a flat driver.

1. **Views** (`mapInArrow`, the segments of either version packed into tasks by bytes, `packed_frame`):
   executors open the store from its picklable spec and turn each segment into the rows a read_committed consumer
   could receive below the compared log end (`verify.columnar.view_rows`: the numba scan, ranks, headers). Each
   task reports each segment's transaction summary; the driver folds them into the open transactions of each view
   (a handful of producers) and the rows of those transactions are filtered out, as the reader does.
2. **Latest per key** (a shuffle): `groupBy(key)` keeps each version's greatest (has_version, version,
   offset) (`compaction.spark.ranking.best`). Keys are compared by their **full bytes**: no hash decides identity.
3. **Judge**: a key whose winner changed, vanished or appeared is flagged in Spark. A vanished tombstone below
   the cleaner offset is joined to the evidence of the replaced segments that carried it (read on the
   executors as well, only those whose offsets can hold one): its delete horizon and the clock of the run
   that dropped it. The records at or above the cleaner offset are joined by offset and must be identical.
4. **Report**: counts, and the first `max_listed` problems (keys in order, then the uncleaned region's
   offsets) and dropped tombstones are collected; `verify.compare.judge_latest` / `judge_uncleaned` word each
   listed problem exactly as the reference path does.

Reads only; intermediate data is persisted on the executors' disks and released before returning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam, StorageLevel
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.config import CompactionStrategy
from compaction.errors import KcompactError, MissingObjectError
from compaction.format.batch import Header, Record
from compaction.metadata import ObjectSuffix, PartitionSnapshot, SegmentState
from compaction.reader import SegmentRef, aborted_ranges, segment_ref
from compaction.spark.packed import packed_frame
from compaction.spark.ranking import best
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.strategies.winner import AbortedRange
from compaction.verify.compare import KeyProblem, judge_latest, judge_uncleaned
from compaction.verify.report import VerifyReport
from compaction.verify.span import VerifySpan
from compaction.verify.view import TombstoneEvidence

BEFORE, AFTER = 0, 1
_ROW_BATCH = 65_536

_HEADER = StructType([StructField("key", BinaryType(), False), StructField("value", BinaryType(), True)])
_ROWS = StructType(
    [
        StructField("side", ByteType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", LongType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", ArrayType(_HEADER, False), False),
        StructField("has_version", ByteType(), False),
        StructField("version", LongType(), False),
        StructField("producer_id", LongType(), False),
        StructField("txn_base", LongType(), True),
    ]
)
_SEGMENTS = StructType(
    [StructField("side", ByteType(), False), StructField("start_offset", LongType(), False),
     StructField("log_key", StringType(), False)]
)
_REPLACED = StructType([StructField("log_key", StringType(), False), StructField("dropped_ms", LongType(), False)])
_TOMBSTONES = StructType(
    [StructField("key", BinaryType(), False), StructField("offset", LongType(), False),
     StructField("horizon_ms", LongType(), True), StructField("dropped_ms", LongType(), False)]
)

# what step 3 flags per key; TOMBSTONE is a vanished tombstone still to be judged by its evidence
CHANGED, VANISHED, APPEARED, TOMBSTONE, EXPIRED = "changed", "vanished", "appeared", "tombstone", "expired"
PROBLEMS = (CHANGED, VANISHED, APPEARED)


class _Reports(AccumulatorParam):
    """Merges what tasks report: {"txn": {(side, start offset): TxnSummary}, "errors": {(side, obj): error}}.
    Keyed by segment, so a task that runs twice reports the same thing twice, harmlessly."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        for name, items in b.items():
            a.setdefault(name, {}).update(items)
        return a


def _viewer(
    spec: StoreSpec, strategy: str, header: str | None, aborted: Mapping[int, Sequence[AbortedRange]], below: int,
    reports: Accumulator,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The view task: per segment descriptor (`_SEGMENTS`), its `_ROWS`."""
    from compaction.verify.columnar import view_rows

    def view(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                side, key = d["side"], d["log_key"]
                try:
                    rows, summary = view_rows(store.view(key), obj=store.object_uri(key),
                                              strategy=CompactionStrategy(strategy), header=header,
                                              aborted=aborted[side], below=below)
                except KcompactError as exc:  # raised again on the driver, typed, after the job
                    reports.add({"errors": {(side, key): exc}})
                    continue
                reports.add({"txn": {(side, d["start_offset"]): summary}})
                sides = pa.repeat(pa.scalar(side, pa.int8()), rows.num_rows)
                yield from rows.add_column(0, "side", sides).to_batches(_ROW_BATCH)

    return view


def _tombstone_reader(spec: StoreSpec, reports: Accumulator
                      ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The evidence task: per replaced segment (`_REPLACED`), its keyed tombstones (`_TOMBSTONES`)."""
    from compaction.verify.columnar import carried_tombstones

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                key = d["log_key"]
                try:
                    tombs = carried_tombstones(store.view(key), obj=store.object_uri(key))
                except MissingObjectError:
                    continue  # gc deleted it: it proves nothing, as in the reference path
                except KcompactError as exc:
                    reports.add({"errors": {(AFTER, key): exc}})
                    continue
                dropped = pa.repeat(pa.scalar(d["dropped_ms"], pa.int64()), tombs.num_rows)
                yield from tombs.append_column("dropped_ms", dropped).to_batches(_ROW_BATCH)

    return read


def verify_on_spark(spark: SparkSession, store: ObjectStore, span: VerifySpan, *, max_listed: int) -> VerifyReport:
    """`compaction.verify.verify_partition` with a SparkSession: the same report, the driver holding only the
    listed problems. Raises as the reference path does (a `before` that gc made unreadable: ConfigError)."""
    refs = {BEFORE: _refs(span.before, span.log_end_offset), AFTER: _refs(span.after, span.log_end_offset)}
    try:
        for ref in refs[BEFORE]:
            store.size(ref.log_key)
        aborted = {BEFORE: _flat(aborted_ranges(store, refs[BEFORE]))}
    except MissingObjectError as exc:
        raise span.unreadable(exc) from exc
    aborted[AFTER] = _flat(aborted_ranges(store, refs[AFTER]))
    reports = spark.sparkContext.accumulator({}, _Reports())
    segments = [(side, r.start_offset, r.log_key) for side in (BEFORE, AFTER) for r in refs[side]]
    sizes = _sizes(span.before, span.log_end_offset) + _sizes(span.after, span.log_end_offset)
    descriptors = packed_frame(spark, segments, sizes, _SEGMENTS)
    ranking = span.ranking
    header = ranking.header if ranking.strategy is CompactionStrategy.HEADER else None
    rows = descriptors.mapInArrow(
        _viewer(store.spec, ranking.strategy.value, header, aborted, span.log_end_offset, reports), _ROWS
    ).persist(StorageLevel.DISK_ONLY)
    persisted = [rows]
    try:
        rows.count()
        _raise_errors(span, reports.value)
        visible = rows.filter(~_unstable(reports.value.get("txn", {})))
        counts, latest = Observation("verify"), _latest(visible, span.cleaner_offset, span.log_start_offset)
        flagged = (latest.observe(counts, F.count("b").alias("before"), F.count("a").alias("after"))
                   .filter(F.col("finding").isNotNull()).persist(StorageLevel.DISK_ONLY))
        persisted.append(flagged)
        tombstones = flagged.filter(F.col("finding") == TOMBSTONE).agg(
            F.min("b.offset"), F.max("b.offset")).collect()[0]
        evidence = _evidence(spark, store, span.after, tombstones[0], tombstones[1], reports)
        judged = _judged(flagged, evidence).persist(StorageLevel.DISK_ONLY)
        persisted.append(judged)
        by_finding = {r["finding"]: r["count"] for r in judged.groupBy("finding").count().collect()}
        _raise_errors(span, reports.value)
        problem_keys = judged.filter(F.col("finding").isin(*PROBLEMS))
        listed = problem_keys.orderBy("key").limit(max_listed).collect()
        expired = [bytes(r["key"]) for r in judged.filter(F.col("finding") == EXPIRED).select("key")
                   .orderBy("key").limit(max_listed).collect()]
        uncleaned = _uncleaned(visible, span.tail_from, problem_keys.select("key")).persist(
            StorageLevel.DISK_ONLY)
        persisted.append(uncleaned)
        uncleaned_count = uncleaned.count()
        tail = uncleaned.orderBy("offset").limit(max(0, max_listed - len(listed))).collect() if uncleaned_count else []
        keys = key_counts(counts, latest)
    finally:
        for frame in persisted:
            frame.unpersist()
    problems = [_latest_problem(span, r) for r in listed] + [_uncleaned_problem(span, r) for r in tail]
    return span.report(keys_before=keys[0], keys_after=keys[1], problems=problems,
                       problem_count=sum(by_finding.get(f, 0) for f in PROBLEMS) + uncleaned_count,
                       expired=expired, expired_count=by_finding.get(EXPIRED, 0))


def _refs(snapshot: PartitionSnapshot, below: int) -> list[SegmentRef]:
    return [segment_ref(s) for s in snapshot.live_segments if s.start_offset < below]


def _sizes(snapshot: PartitionSnapshot, below: int) -> list[int]:
    """The bytes of each segment `_refs` gives, in its order."""
    return [s.segment_size_bytes for s in snapshot.live_segments if s.start_offset < below]


def _flat(ranges: Mapping[int, Sequence[tuple[int, int]]]) -> list[AbortedRange]:
    return [(pid, first, last) for pid, spans in sorted(ranges.items()) for first, last in spans]


def _raise_errors(span: VerifySpan, reports: Mapping[str, Any]) -> None:
    """The first error a task reported, as the reference path would raise it."""
    errors = reports.get("errors", {})
    if not errors:
        return
    (side, _obj), exc = min(errors.items(), key=lambda item: item[0])
    if side == BEFORE and isinstance(exc, MissingObjectError):
        raise span.unreadable(exc) from exc
    raise exc


def _unstable(summaries: Mapping[tuple[int, int], Any]) -> Column:
    """Rows of transactions still open in their view (`reader.ConsumerRead.unstable_from`): a
    transaction open at `before` stays hidden at `after` too."""
    from compaction.verify.columnar import open_transactions_after

    def view(side: int) -> dict[int, int]:
        return open_transactions_after(s for (sd, _start), s in sorted(summaries.items()) if sd == side)

    before = view(BEFORE)
    after = view(AFTER)
    for pid, first in before.items():
        after[pid] = min(first, after.get(pid, first))
    hidden = F.lit(False)
    for side, open_txns in ((BEFORE, before), (AFTER, after)):
        for pid, first in open_txns.items():
            hidden = hidden | ((F.col("side") == side) & (F.col("producer_id") == pid) & (F.col("txn_base") >= first))
    return F.coalesce(hidden, F.lit(False))


_RECORD_FIELDS = ("offset", "timestamp", "key", "value", "headers")


def _record_struct() -> Column:
    """The fields `compare` judges a record by, as one struct column."""
    return F.struct(*_RECORD_FIELDS)


def _same(b: Column, a: Column) -> Column:
    """`compare._same` on two record structs: offset, timestamp, key, value and headers all equal."""
    return ((b["offset"] == a["offset"]) & (b["timestamp"] == a["timestamp"]) & b["key"].eqNullSafe(a["key"])
            & b["value"].eqNullSafe(a["value"]) & b["headers"].eqNullSafe(a["headers"]))


def _latest(visible: DataFrame, cleaner_offset: int, log_start_offset: int) -> DataFrame:
    """(key, b, a, finding) of every key: its winner in each view, and the finding when they are not the same
    (null when they are, or when the winner at `before` expired with retention, below `log_start_offset`)."""

    def winner(side: int) -> Column:
        ranked = best(_RECORD_FIELDS[1:], where=F.col("side") == side)  # (rank, record) starts with the offset
        return ranked.dropFields("has_version", "version")

    latest = visible.filter(F.col("key").isNotNull()).groupBy("key").agg(
        winner(BEFORE).alias("b"), winner(AFTER).alias("a"))
    b, a = F.col("b"), F.col("a")
    finding = (F.when(b.isNotNull() & (b["offset"] < log_start_offset), F.lit(None))
               .when(b.isNotNull() & a.isNotNull(), F.when(~_same(b, a), F.lit(CHANGED)))
               .when(b.isNotNull() & b["value"].isNull() & (b["offset"] < cleaner_offset), F.lit(TOMBSTONE))
               .when(b.isNotNull(), F.lit(VANISHED))
               .otherwise(F.lit(APPEARED)))
    return latest.select("key", "b", "a", finding.alias("finding"))


OBSERVED_WAIT_S = 60.0
"""How long verify waits, once its queries are done, for the key counts its `Observation` took on the way (Spark
hands them over in a listener event, within milliseconds) before counting with a query of its own.
`Observation.get` alone waits without a limit, and forever where the optimizer dropped the observed node
(SPARK-54620)."""


def key_counts(counts: Observation, latest: DataFrame, wait_s: float = OBSERVED_WAIT_S) -> tuple[int, int]:
    """How many keys have a winner before and after: what `counts` observed of `latest` (`_latest`, unobserved)
    on its first query, or, if that has not arrived within `wait_s`, an aggregate of `latest` (one more
    shuffle)."""
    future = counts._jo.future() if counts._jo is not None else None
    deadline = time.monotonic() + wait_s
    while future is not None and not future.isCompleted() and time.monotonic() < deadline:
        time.sleep(0.01)
    observed = counts.get if future is not None and future.isCompleted() else {}
    if "before" in observed and "after" in observed:
        return int(observed["before"]), int(observed["after"])
    row = latest.agg(F.count("b"), F.count("a")).collect()[0]
    return int(row[0]), int(row[1])


def _evidence(spark: SparkSession, store: ObjectStore, after: PartitionSnapshot, first: int | None,
              last: int | None, reports: Accumulator) -> DataFrame:
    """(key, offset, horizon_ms, dropped_ms) per tombstone that replaced segments holding offsets in
    [first, last] carried: the greatest horizon among its carriers and the latest clock that replaced one."""
    carriers = [] if first is None or last is None else [
        s for s in after.segments if s.state is SegmentState.DELETE_SEGMENT_STARTED and s.start_offset <= last
        and s.end_offset >= first and s.object_key(ObjectSuffix.LOG) is not None]
    replaced = [(s.object_key(ObjectSuffix.LOG), s.event_timestamp_ms) for s in carriers]
    described = packed_frame(spark, replaced, [s.segment_size_bytes for s in carriers], _REPLACED)
    carried = described.mapInArrow(_tombstone_reader(store.spec, reports), _TOMBSTONES)
    return carried.groupBy("key", "offset").agg(F.max("horizon_ms").alias("horizon_ms"),
                                                 F.max("dropped_ms").alias("dropped_ms"))


def _judged(flagged: DataFrame, evidence: DataFrame) -> DataFrame:
    """`flagged` with each vanished tombstone judged by its evidence: EXPIRED if dropped at or after its delete
    horizon (KIP-534), else VANISHED."""
    ev = evidence.withColumnRenamed("key", "ev_key").withColumnRenamed("offset", "ev_offset")
    joined = flagged.join(ev, (F.col("key") == F.col("ev_key")) & (F.col("b.offset") == F.col("ev_offset"))
                          & (F.col("finding") == TOMBSTONE), "left")
    horizon, dropped = F.col("horizon_ms"), F.col("dropped_ms")
    allowed = horizon.isNotNull() & dropped.isNotNull() & (dropped >= horizon)
    finding = F.when(F.col("finding") == TOMBSTONE, F.when(allowed, F.lit(EXPIRED)).otherwise(F.lit(VANISHED)))
    return joined.select("key", "b", "a", finding.otherwise(F.col("finding")).alias("finding"),
                         F.col("finding").alias("flagged"), "horizon_ms", "dropped_ms")


def _uncleaned(visible: DataFrame, tail_from: int, reported: DataFrame) -> DataFrame:
    """(offset, b, a): per key (keyless records count as one), the first record at or above `tail_from` (the cleaner
    offset, or the log start above it) that is not identical in both views, for keys whose winner is not already
    `reported`."""
    tail = visible.filter(F.col("offset") >= tail_from)
    b = tail.filter(F.col("side") == BEFORE).select("offset", _record_struct().alias("b"))
    a = tail.filter(F.col("side") == AFTER).select("offset", _record_struct().alias("a"))
    diff = b.join(a, "offset", "full_outer").filter(~F.coalesce(_same(F.col("b"), F.col("a")), F.lit(False)))
    key = F.when(F.col("b").isNotNull(), F.col("b.key")).otherwise(F.col("a.key"))
    first = diff.groupBy(key.alias("tail_key")).agg(F.min_by(F.struct("offset", "b", "a"), "offset").alias("t"))
    kept = first.join(reported, first["tail_key"] == reported["key"], "left_anti")
    return kept.select("t.offset", "t.b", "t.a")


def _record(row: Row | None) -> Record | None:
    if row is None:
        return None
    headers = tuple(Header(bytes(h["key"]).decode("utf-8", "surrogateescape"),
                           None if h["value"] is None else bytes(h["value"])) for h in row["headers"])
    return Record(row["offset"], row["timestamp"], None if row["key"] is None else bytes(row["key"]),
                  None if row["value"] is None else bytes(row["value"]), headers)


def _latest_problem(span: VerifySpan, row: Row) -> KeyProblem:
    evidence = TombstoneEvidence(row["horizon_ms"], row["dropped_ms"]) if row["flagged"] == TOMBSTONE else None
    problem = judge_latest(bytes(row["key"]), _record(row["b"]), _record(row["a"]),
                           cleaner_offset=span.cleaner_offset, log_end_offset=span.log_end_offset, evidence=evidence,
                           log_start_offset=span.log_start_offset)
    assert problem is not None, f"Spark flagged key {row['key']!r} as {row['finding']}, the reference path does not"
    return problem


def _uncleaned_problem(span: VerifySpan, row: Row) -> KeyProblem:
    problem = judge_uncleaned(row["offset"], _record(row["b"]), _record(row["a"]), span.cleaner_offset)
    assert problem is not None, f"Spark flagged offset {row['offset']} as changed, the reference path does not"
    return problem
