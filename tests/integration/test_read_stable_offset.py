"""read_committed stops at the last stable offset, as a Kafka consumer does (issue 40): nothing at or past the first
offset of the earliest transaction still open at the end of the log, in the tier or in the WAL tail, however many
committed records follow it; read_uncommitted still reads to the log end. Kafka's own broker referees the same rule
in tests/kafka/test_read_stable_offset.py; here, hand-built logs (`tests.scenario_log`) on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from compaction.cli import main
from compaction.format import scan
from compaction.reader import (
    Isolation,
    SegmentRef,
    consumer_batches,
    consumer_read,
    consumer_records,
    last_stable_offset,
    log_refs,
)
from compaction.storage import ObjectStore
from compaction.wal.upload import upload_logdir
from tests.scenario_log import OPEN_IN_TIER, OPEN_IN_WAL, ScenarioLog, consumed, open_transactions_mid_log

NOW = 1_800_000_000_000
COMMITTED = Isolation.READ_COMMITTED


@pytest.fixture
def logs(store: ObjectStore, tmp_path: Path) -> tuple[ScenarioLog, ScenarioLog]:
    return open_transactions_mid_log(store, tmp_path / "logdir", NOW)


def read(store: ObjectStore, log: ScenarioLog, isolation: Isolation, from_offset: int = 0) -> list[tuple[int, bytes]]:
    refs = log_refs(store, log.topic, log.partition)
    return [(r.offset, r.value or b"")
            for r in consumer_records(store, refs, isolation=isolation, from_offset=from_offset)]


def columnar(store: ObjectStore, log: ScenarioLog, isolation: Isolation, from_offset: int = 0
             ) -> list[tuple[int, bytes]]:
    refs = log_refs(store, log.topic, log.partition)
    batches = consumer_batches(store, refs, isolation=isolation, from_offset=from_offset)
    rows = pa.Table.from_batches(list(batches), scan.CONSUMER_SCHEMA).to_pylist()
    return [(r["offset"], r["value"] or b"") for r in rows]


def first_open(log: ScenarioLog, producer: int) -> int:
    return min(b.base_offset for b in log.batches if b.producer_id == producer)


def piece_of(refs: list[SegmentRef], offset: int) -> SegmentRef:
    return next(r for r in refs if r.start_offset <= offset <= r.end_offset)


def test_read_committed_returns_what_a_consumer_does_below_the_open_transaction(
        store: ObjectStore, logs: tuple[ScenarioLog, ScenarioLog]) -> None:
    tiered, in_wal = logs
    for log, producer, in_the_wal in ((tiered, OPEN_IN_TIER, False), (in_wal, OPEN_IN_WAL, True)):
        refs = log_refs(store, log.topic, log.partition)
        stable = first_open(log, producer)
        assert piece_of(refs, stable).wal is in_the_wal
        assert len({r.log_key for r in refs if r.wal}) > 1, "the WAL tail is one object: combine more"
        got = read(store, log, COMMITTED)
        assert got == consumed(log.batches, COMMITTED) == columnar(store, log, COMMITTED)
        assert max(o for o, _v in got) < stable
        assert last_stable_offset(store, refs) == consumer_read(store, refs, 0, COMMITTED).stable_offset == stable
        everything = read(store, log, Isolation.READ_UNCOMMITTED)
        assert everything == consumed(log.batches) == columnar(store, log, Isolation.READ_UNCOMMITTED)
        open_records = {r.offset for b in log.batches if b.producer_id == producer for r in b.records}
        assert open_records <= {o for o, _v in everything}, "read_uncommitted returns the open transaction"
        committed_after = [o for b in log.batches if not b.is_transactional and b.base_offset > stable
                           for o in range(b.base_offset, b.next_offset)]
        assert committed_after, "nothing committed after the open transaction: the test would prove nothing"
    # By hand: orders-0's 4 (aborted by a marker in the WAL) is dropped, 5 (committed there) kept; 6 is the LSO.
    assert [o for o, _v in read(store, tiered, COMMITTED)] == [0, 1, 2, 5]
    assert [o for o, _v in read(store, in_wal, COMMITTED)] == [0, 1, 4, 5]


def test_a_read_from_the_last_stable_offset_or_past_it_returns_nothing(
        store: ObjectStore, logs: tuple[ScenarioLog, ScenarioLog], capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--endpoint-url", store.spec.endpoint_url] if store.spec.endpoint_url else []
    for log, producer in ((logs[0], OPEN_IN_TIER), (logs[1], OPEN_IN_WAL)):
        stable, end = first_open(log, producer), log.next_offset
        refs = log_refs(store, log.topic, log.partition)
        wal_start = min(r.start_offset for r in refs if r.wal)
        for from_offset in sorted({stable, stable + 1, wal_start, end - 1, end}):
            if from_offset >= stable:
                assert read(store, log, COMMITTED, from_offset) == [], from_offset
                assert columnar(store, log, COMMITTED, from_offset) == [], from_offset
            assert read(store, log, Isolation.READ_UNCOMMITTED, from_offset) == consumed(
                log.batches, Isolation.READ_UNCOMMITTED, from_offset)
        for from_offset in range(stable):
            assert read(store, log, COMMITTED, from_offset) == consumed(log.batches, COMMITTED, from_offset)
        args = ["read", "--store", store.uri, *endpoint, "--topic", log.topic, "--partition", str(log.partition),
                "--isolation", "read_committed"]
        assert main([*args, "--from-offset", str(stable)]) == 0
        assert capsys.readouterr().out == ""
        assert main(args) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [json.loads(line)["offset"] for line in lines] == [o for o, _v in consumed(log.batches, COMMITTED)]


def test_the_held_back_records_appear_once_the_transaction_ends(
        store: ObjectStore, logs: tuple[ScenarioLog, ScenarioLog], tmp_path: Path) -> None:
    """orders-0's open transaction commits, orders-1's aborts, both in the WAL tail: the read goes on to the log end,
    with the committed one's records and without the aborted one's."""
    tiered, in_wal = logs
    tiered.commit(OPEN_IN_TIER)
    tiered.record(15, b"after")
    in_wal.abort(OPEN_IN_WAL)
    in_wal.record(30, b"after")
    for log in logs:
        log.write(tmp_path / "logdir")
    assert upload_logdir(tmp_path / "logdir", store, NOW + 1, max_object_bytes=400).exit_code == 0
    for log, producer, kept in ((tiered, OPEN_IN_TIER, True), (in_wal, OPEN_IN_WAL, False)):
        refs = log_refs(store, log.topic, log.partition)
        assert last_stable_offset(store, refs) == log.next_offset
        got = read(store, log, COMMITTED)
        assert got == consumed(log.batches, COMMITTED) == columnar(store, log, COMMITTED)
        assert got[-1][0] == log.next_offset - 1
        ended = {r.offset for b in log.batches if b.producer_id == producer and not b.is_control for r in b.records}
        seen = {o for o, _v in got}
        assert ended <= seen if kept else not ended & seen
