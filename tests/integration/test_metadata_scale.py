"""What keeps the metadata table's commits and reads from slowing down as its Delta log grows (docs/metadata-table.md):
checked as mechanism, never as timing.

- a checkpoint every `delta.checkpointInterval` (10) commits, so a read replays the checkpoint and at most 9 commits;
- on S3 a read's listing of the log starts after the last checkpoint's version, and a commit lists nothing from the
  log's start (delta-rs's automatic log cleanup, which would, is off): their requests do not grow with the log;
- `upkeep.expire_log` deletes the entries older than `delta.logRetentionDuration` down to the checkpoint every kept
  version needs, gives an older table the settings, and leaves every row as it was.
"""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from compaction.metadata import ChangeSet, MetadataTable, PartitionSnapshot, TopicPartition, commit_current
from compaction.metadata import table as table_module
from compaction.metadata.follower import TableFollower
from compaction.metadata.model import METADATA_SCHEMA, PARTITION_COLUMNS
from compaction.metadata.table import (
    LOG_CONFIGURATION,
    TABLE_NAME,
    WHOLE_FILE_BYTES,
    data_files,
    read_rows,
    table_in_store,
)
from compaction.metadata.upkeep import expire_log, log_files
from tests.factories import TOPIC_ID, new_segment
from tests.moto_s3 import fresh_s3_store
from tests.s3_proxy import FlakyProxy, running_proxy

TOPIC, NOW = "orders", 1_700_000_000_000
INTERVAL = int(LOG_CONFIGURATION["delta.checkpointInterval"])


def one_more(current: PartitionSnapshot) -> ChangeSet:
    """The next segment of the partition, as the broker adds it."""
    top = max((s.end_offset for s in current.segments), default=-1) + 1
    return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="test",
                                  new_segments=[new_segment(top, top + 9, topic=TOPIC, partition=current.partition)],
                                  topic_id=TOPIC_ID)


def commits(table: MetadataTable, n: int, partitions: int = 3) -> None:
    for i in range(n):
        commit_current(table, TopicPartition(TOPIC, i % partitions), NOW, one_more)


def checkpoints(uri: str, options: dict[str, str] | None = None) -> list[int]:
    return [v for v, kind in log_files(uri, options) if kind == "checkpoint"]


def test_checkpoints_at_the_interval_and_commits_never_expire_the_log(tmp_path: Path) -> None:
    table = MetadataTable.create_if_missing(str(tmp_path / "metadata"))
    assert DeltaTable(table.table_uri).metadata().configuration == LOG_CONFIGURATION
    commits(table, 3 * INTERVAL + 4)
    version = table.version()
    found = checkpoints(table.table_uri)
    # delta-rs checkpoints the version after which `interval` commits have been written: 9, 19, 29
    assert found == list(range(INTERVAL - 1, version + 1, INTERVAL))
    assert version - found[-1] < INTERVAL
    assert [v for v, kind in log_files(table.table_uri) if kind == "commit"] == list(range(version + 1))
    assert sum(len(p.segments) for p in table.snapshot().partitions.values()) == 3 * INTERVAL + 4


@pytest.fixture
def counted(moto_endpoint: str) -> Iterator[tuple[FlakyProxy, list[tuple[str, str]]]]:
    """A proxy in front of moto that records every request (method, path with its query)."""
    seen: list[tuple[str, str]] = []
    for proxy in running_proxy(moto_endpoint):
        proxy.fault = lambda method, path, _: seen.append((method, path)) or None
        yield proxy, seen


def _log_requests(seen: list[tuple[str, str]]) -> tuple[list[str], list[int]]:
    """The LISTs of the log (their start-after, '' for none) and the versions of the log entries fetched."""
    lists = [re.search(r"start-after=[^&]*?(\d{20})", p) for m, p in seen if "list-type=2" in p and "_delta_log" in p]
    fetched = [int(m.group(1)) for _, p in seen if (m := re.search(r"_delta_log/(\d{20})\.", p))]
    return [m.group(1) if m else "" for m in lists], fetched


def test_on_s3_reads_and_commits_do_not_list_the_log_from_its_start(
        counted: tuple[FlakyProxy, list[tuple[str, str]]], fake_aws_env: None) -> None:
    proxy, seen = counted
    table = table_in_store(fresh_s3_store(proxy.endpoint, "scale"), create=True)
    commits(table, INTERVAL + 3)
    last = checkpoints(table.table_uri, table.storage_options)[-1]

    seen.clear()
    snapshot = table.partition_snapshot(TOPIC, 0)
    starts, fetched = _log_requests(seen)
    assert starts == [f"{last:020d}"], seen  # one listing, from the last checkpoint on
    assert set(fetched) <= set(range(last, table.version() + 1)) and len(set(fetched)) <= INTERVAL
    assert len(snapshot.segments) == len(range(0, INTERVAL + 3, 3))

    seen.clear()
    commit_current(table, TopicPartition(TOPIC, 1), NOW, one_more)
    starts, _ = _log_requests(seen)
    assert "" not in starts, seen  # no listing of the whole log
    assert collections.Counter(m for m, _ in seen)["PUT"] <= 2 + 2  # a data file and the commit (+ a checkpoint)


