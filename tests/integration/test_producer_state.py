"""Active producers and open transactions: from the last segment's snapshot, else replayed from the tier.

`kcompact tier` uploads a snapshot with every segment (built by replay when the log dir has none), so the
replay path is reached here by leaving the snapshot objects out of the segments' rows, as a store tiered by
another tool would have them.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import ObjectSuffix, SegmentMetadata, table_in_store
from compaction.producers import producer_state
from compaction.run.plan import first_unstable_offsets
from compaction.storage import open_store
from compaction.tier import tier_logdir

NOW = 1_800_000_000_000


def without_snapshot(segment: SegmentMetadata) -> SegmentMetadata:
    return replace(segment, object_keys=tuple(o for o in segment.object_keys
                                              if o.suffix is not ObjectSuffix.PRODUCER_SNAPSHOT))


def test_replay_from_the_tier_matches_the_snapshot(tmp_path: Path) -> None:
    spec = WorkloadSpec(topics=(TopicSpec("t", 2),), records_per_partition=3000, keys=100,
                        segment_bytes=32 * 1024, transactional_ratio=0.5, seed=12)
    generate_logdir(tmp_path / "with", spec)
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    for snap in (tmp_path / "without").rglob("*.snapshot"):
        snap.unlink()
    stores = {}
    for name in ("with", "without"):
        store = open_store(str(tmp_path / f"store-{name}"))
        tier_logdir(tmp_path / name, store, table_in_store(store, create=True), NOW)
        stores[name] = store
    for partition in (0, 1):
        views = {}
        for name, store in stores.items():
            live = table_in_store(store).live_segments("t", partition)
            if name == "without":
                live = tuple(without_snapshot(s) for s in live)
            assert (live[-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT) is None) == (name == "without")
            views[name] = sorted((e.producer_id, e.producer_epoch, e.last_offset, e.current_txn_first_offset)
                                 for e in producer_state(store, live))
        assert views["with"] == views["without"]
        assert views["with"], "the workload has idempotent and transactional producers"
    unstable = {name: first_unstable_offsets(store, table_in_store(store).snapshot()) for name, store in stores.items()}
    assert unstable["with"] == unstable["without"]
