"""`kcompact generate --bulk`: real Kafka segments (two decoders agree), the spec's content, Kafka's roll and index
rules, determinism, tiering, and the command line."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.errors import ConfigError
from compaction.format.batch import CURRENT_MAGIC
from compaction.format.checkpoints import EpochEntry, read_leader_epoch_checkpoint, read_partition_metadata
from compaction.format.codecs import Codec
from compaction.format.indexes import build_indexes, verify_indexes
from compaction.format.producer_snapshot import read_producer_snapshot
from compaction.format.segment import iter_batches
from compaction.generate import bulk
from compaction.generate.bulk import generate_bulk_logdir
from compaction.generate.bulk_records import reference_records
from compaction.generate.bulk_report import BulkProgress
from compaction.generate.bulk_spec import BulkSpec
from compaction.generate.topics import TopicSpec, topic_ids
from compaction.metadata import table_in_store
from compaction.reader import consumer_records, segment_ref
from compaction.storage import open_store
from compaction.tier import tier_logdir

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

NOW = 1_800_000_000_000
SPEC = BulkSpec(
    topics=(TopicSpec("bench", 2),),
    records_per_partition=3000,
    keys=2000,
    value_bytes=40,
    records_per_batch=50,
    segment_bytes=16 * 1024,
    tombstone_ratio=0.05,
    update_fraction=0.03,
    seed=11,
)

Rec = tuple[int, int, bytes | None, bytes | None]


def key_id(key: bytes | None) -> int:
    assert key is not None and key.startswith(b"key-") and len(key) == 14
    return int(key[4:])


def read_dir(part: Path, codec: Codec = Codec.NONE) -> tuple[list[Rec], list[int]]:
    """Every record of a partition dir by the reference decoder (CRCs checked), checked against kafka-python."""
    records: list[Rec] = []
    bases = sorted(int(p.stem) for p in part.glob("*.log"))
    for base in bases:
        data = (part / f"{base:020d}.log").read_bytes()
        ours = []
        for _pos, b in iter_batches(data):
            assert (b.producer_id, b.producer_epoch, b.base_sequence, b.partition_leader_epoch) == (-1, -1, -1, 0)
            assert not (b.is_transactional or b.is_control) and b.codec is codec
            assert b.max_timestamp == b.records[-1].timestamp and b.base_timestamp == b.records[0].timestamp
            ours.extend((r.offset, r.timestamp, r.key, r.value) for r in b.records)
            assert all(r.headers == () for r in b.records)
        theirs = []
        batches = MemoryRecords(data)
        while batches.has_next():
            batch = batches.next_batch()
            assert batch.validate_crc() and batch.magic == CURRENT_MAGIC
            theirs.extend((r.offset, r.timestamp, r.key, r.value) for r in batch)
        assert ours == theirs, part
        records.extend(ours)
    return records, bases


@pytest.fixture(scope="module", params=list(Codec), ids=lambda c: c.name.lower())
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BulkSpec]:
    spec = dataclasses.replace(SPEC, codec=request.param)
    root = tmp_path_factory.mktemp(f"bulk-{request.param.name.lower()}")
    summary = generate_bulk_logdir(root, spec)
    assert summary.records == 2 * spec.log_end_offset
    return root, spec


def test_both_decoders_read_exactly_the_spec(generated: tuple[Path, BulkSpec]) -> None:
    root, spec = generated
    for p in range(2):
        records, bases = read_dir(root / f"bench-{p}", spec.codec)
        assert [r[0] for r in records] == list(range(spec.log_end_offset))
        assert records == list(reference_records(spec, "bench", p))
        assert len(bases) >= 3


def test_rolls_indexes_snapshots_and_checkpoints(generated: tuple[Path, BulkSpec]) -> None:
    root, spec = generated
    part = root / "bench-0"
    bases = sorted(int(p.stem) for p in part.glob("*.log"))
    sizes = []
    for i, base in enumerate(bases):
        log = (part / f"{base:020d}.log").read_bytes()
        index, tindex = (part / f"{base:020d}.index").read_bytes(), (part / f"{base:020d}.timeindex").read_bytes()
        assert verify_indexes(log, base, index, tindex)
        built = build_indexes(log, base, spec.index_interval_bytes)
        assert (built.offset_index, built.time_index) == (index, tindex)
        assert index or len(log) <= spec.index_interval_bytes + spec.batch_bound
        batches = [b for _pos, b in iter_batches(log)]
        assert batches[0].base_offset == base and all(b.base_offset % spec.records_per_batch == 0 for b in batches)
        assert len(log) <= spec.segment_bytes
        if i:  # Kafka's rule: rolled only because the next batch did not fit
            assert sizes[-1][0] + batches[0].size > spec.segment_bytes
            assert read_producer_snapshot((part / f"{base:020d}.snapshot").read_bytes()) == []
        sizes.append((len(log), batches[0].size))
    assert not (part / f"{0:020d}.snapshot").exists() and not list(part.glob("*.txnindex"))
    assert read_leader_epoch_checkpoint((part / "leader-epoch-checkpoint").read_bytes()) == [EpochEntry(0, 0)]
    topic_id = topic_ids(spec.topics, spec.seed)["bench"]
    assert read_partition_metadata((part / "partition.metadata").read_bytes()).topic_id == topic_id


def test_sequential_keys_then_clustered_updates() -> None:
    spec = SPEC
    recs = list(reference_records(spec, "bench", 1))
    keys = [key_id(k) for _o, _t, k, _v in recs]
    assert keys[: spec.keys] == list(range(spec.keys))
    assert all(0 <= k < spec.keys for k in keys)
    main_recs = recs[: spec.records_per_partition]
    tombstones = sum(v is None for *_x, v in main_recs)
    assert 0.02 * len(main_recs) < tombstones < 0.09 * len(main_recs)
    assert all(v is None or (len(v) == spec.value_bytes and v.isalnum()) for *_x, v in main_recs)
    updates = recs[spec.records_per_partition :]
    assert len(updates) == round(spec.update_fraction * spec.keys) == 60
    ids = [key_id(k) for _o, _t, k, _v in updates]
    assert ids == list(range(ids[0], ids[0] + 60))  # a contiguous run of distinct ids
    assert all(v is not None and len(v) == spec.value_bytes for *_x, v in updates)
    assert [t for _o, t, _k, _v in recs] == [spec.start_ms + o * spec.ms_per_record for o in range(len(recs))]


def test_uniform_keys_and_random_updates(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, topics=(TopicSpec("u", 1),), key_order="uniform", update_spread="random",
                               update_fraction=0.1, records_per_partition=1500, tombstone_ratio=0.0)
    generate_bulk_logdir(tmp_path, spec)
    records, _ = read_dir(tmp_path / "u-0")
    assert records == list(reference_records(spec, "u", 0))
    keys = [key_id(k) for _o, _t, k, _v in records[: spec.records_per_partition]]
    assert keys != sorted(keys) and 1000 < len(set(keys)) < 1500 and max(keys) < spec.keys
    assert all(v is not None for *_x, v in records)
    ids = [key_id(k) for _o, _t, k, _v in records[spec.records_per_partition :]]
    assert len(ids) == len(set(ids)) == 200
    assert sorted(ids) != list(range(min(ids), min(ids) + 200)) and ids != sorted(ids)


def test_edge_cases_empty_values_all_tombstones_still_clock(tmp_path: Path) -> None:
    spec = BulkSpec(topics=(TopicSpec("e", 1), TopicSpec("z", 1)), records_per_partition=700, keys=5000,
                    value_bytes=0, records_per_batch=7, segment_bytes=1000, tombstone_ratio=1.0,
                    ms_per_record=0, update_fraction=0.01)
    generate_bulk_logdir(tmp_path, spec)
    records, bases = read_dir(tmp_path / "e-0")
    assert records == list(reference_records(spec, "e", 0)) and len(records) == 750 and len(bases) > 10
    assert all(v is None for *_x, v in records[:700]) and all(v == b"" for *_x, v in records[700:])
    for base in bases:
        log = (tmp_path / "e-0" / f"{base:020d}.log").read_bytes()
        built = build_indexes(log, base, spec.index_interval_bytes)
        assert built.time_index == (tmp_path / "e-0" / f"{base:020d}.timeindex").read_bytes()
    empty = BulkSpec(topics=(TopicSpec("n", 1),), records_per_partition=0, keys=10)
    generate_bulk_logdir(tmp_path, empty)
    assert sorted(p.name for p in (tmp_path / "n-0").iterdir()) == [
        "00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex",
        "leader-epoch-checkpoint", "partition.metadata"]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_whatever_the_chunking_and_seed_matters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(SPEC, codec=Codec.LZ4, update_spread="random")
    generate_bulk_logdir(tmp_path / "a", spec)
    monkeypatch.setattr(bulk, "CHUNK_BYTES", 5000)  # a kernel call per few batches
    generate_bulk_logdir(tmp_path / "b", spec)
    generate_bulk_logdir(tmp_path / "a2", spec)
    a = _files(tmp_path / "a")
    assert a == _files(tmp_path / "b") == _files(tmp_path / "a2")
    generate_bulk_logdir(tmp_path / "c", dataclasses.replace(spec, seed=12))
    c = _files(tmp_path / "c")
    assert a.keys() == c.keys() and a["bench-0/00000000000000000000.log"] != c["bench-0/00000000000000000000.log"]


def test_rerun_replaces_stale_segments(tmp_path: Path) -> None:
    generate_bulk_logdir(tmp_path, dataclasses.replace(SPEC, records_per_partition=6000, update_fraction=0.0))
    generate_bulk_logdir(tmp_path, SPEC)
    records, _ = read_dir(tmp_path / "bench-0")
    assert records == list(reference_records(SPEC, "bench", 0))


def test_tiered_records_read_back_as_generated(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, topics=(TopicSpec("bench", 1),), codec=Codec.LZ4)
    result = generate_bulk_logdir(tmp_path / "logs", spec).partitions[0]
    store = open_store(str(tmp_path / "store"))
    tiered = tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW)
    assert [r.error for r in tiered] == [None]
    refs = [segment_ref(s) for s in table_in_store(store).live_segments("bench", 0)]
    got = [(r.offset, r.timestamp, r.key, r.value) for r in consumer_records(store, refs)]
    active = result.segment_bases[-1]  # the active segment is never tiered
    assert len(refs) == len(result.segment_bases) - 1
    assert got == list(reference_records(spec, "bench", 0))[:active]


def test_cli_bulk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--bulk", "--logdir", str(tmp_path), "--topics", "t:2", "--records", "1200", "--keys", "1000",
            "--value-bytes", "30", "--segment-bytes", "20000", "--codecs", "lz4,zstd", "--update-fraction", "0.02",
            "--update-spread", "random", "--key-order", "uniform", "--seed", "3", "--now", str(NOW), "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 2 * 1220 and doc["segments"] > 2 and [p["updated_keys"] for p in doc["partitions"]] == [
        20, 20]
    spec = BulkSpec(topics=(TopicSpec("t", 2),), records_per_partition=1200, keys=1000, value_bytes=30,
                    segment_bytes=20000, codec=Codec.LZ4, tombstone_ratio=0.03, update_fraction=0.02,
                    update_spread="random", key_order="uniform", seed=3, records_per_batch=100).ending_at(NOW)
    records, _ = read_dir(tmp_path / "t-1", Codec.LZ4)
    assert records == list(reference_records(spec, "t", 1))
    assert records[-1][1] == NOW  # the last record, updates included, is stamped with the clock
    assert main(["generate", "--bulk", "--logdir", str(tmp_path / "x"), "--records", "10", "--keys", "10"]) == 0
    assert "records/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bulk", "--update-fraction", "1.5"], "--update-fraction must be in [0, 1]"),
        (["--bulk", "--update-fraction", "-0.1"], "--update-fraction must be in [0, 1]"),
        (["--bulk", "--keys", "0"], "argument --keys: 0 is below 1"),
        (["--bulk", "--tombstone-ratio", "2"], "--tombstone-ratio must be in [0, 1]"),
        (["--records-per-batch", "0"], "argument --records-per-batch: 0 is below 1"),
        (["--bulk", "--jobs", "0"], "argument --jobs: 0 is below 1"),
        (["--bulk", "--key-skew", "1.2", "--transactional-ratio", "0"], "--key-skew, --transactional-ratio: not with"),
        (["--update-fraction", "0.1"], "--update-fraction: only with --bulk"),
        (["--key-order", "uniform", "--jobs", "2"], "--key-order, --jobs: only with --bulk"),
    ],
)
def test_cli_bad_combinations_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    try:
        code = main(["generate", "--logdir", str(tmp_path), "--topics", "t:1", "--records", "10", *extra])
    except SystemExit as refused:  # argparse: a value outside its option's range
        code = int(str(refused.code))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_spec_validation() -> None:
    with pytest.raises(ConfigError, match="--segment-bytes"):
        BulkSpec(segment_bytes=0)
    with pytest.raises(ConfigError, match="--update-spread"):
        BulkSpec(update_spread="everywhere")
    with pytest.raises(ConfigError, match="2 GiB"):
        BulkSpec(records_per_batch=10**6, value_bytes=10**4)


def test_parallel_jobs_write_the_same_bytes_and_report_progress(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, topics=(TopicSpec("a", 2), TopicSpec("b", 1)), records_per_partition=500)
    seen: list[BulkProgress] = []
    one = generate_bulk_logdir(tmp_path / "one", spec, progress=seen.append, progress_interval_s=0.0)
    assert [(p.topic, p.partition) for p in seen if p.done] == [("a", 0), ("a", 1), ("b", 0)]
    assert all(p.records == p.records_total == spec.log_end_offset for p in seen if p.done)
    assert all(p.records <= p.records_total for p in seen) and "records/s" in seen[-1].line()
    two = generate_bulk_logdir(tmp_path / "two", spec, jobs=2)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    assert [p.to_dict() | {"seconds": 0} for p in one.partitions] == [
        p.to_dict() | {"seconds": 0} for p in two.partitions]
