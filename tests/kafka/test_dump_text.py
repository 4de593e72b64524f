"""`kcompact dump` prints what Kafka's kafka-dump-log prints (`kafka.tools.DumpLogSegments`, the referee), line for
line: stdout for every kind of file both read, and the stderr report of non-consecutive offsets.

The files: a generated log dir as a broker writes it (every codec, transactions and their markers, tombstones,
idempotent producers' sequences), kcompact's tiered copy, its compaction and a second compaction past the delete
horizon (gaps, emptied batches, delete horizons), and a few files made to reach the rarer lines: a producer snapshot
whose entries lack batch metadata or wrap their sequence, empty and preallocated files, records whose bytes are
not UTF-8 and sequences past Integer.MAX_VALUE.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import compaction
from compaction.cli import main
from compaction.config import CleanupPolicy, KcompactConfig, TopicConfig
from compaction.format.batch import Header, Record, build_batch, encode_batch
from compaction.format.producer_snapshot import ProducerStateEntry, encode_producer_snapshot
from compaction.generate.topics import TopicSpec
from compaction.generate.workload import WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.tier import tier_logdir
from tests.kafka_dump import materialise_partition
from tests.kafka_runtime import run_tool

DAY = 86_400_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=2500, keys=120, segment_bytes=40 * 1024,
                    index_interval_bytes=1024, tombstone_ratio=0.1, seed=41)
NOW = SPEC.start_ms + SPEC.records_per_partition * SPEC.ms_per_record + 60_000
_KINDS = (".log", ".index", ".timeindex", ".txnindex", ".snapshot")  # what DumpLogSegments reads


def _made(d: Path) -> list[Path]:
    """Files for the lines a workload rarely reaches."""
    d.mkdir(parents=True)
    records = [Record(900, 5, b"\xff\xfek", b"caf\xc3\xa9 \xe2\x82", (Header("h", None), Header("\xe9", b"x"))),
               Record(901, 6, None, None, ())]
    batch = build_batch(records, producer_id=4, producer_epoch=0, base_sequence=2**31 - 1, partition_leader_epoch=3)
    (d / "00000000000000000900.log").write_bytes(encode_batch(batch))
    # indexes as a broker preallocates them: an entry, then zeros (Kafka stops at the first zero entry)
    (d / "00000000000000000900.index").write_bytes(struct.pack(">ii", 1, 0) + bytes(8 * 3))
    (d / "00000000000000000900.timeindex").write_bytes(struct.pack(">qi", 6, 1) + bytes(12 * 3))
    (d / "00000000000000000901.snapshot").write_bytes(encode_producer_snapshot([
        ProducerStateEntry(7, 3, 5, -1, 0, 1234, 2, -1),  # no last offset: no batch metadata
        ProducerStateEntry(8, 1, 2, 50, 4, 999, -1, 40),  # first sequence wraps back past 0, a transaction open
    ]))
    for suffix in (".log", ".index", ".timeindex", ".txnindex"):
        (d / f"00000000000000000000{suffix}").write_bytes(b"")
    return sorted(d.iterdir())


@pytest.fixture(scope="module")
def files(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("dump-text")
    generate_logdir(root / "logs", SPEC)
    written = sorted((root / "logs" / "orders-0").iterdir())
    store = open_store(str(root / "store"))
    assert [r.error for r in tier_logdir(root / "logs", store, table_in_store(store, create=True), NOW)] == [None]
    written += materialise_partition(store, "orders", 0, root / "tiered")
    config = KcompactConfig(topics={"orders": TopicConfig(cleanup_policy=frozenset({CleanupPolicy.COMPACT}),
                                                          min_cleanable_dirty_ratio=0.01)})
    assert compaction.compact(spark, store, config, NOW).exit_code == 0
    written += materialise_partition(store, "orders", 0, root / "compacted")
    assert compaction.compact(spark, store, config, NOW + 2 * DAY, force=True).exit_code == 0  # past the horizon
    written += materialise_partition(store, "orders", 0, root / "past-horizon")
    written += _made(root / "made")
    return [f for f in written if f.suffix in _KINDS]


def _blocks(stderr: str) -> dict[str, list[str]]:
    """The non-consecutive offsets report per file (Kafka prints its files in hash-map order)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stderr.splitlines():
        if line.startswith("Non-consecutive offsets in "):
            current = blocks.setdefault(line, [])
        else:
            current.append(line)
    return blocks


@pytest.mark.parametrize(("kafka_flag", "kcompact_flags"), [("--deep-iteration", []),
                                                             ("--print-data-log", ["--print-data"])])
def test_kcompact_dump_prints_what_kafkas_dump_log_segments_prints(
        files: list[Path], capsys: pytest.CaptureFixture[str], kafka_flag: str, kcompact_flags: list[str]) -> None:
    assert {f.suffix for f in files} == set(_KINDS)
    kafka = run_tool("kafka.tools.DumpLogSegments", [kafka_flag, "--files", ",".join(map(str, files))])
    capsys.readouterr()
    assert main(["dump", *kcompact_flags, *map(str, files)]) == 0
    ours = capsys.readouterr()
    assert ours.out.count("| offset: ") > SPEC.records_per_partition  # every record of the broker's log, and more
    mismatches = [(theirs, mine) for theirs, mine in zip(kafka.stdout.splitlines(), ours.out.splitlines(),
                                                         strict=False) if theirs != mine]
    assert not mismatches, mismatches[:3]
    assert ours.out == kafka.stdout
    gaps = _blocks(kafka.stderr)
    assert len(gaps) >= 2 and _blocks(ours.err) == gaps  # the compactions' logs have gaps; the broker's have none
