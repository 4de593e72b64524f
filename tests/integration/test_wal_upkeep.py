"""`kcompact gc` keeps the WAL table compact: its small files bin-packed past a count, removed files vacuumed after
the table's retention, every row the same."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from compaction.gc import collect_garbage
from compaction.metadata import SegmentState, table_in_store
from compaction.storage import ObjectStore, open_store
from compaction.wal.model import WAL_TABLE_NAME
from compaction.wal.table import FINISHED_ROWS_RETENTION_MS, WalTable
from compaction.wal.upload import upload_logdir
from tests.scenario_log import ScenarioLog

NOW = 1_700_000_000_000


def uploaded(tmp_path: Path, rounds: int) -> tuple[ObjectStore, WalTable]:
    """A store whose WAL table took `rounds` uploads (a Delta commit or two each)."""
    store = open_store(str(tmp_path / "store"))
    table_in_store(store, create=True)
    log = ScenarioLog("orders", NOW - 10_000)
    for i in range(rounds):
        log.record(i % 5, b"v%d" % i)
        log.write(tmp_path / "logdir")
        assert upload_logdir(tmp_path / "logdir", store, NOW + i).exit_code == 0
    return store, WalTable.in_store(store)


def files(table: WalTable) -> int:
    return len(DeltaTable(table.table_uri).file_uris())


def test_upkeep_compacts_past_the_count_and_keeps_every_row(tmp_path: Path) -> None:
    store, table = uploaded(tmp_path, 6)
    before = sorted(table.objects(), key=lambda o: o.object_id)
    crowded = files(table)
    assert crowded > 4

    def exists(path: str) -> bool:
        return store.exists(f"{WAL_TABLE_NAME}/{path}")

    assert table.upkeep(exists, max_files=crowded) == (0, 0)  # not past the count: nothing to do
    compacted, vacuumed = table.upkeep(exists, max_files=4)
    assert compacted == crowded and vacuumed == 0 and files(table) == 1
    assert sorted(table.objects(), key=lambda o: o.object_id) == before

    # With a retention of zero the rewritten files are stale at once: vacuumed once, then nothing is left to do.
    DeltaTable(table.table_uri).alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 seconds"})
    on_disk = list((tmp_path / "store" / WAL_TABLE_NAME).glob("*.parquet"))
    assert len(on_disk) > crowded  # the compacted files, and those each state change rewrote before
    assert table.upkeep(exists, max_files=4) == (0, len(on_disk) - 1)
    assert len(list((tmp_path / "store" / WAL_TABLE_NAME).glob("*.parquet"))) == 1
    assert table.upkeep(exists, max_files=4) == (0, 0)
    assert sorted(table.objects(), key=lambda o: o.object_id) == before
    assert pa.table(DeltaTable(table.table_uri).get_add_actions(flatten=True)).num_rows == 1


def test_gc_reports_the_wal_table_upkeep(tmp_path: Path) -> None:
    store, _ = uploaded(tmp_path, 2)
    report = collect_garbage(store, table_in_store(store), NOW + 10)
    assert report.wal is not None and report.wal["table_upkeep"] == {
        "rows_dropped_objects": 0, "files_compacted": 0, "files_vacuumed": 0}
    dry = collect_garbage(store, table_in_store(store), NOW + 10, dry_run=True)
    assert dry.wal is not None and "table_upkeep" not in dry.wal


def test_gc_drops_the_rows_of_objects_it_deleted_a_day_before(tmp_path: Path) -> None:
    """The rows of an object in DELETE_SEGMENT_FINISHED for longer than `FINISHED_ROWS_RETENTION_MS` go (its bytes
    went with gc's delete); a younger one's stay, and so does every row of an object not deleted."""
    store, table = uploaded(tmp_path, 3)
    old, young, live = sorted(table.objects(), key=lambda o: o.created_ms)
    for o, at in ((old, NOW + 100), (young, NOW + 100 + FINISHED_ROWS_RETENTION_MS)):
        table.change_state([o.object_id], SegmentState.DELETE_SEGMENT_STARTED, at)
        store.delete(o.key)
        table.change_state([o.object_id], SegmentState.DELETE_SEGMENT_FINISHED, at)
    now = NOW + 101 + FINISHED_ROWS_RETENTION_MS
    report = collect_garbage(store, table_in_store(store), now)
    assert report.wal is not None and report.wal["table_upkeep"]["rows_dropped_objects"] == 1
    assert "rows of 1 objects deleted over a day ago dropped" in report.wal_summary
    left = {o.object_id: o for o in table.objects()}
    assert old.object_id not in left and left[young.object_id].state is SegmentState.DELETE_SEGMENT_FINISHED
    assert left[live.object_id].entries == live.entries
    assert table.forget_finished(now - FINISHED_ROWS_RETENTION_MS) == 0  # nothing more: no commit
