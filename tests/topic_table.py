"""What the topic table must hold, computed plainly from the records a test wrote, and the table as read back.

`RandomProducer` appends random batches to a `ScenarioLog`: plain records (some tombstones, timestamps out of
order, a version header that may be missing or malformed), transactions that commit or abort, and a
transaction left open across a tiering. `expected_rows` decides from the log's own batches, not from the
reader, what a read_committed consumer of the tiered offsets below the last stable offset ends up with per key
under a strategy (`tests.latest_view.Strategy.rank`), tombstone winners dropped. `table_rows` reads the Delta
table with delta-rs into pyarrow, as a user would (`DeltaTable.scan`); `duckdb_rows` with DuckDB's delta extension.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from compaction.format.batch import Record, RecordBatch
from compaction.format.control import ControlType, batch_control_type
from compaction.format.record import Header
from tests.latest_view import Strategy
from tests.scenario_log import ScenarioLog

VERSION_HEADER = "v"
Row = tuple[int, bytes, bytes, int, int, tuple[tuple[str, bytes | None], ...], int | None]
"""partition, key, value, offset, timestamp, headers, version (None under offset or when the record has none)."""


@dataclass
class RandomProducer:
    """Random appends to one partition's log (see the module docstring); `tiered_end` is what tiering copied."""

    log: ScenarioLog
    rng: random.Random
    keys: int = 10
    open_pid: int | None = None
    next_pid: int = 1000
    tiered_end: int = 0
    sequences: dict[int, int] = field(default_factory=dict)

    def _record(self, offset: int) -> Record:
        rng = self.rng
        value = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 6))
        headers: list[Header] = []
        shape = rng.random()
        if shape < 0.7:
            headers.append(Header(VERSION_HEADER, struct.pack(">q", rng.randint(-3, 3))))
        elif shape < 0.8:
            headers.append(Header(VERSION_HEADER, b"xx"))
        if rng.random() < 0.3:
            headers.append(Header("h", rng.randbytes(2)))
        ts = self.log.timestamp + rng.randint(-3, 3) * 1000
        return Record(offset, ts, f"k{rng.randrange(self.keys)}".encode(), value, tuple(headers))

    def _batch(self, **fields: object) -> RecordBatch:
        start = self.log.next_offset
        records = [self._record(start + i) for i in range(self.rng.randint(1, 3))]
        return self.log.append_records(records, **fields)

    def _txn_batch(self, pid: int) -> None:
        seq = self.sequences.get(pid, 0)
        batch = self._batch(producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True)
        self.sequences[pid] = seq + len(batch.records)

    def append(self, batches: int, *, leave_open: bool = False) -> None:
        """`batches` random steps, then roll; with `leave_open`, a transaction stays open across the roll."""
        rng = self.rng
        if self.open_pid is not None:
            self._txn_batch(self.open_pid)
            self.log.marker(ControlType.COMMIT if rng.random() < 0.6 else ControlType.ABORT, self.open_pid)
            self.open_pid = None
        for _ in range(batches):
            self.log.timestamp += 1000
            if rng.random() < 0.65:
                self._batch()
                continue
            pid = self.next_pid
            self.next_pid += 1
            for _ in range(rng.randint(1, 2)):
                self._txn_batch(pid)
            self.log.marker(ControlType.COMMIT if rng.random() < 0.6 else ControlType.ABORT, pid)
        if leave_open:
            self.open_pid = self.next_pid
            self.next_pid += 1
            self._txn_batch(self.open_pid)
            self._batch()  # a plain record above the open transaction: not stable yet
        self.log.roll()
        self.tiered_end = self.log.next_offset


def expected_rows(producers: list[RandomProducer], strategy: Strategy) -> set[Row]:
    """The table a correct run must hold after the logs were tiered to each producer's `tiered_end`."""
    rows: set[Row] = set()
    for p in producers:
        batches = [b for b in p.log.batches if b.last_offset < p.tiered_end]
        outcome: dict[tuple[int, int], ControlType] = {}  # (pid, index of its txn) -> marker
        open_first: dict[int, int] = {}
        txn_of: dict[int, tuple[int, int]] = {}
        counts: dict[int, int] = {}
        for b in batches:
            if not b.is_transactional:
                continue
            n = counts.get(b.producer_id, 0)
            if b.is_control:
                outcome[(b.producer_id, n)] = batch_control_type(b)
                counts[b.producer_id] = n + 1
                open_first.pop(b.producer_id, None)
            else:
                open_first.setdefault(b.producer_id, b.base_offset)
                txn_of[b.base_offset] = (b.producer_id, n)
        stable = min([p.tiered_end, *open_first.values()])
        best: dict[bytes, tuple[tuple[int, int, int], Record]] = {}
        for b in batches:
            if b.is_control:
                continue
            if b.is_transactional and outcome.get(txn_of[b.base_offset]) is not ControlType.COMMIT:
                continue
            for r in b.records:
                if r.offset >= stable or r.key is None:
                    continue
                rank = strategy.rank(r)
                if r.key not in best or rank > best[r.key][0]:
                    best[r.key] = (rank, r)
        for key, (rank, r) in best.items():
            if r.value is None:
                continue
            version = None if strategy.kind.value == "offset" or rank[0] == 0 else rank[1]
            rows.add((p.log.partition, key, r.value, r.offset, r.timestamp,
                      tuple((h.key, h.value) for h in r.headers), version))
    return rows


def table_rows(uri: str, storage_options: dict[str, str] | None = None) -> set[Row]:
    """The table as delta-rs's own reader hands it to pyarrow (`DeltaTable.scan`, which applies deletion vectors);
    fails on a key that has two rows in one partition."""
    import pyarrow as pa

    return _rows(pa.table(DeltaTable(uri, storage_options=storage_options).scan()).to_pylist())


def _rows(data: list[dict[str, Any]]) -> set[Row]:
    """The table's rows as `Row`s; fails on a key that has two rows in one partition."""
    rows = {(d["partition"], d["key"], d["value"], d["offset"], d["timestamp"],
             tuple((h["key"], h["value"]) for h in d["headers"]), d.get("version")) for d in data}
    assert len(rows) == len(data) == len({(d["partition"], d["key"]) for d in data}), "a key has two rows"
    return rows


def duckdb_rows(uri: str) -> set[Row]:
    """The table as DuckDB reads it with its `delta` extension (delta-kernel-rs; installed from PyPI as
    `duckdb-extension-delta`, since DuckDB's own `INSTALL delta` downloads from a host this machine cannot reach)."""
    import duckdb
    from duckdb_extensions import import_extension

    with duckdb.connect() as con:
        import_extension("delta", con=con)
        con.sql("LOAD delta")
        path = uri.replace("'", "''")
        data = con.sql(f"SELECT * FROM delta_scan('{path}')").to_arrow_table().to_pylist()
    return _rows(data)


__all__ = ["VERSION_HEADER", "RandomProducer", "Row", "duckdb_rows", "expected_rows", "table_rows"]