def test_expire_log_keeps_what_every_kept_version_needs(tmp_path: Path) -> None:
    table = MetadataTable.create_if_missing(str(tmp_path / "metadata"))
    commits(table, 3 * INTERVAL + 4)
    before = table.snapshot()
    assert expire_log(table).entries_expired == 0  # nothing older than a day
    log = Path(table.table_uri) / "_delta_log"
    two_days_ago = time.time() - 2 * 86_400
    for entry in log.iterdir():  # what delta-rs's cleanup goes by: the entry's modification time
        os.utime(entry, (two_days_ago, two_days_ago))
    commits(table, INTERVAL + 2)
    done = expire_log(table)
    assert done.properties_set == ()
    kept = log_files(table.table_uri)
    version = table.version()
    oldest = kept[0][0]
    assert kept[0] == (oldest, "checkpoint")  # the log starts at a checkpoint ...
    assert oldest <= before.version  # ... at or below every version written inside the retention
    assert len([v for v, kind in kept if kind == "commit"]) <= version - oldest + 1 <= 2 * INTERVAL + 2
    assert done.entries_after == len(kept) < done.entries_before
    assert table.snapshot(before.version).partitions == before.partitions  # time travel inside the window
    assert sum(len(p.segments) for p in table.snapshot().partitions.values()) == 4 * INTERVAL + 6


def test_expire_log_gives_an_older_table_the_settings_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "metadata")
    DeltaTable.create(uri, METADATA_SCHEMA, partition_by=list(PARTITION_COLUMNS), name=TABLE_NAME,
                      configuration={"delta.checkpointInterval": "10"})  # what tables were created with before
    table = MetadataTable.open(uri)
    commits(table, 5)
    assert expire_log(table).properties_set == tuple(sorted(set(LOG_CONFIGURATION) - {"delta.checkpointInterval"}))
    assert DeltaTable(uri).metadata().configuration == LOG_CONFIGURATION
    assert expire_log(table).properties_set == ()
    assert sum(len(p.segments) for p in table.snapshot().partitions.values()) == 5



def test_on_s3_a_read_fetches_each_data_file_whole_in_one_request(
        counted: tuple[FlakyProxy, list[tuple[str, str]]], fake_aws_env: None) -> None:
    """A read of the table's rows fetches each partition's data file in one GET: no HEAD for its size (the log gives
    it), no second GET for its rows after its footer (a round trip per partition each, 1,000 of them for a full read
    at 1,000 partitions)."""
    proxy, seen = counted
    table = table_in_store(fresh_s3_store(proxy.endpoint, "sizes"), create=True)
    commits(table, 8, partitions=8)
    follower = TableFollower(table)
    reads = {"snapshot": (lambda: table.snapshot().partitions, 8),
             "partitions": (lambda: table.partition_snapshots([TopicPartition(TOPIC, p) for p in range(3)]), 3),
             "follower": (lambda: follower.partitions([TopicPartition(TOPIC, p) for p in range(4)]), 4)}
    for read, (rows, expected) in reads.items():
        seen.clear()
        assert len(rows()) == expected
        requests = [(m, p) for m, p in seen if ".parquet" in p and "_delta_log" not in p]
        methods = collections.Counter(m for m, _ in requests)
        files = {p.split("?")[0] for _, p in requests}
        assert len(files) == expected, (read, requests)
        assert methods["HEAD"] == 0 and methods["GET"] == len(files), (read, requests)


def test_on_s3_a_whole_file_read_gives_the_rows_arrow_reads(
        counted: tuple[FlakyProxy, list[tuple[str, str]]], fake_aws_env: None, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """The rows of files fetched whole and decoded in memory are those Arrow's dataset reads (ranged reads, as it
    reads a file above `WHOLE_FILE_BYTES`): every column, the partition columns filled, a row filter applied."""
    proxy, seen = counted
    table = table_in_store(fresh_s3_store(proxy.endpoint, "whole"), create=True)
    commits(table, 12, partitions=4)
    dt = table.delta_table()
    files = data_files(dt)
    by_arrow, whole = {}, {}
    for threshold, found in ((0, by_arrow), (WHOLE_FILE_BYTES, whole)):
        monkeypatch.setattr(table_module, "WHOLE_FILE_BYTES", threshold)
        seen.clear()
        found["all"] = read_rows(dt, table.storage_options).sort_by(_ORDER)
        found["filtered"] = read_rows(dt, table.storage_options, [("partition", "in", [1, 2]),
                                                                  ("start_offset", ">=", 10)]).sort_by(_ORDER)
        found["gets"] = sum(1 for m, p in seen if m == "GET" and ".parquet" in p and "_delta_log" not in p)
    assert whole["all"].num_rows > 12 and whole["filtered"].num_rows > 0
    assert whole["all"].equals(by_arrow["all"]) and whole["filtered"].equals(by_arrow["filtered"])
    assert whole["gets"] < by_arrow["gets"]  # one GET a file against Arrow's footer and rows
    assert len(files) == 4


_ORDER = [("partition", "ascending"), ("row_kind", "ascending"), ("segment_id", "ascending")]
