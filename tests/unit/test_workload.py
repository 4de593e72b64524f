"""The generated log dir is real Kafka: kafka-python decodes it, indexes follow Kafka's rule, all features appear."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.format.codecs import Codec
from compaction.format.indexes import build_indexes, read_txn_index, verify_indexes
from compaction.format.producer_snapshot import read_producer_snapshot
from compaction.format.scan import scan_segment
from compaction.format.segment import iter_batches
from compaction.generate import PartitionTruth, TopicSpec, WorkloadSpec, generate_logdir

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

SPEC = WorkloadSpec(topics=(TopicSpec("orders", 2),), records_per_partition=3000, keys=300,
                    segment_bytes=48 * 1024, seed=5)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[PartitionTruth]]:
    root = tmp_path_factory.mktemp("logdir")
    return root, generate_logdir(root, SPEC)


def test_kafka_python_decodes_every_generated_segment(logdir: tuple[Path, list[PartitionTruth]]) -> None:
    root, _ = logdir
    for log in sorted(root.glob("*/*.log")):
        data = log.read_bytes()
        ours = [(r.offset, r.key, r.value) for _p, b in iter_batches(data) for r in b.records if not b.is_control]
        theirs = []
        records = MemoryRecords(data)
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc(), log
            if not batch.is_control_batch:
                theirs.extend((r.offset, r.key, r.value) for r in batch)
        assert ours == theirs


def test_scan_agrees_with_reference_on_generated_segments(logdir: tuple[Path, list[PartitionTruth]]) -> None:
    root, _ = logdir
    for log in sorted(root.glob("orders-0/*.log")):
        data = log.read_bytes()
        table = scan_segment(data, header_key="version").records.to_pydict()
        ref = [(r.offset, r.timestamp, r.key) for _p, b in iter_batches(data) for r in b.records]
        assert list(zip(table["offset"], table["timestamp"], table["key"], strict=True)) == ref


def test_workload_has_every_feature(logdir: tuple[Path, list[PartitionTruth]]) -> None:
    _, truths = logdir
    batches = [b for t in truths for b in t.batches]
    assert {b.codec for b in batches} == set(Codec)
    assert any(b.is_control for b in batches)
    assert any(r.value is None for b in batches if not b.is_control for r in b.records)
    assert any(b.producer_id >= 0 and not b.is_transactional for b in batches)
    assert all(len(t.segment_bases) > 3 for t in truths)
    assert all(t.aborted for t in truths)
    assert len({b.partition_leader_epoch for b in truths[0].batches}) > 1
    assert any(r.timestamp < prev.timestamp for b in batches for prev, r in zip(b.records, b.records[1:], strict=False))


def test_indexes_follow_kafka_rule_and_txn_index_matches_truth(logdir: tuple[Path, list[PartitionTruth]]) -> None:
    root, truths = logdir
    truth = truths[0]
    carried: dict[int, int] = {}
    rebuilt = []
    for base in truth.segment_bases:
        log = (root / "orders-0" / f"{base:020d}.log").read_bytes()
        index = (root / "orders-0" / f"{base:020d}.index").read_bytes()
        tindex = (root / "orders-0" / f"{base:020d}.timeindex").read_bytes()
        assert verify_indexes(log, base, index, tindex)
        built = build_indexes(log, base, SPEC.index_interval_bytes, txn_first_offsets=carried)
        assert (built.offset_index, built.time_index) == (index, tindex)
        carried = dict(built.open_txns)
        if built.txn_index:
            rebuilt.extend(read_txn_index(built.txn_index))
    on_disk = [t for p in sorted((root / "orders-0").glob("*.txnindex")) for t in read_txn_index(p.read_bytes())]
    assert on_disk == truth.aborted
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in rebuilt] == [
        (t.producer_id, t.first_offset, t.last_offset) for t in truth.aborted
    ]


def test_snapshots_at_every_roll(logdir: tuple[Path, list[PartitionTruth]]) -> None:
    root, truths = logdir
    for base in truths[0].segment_bases[1:]:
        entries = read_producer_snapshot((root / "orders-0" / f"{base:020d}.snapshot").read_bytes())
        assert all(e.last_offset < base for e in entries)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    spec = WorkloadSpec(topics=(TopicSpec("t", 1),), records_per_partition=500, seed=9)
    generate_logdir(tmp_path / "a", spec)
    generate_logdir(tmp_path / "b", spec)
    for f in sorted((tmp_path / "a").rglob("*")):
        if f.is_file():
            assert f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes(), f


def test_cli_generate_and_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--logdir", str(tmp_path), "--topics", "t:1", "--records", "300", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"partition": 0' in out
    log = tmp_path / "t-0" / "00000000000000000000.log"
    assert main(["dump", str(log), "--print-data"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Dumping {log}") and "| offset: 0 " in text and "payload:" in text
    assert main(["dump", "--json", str(tmp_path / "t-0" / "leader-epoch-checkpoint")]) == 0
    assert '"epoch": 0' in capsys.readouterr().out


def test_cli_dump_of_corrupt_file_exits_3_naming_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["generate", "--logdir", str(tmp_path), "--topics", "t:1", "--records", "300"])
    log = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(log.read_bytes())
    data[16] = 7
    log.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["dump", str(log)]) == 3
    assert f"{log}, byte 16" in capsys.readouterr().err
    index = tmp_path / "t-0" / "00000000000000000000.index"
    index.write_bytes(index.read_bytes()[:-3])
    assert main(["dump", str(index)]) == 3


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _timestamps(part: Path) -> list[int]:
    return [r.timestamp for log in sorted(part.glob("*.log")) for _p, b in iter_batches(log.read_bytes())
            if not b.is_control for r in b.records]


CLOCK = 1_795_000_000_000
SMALL = ["--topics", "t:1", "--records", "300", "--keys", "50", "--seed", "4"]


def test_cli_stamps_records_up_to_its_clock(tmp_path: Path) -> None:
    assert main(["generate", "--logdir", str(tmp_path / "cli"), *SMALL, "--now", str(CLOCK)]) == 0
    spec = WorkloadSpec(topics=(TopicSpec("t", 1),), records_per_partition=300, keys=50, seed=4).ending_at(CLOCK)
    assert spec.start_ms == CLOCK - 300 * 50
    generate_logdir(tmp_path / "api", spec)
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    stamps = _timestamps(tmp_path / "cli" / "t-0")
    assert CLOCK in stamps  # the 300th record, unless it happened to be written out of order
    assert min(stamps) > CLOCK - 300 * 50 - 60_000 and max(stamps) < CLOCK + 60_000  # an open txn's tail at most


def test_cli_start_ms_pins_the_first_record_whatever_the_clock(tmp_path: Path) -> None:
    assert main(["generate", "--logdir", str(tmp_path / "cli"), *SMALL, "--start-ms", "1700000000000"]) == 0
    generate_logdir(tmp_path / "api", WorkloadSpec(topics=(TopicSpec("t", 1),), records_per_partition=300, keys=50,
                                                   seed=4, start_ms=1_700_000_000_000))
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--logdir", str(tmp_path / "x"), *SMALL, "--start-ms", "1", "--now", "2"])
    assert exc.value.code == 2


def test_cli_clock_defaults_to_the_wall_clock(tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    assert main(["generate", "--logdir", str(tmp_path), *SMALL]) == 0
    after = int(time.time() * 1000)
    stamps = _timestamps(tmp_path / "t-0")
    assert before - 300 * 50 - 60_000 < min(stamps) and before <= max(stamps) < after + 60_000
