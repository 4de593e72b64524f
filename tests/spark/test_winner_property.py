"""The winner rule on Spark equals the reference (`compaction.strategies.ranking`), over random rows: the run's
aggregate (`compaction.spark.winners.best_per_key` over scan rows) and the table's (`compaction.spark.table.winners`:
the rank columns computed by Spark from records' timestamps and headers, then `compaction.spark.ranking.best`)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, BooleanType, IntegerType, LongType, StructField, StructType

from compaction.config import CompactionStrategy
from compaction.format.batch import Header, Record
from compaction.spark.read import RECORD_STRUCT
from compaction.spark.scan import ROWS
from compaction.spark.table import winners
from compaction.spark.winners import best_per_key
from compaction.strategies.ranking import Rank, Ranking
from compaction.strategies.ranking import best_per_key as reference_best

ROW = st.tuples(st.integers(0, 2), st.binary(min_size=0, max_size=3), st.integers(0, 1), st.integers(-3, 3),
                st.booleans())


def reference(rows: list[tuple[int, bytes, int, int, int, bool]]) -> set[tuple[int, bytes, int, int, int, bool]]:
    best = reference_best(((tp, key), Rank(hv, v, o), (tp, key, hv, v, o)) for tp, key, hv, v, o, _d in rows)
    dirty = {(tp, key) for tp, key, *_rank, d in rows if d}
    return {(*row, (row[0], row[1]) in dirty) for row in best.values()}


@pytest.mark.spark
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ROW, max_size=40), st.booleans())
def test_spark_winners_equal_the_reference(spark: SparkSession, raw: list, by_offset: bool) -> None:
    # offsets unique per partition, as in a log; by_offset: every rank is (0, 0, offset)
    rows = [(tp, key, 0 if by_offset else hv, 0 if by_offset else v, 1000 * i + tp, dirty)
            for i, (tp, key, hv, v, dirty) in enumerate(raw)]
    frame = spark.createDataFrame(rows, ROWS)
    if by_offset:
        frame = frame.drop("has_version", "version")
    got = best_per_key(frame, by_offset).collect()
    if by_offset:
        found = {(r.tp, bytes(r.key), 0, 0, r.offset, r.dirty) for r in got}
    else:
        found = {(r.tp, bytes(r.key), r.has_version, r.version, r.offset, r.dirty) for r in got}
    assert found == reference(rows)


HEADER = "version"
HEADER_VALUES = st.one_of(st.integers(-2, 2).map(lambda v: struct.pack(">q", v)),
                          st.sampled_from([None, b"", b"\x00\x07", struct.pack(">q", -(2**63))]))
HEADERS = st.lists(st.tuples(st.sampled_from([HEADER, "Version"]), HEADER_VALUES), max_size=3)
RECORD = st.tuples(st.integers(0, 1), st.sampled_from([b"a", b"b"]), st.integers(0, 2), HEADERS)
RECORDS = StructType([StructField("partition", IntegerType(), False), StructField("key", BinaryType(), True),
                      StructField("value", BinaryType(), True), StructField("offset", LongType(), False),
                      StructField("timestamp", LongType(), False),
                      StructField("headers", RECORD_STRUCT["headers"].dataType, False),
                      StructField("fresh", BooleanType(), False)])


@pytest.mark.spark
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(RECORD, min_size=1, max_size=25), st.sampled_from(list(CompactionStrategy)))
def test_the_table_winners_rank_records_as_the_reference(spark: SparkSession, raw: list,
                                                         strategy: CompactionStrategy) -> None:
    records = [(p, Record(offset, ts, key, b"v", tuple(Header(k, v) for k, v in headers)))
               for offset, (p, key, ts, headers) in enumerate(raw)]
    frame = spark.createDataFrame([(p, r.key, r.value, r.offset, r.timestamp, [(h.key, h.value) for h in r.headers],
                                    True) for p, r in records], RECORDS)
    ranking = Ranking(strategy, HEADER)
    want = reference_best(((p, r.key), ranking.rank(r), ranking.rank(r)) for p, r in records)
    got = {(r.partition, bytes(r.key)): (r.offset, None if strategy is CompactionStrategy.OFFSET else r.version)
           for r in winners([frame], strategy, HEADER).collect()}
    assert got == {tp: (rank.offset, None if strategy is CompactionStrategy.OFFSET else
                        (rank.version if rank.has_version else None)) for tp, rank in want.items()}
