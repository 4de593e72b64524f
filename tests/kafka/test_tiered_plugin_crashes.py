"""Nothing the broker writes through kcompact's plugin is lost when the broker, or the metadata process it runs,
dies in the middle of tiering a segment.

Kafka tiers a segment in three steps (`RemoteLogManager.copyLogSegment`): addRemoteLogSegmentMetadata
(COPY_SEGMENT_STARTED), copyLogSegmentData (the objects), updateRemoteLogSegmentMetadata (COPY_SEGMENT_FINISHED).
The plugin holds the add in the broker and commits the whole copy at its finish, one `copy` request. The broker's
metadata process here is `tests.kafka.metadata_crash_point`, which holds one armed call in flight forever, so each
test stops the broker, or the process, at a known step:

- the broker is killed (SIGKILL, its process group) after the objects were written, before its copy's commit, and
  restarted: it tiers the segment again under a new id, consumers get every record, no row names the abandoned copy,
  and its objects stay until `kcompact gc` deletes them as orphans after the orphan grace;
- the metadata process is killed while the broker's `copy` waits for it, before or after its commit: that call fails
  (RemoteStorageException), the next starts a new process, and the broker tiers on with nothing lost. A copy killed
  before its commit left no row; one killed after it is live, and the broker's copy of the same segment again (Kafka
  saw the first fail) is superseded by it.

One broker on a local store serves the module (the S3 path is `test_tiered_plugin_s3.py`'s); the tests run in file
order.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compaction.metadata import SegmentMetadata, SegmentState
from compaction.remote_log_metadata import new_segment
from compaction.storage import open_store
from tests.kafka.tiered import (
    Tier,
    Writer,
    create_tiered_topic,
    local_log_start,
    plugin_overrides,
    read_all,
    tier_settled,
    wait_for,
)
from tests.kafka_runtime import ROOT, KafkaBroker

GRACE_MS = 1000


@dataclass
class CrashTier(Tier):
    """The module's broker, and the directory where a test arms the metadata process's crash point."""

    crash_dir: Path = Path()

    def arm(self, point: str) -> None:
        (self.crash_dir / "reached").unlink(missing_ok=True)
        (self.crash_dir / "armed").write_text(point)

    def reached(self) -> dict[str, Any]:
        """Produces until the armed call is in flight; the request it holds."""
        assert self.writer is not None
        reached = self.crash_dir / "reached"
        wait_for("the armed call is in flight", lambda: reached.is_file() and reached.stat().st_size > 0,
                 self.broker, step=lambda: self.writer.updates(30) if self.writer else None)
        return dict(json.loads(reached.read_text()))

    def segment(self, segment_id: str) -> SegmentMetadata | None:
        return next((s for s in self.partition().segments if s.segment_id == segment_id), None)

    def settled(self) -> None:
        wait_for("the broker tiered everything and its active segment is empty", lambda: tier_settled(self),
                 self.broker)


@pytest.fixture(scope="module")
def crash_tier(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashTier]:
    workdir = tmp_path_factory.mktemp("tiered-crashes")
    crash_dir = workdir / "crash"
    crash_dir.mkdir()
    python = workdir / "python"  # what the plugin runs as `<python> -m compaction.remote_log_metadata ARGS`
    python.write_text(f"#!/bin/sh\nshift 2\nPYTHONPATH={ROOT} exec {sys.executable} "
                      f"-m tests.kafka.metadata_crash_point --crash-dir {crash_dir} \"$@\"\n")
    python.chmod(0o755)
    store = open_store(str(workdir / "store"))
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=plugin_overrides(store, str(python)))
    broker.start()
    tier = CrashTier(broker, store, [], crash_dir=crash_dir)
    try:
        create_tiered_topic(broker)
        tier.writer = Writer(tier)
        wait_for("the broker tiered 2 segments and deleted them locally",
                 lambda: local_log_start(broker) > 0 and len(tier.live()) >= 2, broker, step=tier.writer.updates)
        yield tier
    finally:
        tier.writer = None  # its producers go before the broker does
        broker.stop()


def test_a_broker_killed_before_its_copy_committed_tiers_again_and_gc_deletes_the_abandoned_objects(
        crash_tier: CrashTier) -> None:
    tier = crash_tier
    tier.arm("copy")
    held = tier.reached()
    abandoned_id = held["segment_id"]
    keys = [o.key for o in new_segment(held).object_keys]
    assert tier.segment(abandoned_id) is None, "nothing of the copy is committed before its finish"
    assert all(tier.store.exists(k) for k in keys), "the objects were written"

    tier.broker.kill()
    tier.broker.start()
    tier.settled()
    assert read_all(tier.broker, len(tier.uncompacted())) == tier.uncompacted()
    assert any(s.start_offset <= held["start_offset"] <= s.end_offset for s in tier.live()), "tiered again"
    assert tier.segment(abandoned_id) is None

    kept = tier.cli("gc", "--grace-ms", str(GRACE_MS), "--json")
    assert json.loads(kept.stdout)["totals"]["orphans_deleted"] == 0, kept.stdout
    assert all(tier.store.exists(k) for k in keys), "gc waits out the orphan grace (a day by default)"
    time.sleep(GRACE_MS / 1000 + 0.2)
    swept = tier.cli("gc", "--grace-ms", str(GRACE_MS), "--orphan-grace-ms", str(GRACE_MS), "--json")
    assert json.loads(swept.stdout)["totals"]["orphans_deleted"] >= len(keys), swept.stdout
    assert not any(tier.store.exists(k) for k in keys)
    assert read_all(tier.broker, len(tier.uncompacted())) == tier.uncompacted()


@pytest.mark.parametrize("point", ["copy", "after copy"])
def test_a_metadata_process_killed_mid_call_fails_that_call_and_the_broker_tiers_on(crash_tier: CrashTier,
                                                                                  point: str) -> None:
    tier = crash_tier
    log_before = tier.broker.server_log.read_text(errors="replace")
    tier.arm(point)
    held = tier.reached()
    (process,) = [pid for pid in _children(tier.broker) if b"metadata_crash_point" in _cmdline(pid)]
    os.kill(process, signal.SIGKILL)

    def log() -> str:
        return tier.broker.server_log.read_text(errors="replace")[len(log_before):]

    wait_for("the broker's copy failed", lambda: "(copy, last table version read " in log(), tier.broker)
    assert f"the metadata process exited with {128 + signal.SIGKILL}" in log()
    tier.settled()
    started = [pid for pid in _children(tier.broker) if b"metadata_crash_point" in _cmdline(pid)]
    assert started and process not in started, "a new metadata process serves the broker"
    assert read_all(tier.broker, len(tier.uncompacted())) == tier.uncompacted()
    row = tier.segment(held["segment_id"])
    if point == "copy":
        assert row is None, "the copy never committed"
        return
    assert row is not None and row.state is SegmentState.COPY_SEGMENT_FINISHED, "committed, never answered"
    assert held["segment_id"] in {s.segment_id for s in tier.live()}
    again = [s for s in tier.partition().segments if s.start_offset == row.start_offset and s is not row
             and s.segment_id != row.segment_id]
    assert all(s.state is SegmentState.DELETE_SEGMENT_STARTED for s in again), again


def _children(broker: KafkaBroker) -> list[int]:
    """The processes the broker's JVM started (the plugin's Python processes)."""
    assert broker.process is not None
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == broker.process.pid:
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
