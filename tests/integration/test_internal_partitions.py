"""A real broker's log dir holds Kafka's own partitions beside the topics' (`__cluster_metadata-0`, the
coordinators' `__consumer_offsets-N` and `__transaction_state-N`): `kcompact tier` and `kcompact wal upload` leave
them alone and say so (tests/kafka/test_broker_input.py runs both on a real broker's log dir)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.tier.logdir import internal_partitions, partitions
from compaction.wal.table import WalTable
from tests.tiered_logdir import generated_logdir

NOW = 1_800_000_000_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=1500, keys=100,
                    segment_bytes=30 * 1024, seed=3)
INTERNAL = ["__cluster_metadata-0", "__consumer_offsets-0", "__transaction_state-0"]


@pytest.fixture
def broker_like_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated log dir plus copies of its partition named as Kafka's internal ones (several segments each, so
    there would be something to tier), and the broker's checkpoint files."""
    logdir = generated_logdir(tmp_path_factory, "broker-like", SPEC)
    for name in INTERNAL:
        shutil.copytree(logdir / "orders-0", logdir / name)
    (logdir / "cleaner-offset-checkpoint").write_text("0\n0\n")
    (logdir / "meta.properties").write_text("version=1\n")
    return logdir


def test_tier_and_wal_upload_skip_kafkas_internal_partitions_and_name_them(
        broker_like_logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert [p.directory.name for p in partitions(broker_like_logdir)] == ["orders-0"]
    assert internal_partitions(broker_like_logdir) == INTERNAL
    store_path = str(tmp_path / "store")

    assert main(["tier", "--logdir", str(broker_like_logdir), "--store", store_path, "--now", str(NOW)]) == 0
    err = capsys.readouterr().err
    assert "skipped Kafka's internal partitions" in err and all(name in err for name in INTERNAL)
    store = open_store(store_path)
    tiered = table_in_store(store).snapshot().partitions
    assert {(tp.topic, tp.partition) for tp in tiered} == {("orders", 0)}

    assert main(["wal", "upload", "--logdir", str(broker_like_logdir), "--store", store_path,
                 "--now", str(NOW)]) == 0
    err = capsys.readouterr().err
    assert all(name in err for name in INTERNAL)
    objects = WalTable.in_store(store).objects()
    assert objects and {e.topic for o in objects for e in o.entries} == {"orders"}
