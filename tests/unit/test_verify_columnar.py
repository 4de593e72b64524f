"""The Spark path's per-segment columns against the reference decoder, on generated segments (every codec,
headers, idempotent and transactional producers, aborted transactions, tombstones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction.config import CompactionStrategy
from compaction.format.segment import iter_batch_headers, iter_batches
from compaction.generate.workload import VERSION_HEADER, PartitionTruth, TopicSpec, WorkloadSpec, generate_logdir
from compaction.reader import open_transactions
from compaction.verify import Ranking
from compaction.verify.columnar import carried_tombstones, open_transactions_after, txn_summary, view_rows


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PartitionTruth]:
    root = tmp_path_factory.mktemp("columnar")
    spec = WorkloadSpec(topics=(TopicSpec("t", 1),), records_per_partition=2500, keys=150, segment_bytes=24 * 1024,
                        transactional_ratio=0.5, tombstone_ratio=0.1, seed=21)
    [truth] = generate_logdir(root, spec)
    return root / "t-0", truth


def segments(part: Path) -> list[bytes]:
    return [log.read_bytes() for log in sorted(part.glob("*.log"))]


@pytest.mark.parametrize("ranking", [Ranking(), Ranking(CompactionStrategy.TIMESTAMP),
                                     Ranking(CompactionStrategy.HEADER, VERSION_HEADER)], ids=str)
def test_view_rows_are_the_records_a_consumer_may_receive(generated: tuple[Path, PartitionTruth],
                                                          ranking: Ranking) -> None:
    part, truth = generated
    aborted = [(t.producer_id, t.first_offset, t.last_offset) for t in truth.aborted]
    assert aborted, "the workload must abort transactions"
    below = truth.log_end_offset * 3 // 4
    header = ranking.header if ranking.strategy is CompactionStrategy.HEADER else None
    with_headers = 0
    for data in segments(part):
        rows, _summary = view_rows(data, obj="seg", strategy=ranking.strategy, header=header, aborted=aborted,
                                   below=below)
        expected = [
            (r.offset, r.timestamp, r.key, r.value, [(h.key.encode(), h.value) for h in r.headers],
             ranking.rank(r), b.producer_id, b.base_offset if b.is_transactional else None)
            for _pos, b in iter_batches(data) if not b.is_control
            and not any(pid == b.producer_id and first <= b.base_offset <= last for pid, first, last in aborted)
            for r in b.records if r.offset < below
        ]
        got = [
            (r["offset"], r["timestamp"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]],
             (r["has_version"], r["version"], r["offset"]), r["producer_id"], r["txn_base"])
            for r in rows.to_pylist()
        ]
        assert got == expected
        with_headers += sum(bool(g[4]) for g in got)
    assert with_headers > 0


def test_open_transactions_fold_over_segments_like_the_reader(generated: tuple[Path, PartitionTruth]) -> None:
    part, _truth = generated
    logs = segments(part)
    open_at_a_roll = 0
    for end in range(1, len(logs) + 1):
        batches = [b for data in logs[:end] for _pos, b in iter_batches(data)]
        summaries = [txn_summary(iter_batch_headers(data)) for data in logs[:end]]
        assert open_transactions_after(summaries) == open_transactions(batches)
        open_at_a_roll += bool(open_transactions(batches))
    assert open_at_a_roll, "some transaction must span a roll"


def test_carried_tombstones_are_the_keyed_tombstones_with_their_horizon(
        generated: tuple[Path, PartitionTruth]) -> None:
    part, _truth = generated
    for data in segments(part):
        expected = [(r.key, r.offset, b.delete_horizon_ms) for _pos, b in iter_batches(data) if not b.is_control
                    for r in b.records if r.value is None and r.key is not None]
        got = [(r["key"], r["offset"], r["horizon_ms"]) for r in carried_tombstones(data, obj="seg").to_pylist()]
        assert got == expected
