"""The winner rule on Spark equals the plain reference: `compaction.spark.winners.best_per_key` (the run's
aggregate) against `compaction.strategies.winner.best_per_key` (numpy, one process), over random rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from compaction.spark.scan import ROWS
from compaction.spark.winners import best_per_key
from compaction.strategies.winner import best_per_key as reference_best

ROW = st.tuples(st.integers(0, 2), st.binary(min_size=0, max_size=3), st.integers(0, 1), st.integers(-3, 3),
                st.booleans())


def reference(rows: list[tuple[int, bytes, int, int, int, bool]]) -> set[tuple[int, bytes, int, int, int, bool]]:
    out = set()
    for tp in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == tp]
        keys = pa.array([r[1] for r in mine], pa.large_binary())
        idx = reference_best(keys, np.array([r[2] for r in mine], np.int8), np.array([r[3] for r in mine], np.int64),
                             np.array([r[4] for r in mine], np.int64))
        for i in idx:
            key = mine[i][1]
            out.add((*mine[i][:5], any(r[5] for r in mine if r[1] == key)))
    return out


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
