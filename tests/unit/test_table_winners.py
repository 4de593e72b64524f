"""`compaction.topic_table.winners`: the last header of a name per record, and a partition's table rows from its
records, against the reference rule (`compaction.strategies.ranking`) computed record by record."""

from __future__ import annotations

import random
import struct

import pyarrow as pa

from compaction.config import CompactionStrategy
from compaction.format.scan import CONSUMER_SCHEMA
from compaction.strategies.ranking import header_version
from compaction.topic_table.target import table_schema
from compaction.topic_table.winners import last_header_values, table_rows_of

HEADERS = CONSUMER_SCHEMA.field("headers").type


def test_the_last_header_of_the_name_counts_even_when_an_earlier_one_is_valid() -> None:
    lists = [
        [],
        [{"key": "v", "value": b"1"}, {"key": "v", "value": b"2"}],
        [{"key": "v", "value": b"1"}, {"key": "v", "value": None}],
        [{"key": "w", "value": b"3"}],
        [{"key": "v", "value": b"4"}, {"key": "w", "value": b"5"}],
    ]
    array = pa.array(lists, HEADERS)
    assert last_header_values(array, "v").to_pylist() == [None, b"2", None, None, b"4"]
    assert last_header_values(array.slice(1, 3), "v").to_pylist() == [b"2", None, None]
    assert last_header_values(pa.chunked_array([array.slice(0, 2), array.slice(2)]), "w").to_pylist() == [
        None, None, None, b"3", b"5"]
    assert last_header_values(pa.array([[], []], HEADERS), "v").to_pylist() == [None, None]


def _records(rng: random.Random, n: int, keys: int = 8) -> pa.Table:
    rows = []
    for offset in range(n):
        headers = []
        if rng.random() < 0.7:
            headers.append({"key": "v", "value": struct.pack(">q", rng.randint(-3, 3))})
        elif rng.random() < 0.5:
            headers.append({"key": "v", "value": b"xx"})
        rows.append({"offset": offset, "timestamp": 1000 + rng.randint(-3, 3),
                     "key": f"k{rng.randrange(keys)}".encode(),
                     "value": None if rng.random() < 0.2 else rng.randbytes(3), "headers": headers})
    return pa.Table.from_pylist(rows, schema=CONSUMER_SCHEMA)


def test_table_rows_follow_the_reference_rule_from_the_first_fresh_offset() -> None:
    rng = random.Random(7)
    for strategy in CompactionStrategy:
        schema = table_schema(strategy)
        for trial in range(20):
            records = _records(rng, rng.randint(0, 40), rng.choice([8, 1 << 20]))  # many keys: each record its own
            from_offset = rng.choice([0, 10, 30])
            split = rng.randint(0, records.num_rows)
            rows = table_rows_of([records.slice(0, split), records.slice(split)], 3, from_offset, strategy, "v",
                                 schema)
            assert rows.schema == schema
            best: dict[bytes, tuple[tuple[int, int, int], dict]] = {}
            fresh: set[bytes] = set()
            for r in records.to_pylist():
                if strategy is CompactionStrategy.OFFSET:
                    has, version = 0, 0
                elif strategy is CompactionStrategy.TIMESTAMP:
                    has, version = 1, r["timestamp"]
                else:
                    named = [h["value"] for h in r["headers"] if h["key"] == "v"]
                    has, version = header_version(named[-1] if named else None)
                rank = (has, version, r["offset"])
                if r["key"] not in best or rank > best[r["key"]][0]:
                    best[r["key"]] = (rank, r)
                if r["offset"] >= from_offset:
                    fresh.add(r["key"])
            want = []
            for key in fresh:
                rank, r = best[key]
                if r["value"] is None:
                    continue
                row = {"key": key, "value": r["value"], "partition": 3, "offset": r["offset"],
                       "timestamp": r["timestamp"], "headers": r["headers"]}
                if strategy is not CompactionStrategy.OFFSET:
                    row["version"] = rank[1] if rank[0] else None
                want.append(row)
            assert rows.to_pylist() == sorted(want, key=lambda row: row["offset"]), (strategy, trial)
