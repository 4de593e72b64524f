"""Every kcompact writer refuses a Delta table whose protocol it cannot honour (`compaction.delta_protocol`), when it
opens the table and before it writes anything: the rule per feature on hand-written protocols, and the topic,
metadata and WAL tables (and the commands that write them) on real delta-rs tables whose features delta-rs turned on.
delta-spark turning on `delta.appendOnly` on a topic table is in tests/delta_readers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, TableFeatures

from compaction.cli import main
from compaction.cli import options as cli_options
from compaction.config import CompactionStrategy
from compaction.delta_protocol import METADATA_TABLE, TOPIC_TABLE, WAL_TABLE
from compaction.errors import ExitCode, TransientStoreError, UnsupportedDeltaProtocolError
from compaction.metadata import ChangeSet, TopicPartition, commit_current
from compaction.metadata.follower import TableFollower
from compaction.metadata.table import METADATA_TABLE_NAME, MetadataTable, table_in_store
from compaction.storage import ObjectStore
from compaction.topic_table import Location, TopicTable
from compaction.wal.model import WAL_TABLE_NAME
from compaction.wal.table import WalTable
from tests.scenario_log import ScenarioLog, tier

NOW = 1_700_000_000_000
TOPIC = "orders"
LONG = {"name": "a", "type": "long", "nullable": True, "metadata": {}}


def write_log(path: Path, protocol: dict[str, Any], configuration: dict[str, str] | None = None,
              fields: list[dict[str, Any]] | None = None) -> None:
    """A Delta table of one commit, written by hand: `protocol` (its JSON action), the table's properties and its
    schema's fields (metadata keys included)."""
    schema = {"type": "struct", "fields": fields or [LONG]}
    actions = [{"protocol": protocol},
               {"metaData": {"id": "kcompact-test", "format": {"provider": "parquet", "options": {}},
                             "schemaString": json.dumps(schema), "partitionColumns": [],
                             "configuration": configuration or {}, "createdTime": NOW}}]
    (path / "_delta_log").mkdir(parents=True)
    (path / "_delta_log" / f"{0:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def hand_table(path: Path, protocol: dict[str, Any], configuration: dict[str, str] | None = None,
               fields: list[dict[str, Any]] | None = None) -> DeltaTable:
    write_log(path, protocol, configuration, fields)
    return DeltaTable(str(path))


def features(reader: int, writer: int, readers: list[str] | None = None, writers: list[str] | None = None
             ) -> dict[str, Any]:
    out: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if readers is not None:
        out["readerFeatures"] = readers
    if writers is not None:
        out["writerFeatures"] = writers
    return out


def with_metadata(key: str, value: str = "x") -> dict[str, Any]:
    return {**LONG, "metadata": {key: value}}


DV = "deletionVectors"
NESTED_INVARIANT = {"name": "s", "nullable": True, "metadata": {}, "type": {"type": "array", "containsNull": True,
                    "elementType": {"type": "struct", "fields": [with_metadata("delta.invariants")]}}}

# (protocol, properties, fields) -> what the topic-table writer and the metadata-table writer refuse for writing
# (reader features, writer features), and what a read of the metadata table refuses (its reader features)
CASES: dict[str, tuple[tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]], tuple[Any, Any, Any]]] = {
    "plain, as kcompact creates both": ((features(1, 2), {}, [LONG]), (([], []), ([], []), [])),
    "the topic table after its first update": (
        (features(3, 7, [DV], [DV, "appendOnly", "invariants"]), {"delta.enableDeletionVectors": "true"}, [LONG]),
        (([], []), ([DV], [DV]), [DV])),
    "row tracking as delta-spark turns it on": (
        (features(3, 7, [DV], [DV, "domainMetadata", "rowTracking"]), {"delta.enableRowTracking": "true"}, [LONG]),
        (([], ["domainMetadata", "rowTracking"]), ([DV], [DV, "domainMetadata", "rowTracking"]), [DV])),
    "row tracking only supported, not enabled": (
        (features(1, 7, None, ["rowTracking", "domainMetadata"]), {}, [LONG]),
        (([], ["domainMetadata", "rowTracking"]), ([], ["domainMetadata", "rowTracking"]), [])),
    "append-only off": ((features(1, 7, None, ["appendOnly"]), {"delta.appendOnly": "false"}, [LONG]),
                        (([], []), ([], []), [])),
    "append-only on": (
        (features(1, 2), {"delta.appendOnly": "true"}, [LONG]),
        (([], ["appendOnly (delta.appendOnly is true)"]), ([], ["appendOnly (delta.appendOnly is true)"]), [])),
    "writer 3 without constraints": ((features(1, 3), {}, [LONG]), (([], []), ([], []), [])),
    "writer 3 with a CHECK constraint": (
        (features(1, 3), {"delta.constraints.positive": "a > 0"}, [LONG]),
        (([], ["checkConstraints (the table has CHECK constraint positive)"]),) * 2 + ([],)),
    "writer 4, change data feed on": (
        (features(1, 4), {"delta.enableChangeDataFeed": "true"}, [LONG]),
        (([], ["changeDataFeed (delta.enableChangeDataFeed is true)"]),) * 2 + ([],)),
    "a generated column": (
        (features(1, 7, None, ["generatedColumns"]), {}, [with_metadata("delta.generationExpression", "1")]),
        (([], ["generatedColumns (a column carries delta.generationExpression)"]),) * 2 + ([],)),
    "an invariant on a nested column": (
        (features(1, 2), {}, [LONG, NESTED_INVARIANT]),
        (([], ["invariants (a column carries delta.invariants)"]),) * 2 + ([],)),
    "writer 5, column mapping none": ((features(2, 5), {"delta.columnMapping.mode": "none"}, [LONG]),
                                      (([], []), ([], []), [])),
    "column mapping by name": (
        (features(2, 5), {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "1"},
         [{**LONG, "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-1"}}]),
        ((["columnMapping (delta.columnMapping.mode is name)"], ["columnMapping (delta.columnMapping.mode is name)"]),)
        * 2 + (["columnMapping (delta.columnMapping.mode is name)"],)),
    "column mapping none but a physical name left": (
        (features(3, 7, ["columnMapping"], ["columnMapping"]), {},
         [with_metadata("delta.columnMapping.physicalName", "col-1")]),
        ((["columnMapping (a column carries delta.columnMapping.physicalName)"],
          ["columnMapping (a column carries delta.columnMapping.physicalName)"]),) * 2
        + (["columnMapping (a column carries delta.columnMapping.physicalName)"],)),
    "writer 6, identity columns": ((features(2, 6), {}, [LONG]),
                                   (([], ["identityColumns"]), ([], ["identityColumns"]), [])),
    "writer version 8": ((features(1, 8), {}, [LONG]),
                         (([], ["writer version 8"]), ([], ["writer version 8"]), [])),
    "vacuum protocol check": (
        (features(3, 7, ["vacuumProtocolCheck"], ["vacuumProtocolCheck"]), {}, [LONG]),
        ((["vacuumProtocolCheck"], ["vacuumProtocolCheck"]),) * 2 + (["vacuumProtocolCheck"],)),
    "in-commit timestamps and a feature no one knows yet": (
        (features(1, 7, None, ["inCommitTimestamp", "someFutureFeature"]),
         {"delta.enableInCommitTimestamps": "true"}, [LONG]),
        (([], ["inCommitTimestamp", "someFutureFeature"]),) * 2 + ([],)),
}


TOPIC_REFUSES: dict[str, tuple[list[str], list[str]]] = {
    "append-only on": ([], ["appendOnly (delta.appendOnly is true)"]),
    "writer version 8": ([], ["writer version 8"]),
    "in-commit timestamps and a feature no one knows yet": ([], ["someFutureFeature"]),
}
"""What the topic-table writer (delta-spark's) refuses of `CASES`: nothing else."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_writer_refuses_what_it_does_not_implement(tmp_path: Path, case: str) -> None:
    (protocol, configuration, fields), (_, metadata, metadata_read) = CASES[case]
    table = hand_table(tmp_path / "t", protocol, configuration, fields)
    assert TOPIC_TABLE.unsupported(table) == TOPIC_REFUSES.get(case, ([], []))
    assert METADATA_TABLE.unsupported(table) == metadata == WAL_TABLE.unsupported(table)
    assert METADATA_TABLE.unsupported(table, write=False) == (metadata_read, [])


def test_the_refusal_names_the_table_the_features_and_what_kcompact_implements(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    table = hand_table(tmp_path / "t", features(3, 7, [DV], [DV, "domainMetadata", "rowTracking"]))
    with pytest.raises(UnsupportedDeltaProtocolError) as refused:
        METADATA_TABLE.check(table, uri)
    message = str(refused.value)
    # a reader-and-writer feature is named once, among the reader features
    assert message.startswith(f"{uri}: the table requires reader feature(s) deletionVectors and writer feature(s) "
                              "domainMetadata, rowTracking, which kcompact writing the metadata table does not "
                              "implement (it writes protocol reader 1 / writer 2; it implements no table feature")
    assert message.endswith("only while unused); nothing was written to it")
    assert refused.value.exit_code == ExitCode.CONFIG


def test_a_protocol_delta_rs_cannot_read_is_a_refusal_not_a_read_to_retry(tmp_path: Path) -> None:
    """delta-rs fails to open a table with a reader feature it does not know; that is exit 2, not 4 (a rerun never
    passes), for the metadata table and the topic table alike."""
    path = tmp_path / "t"
    write_log(path, features(3, 7, ["someFutureFeature"], ["someFutureFeature"]))
    for opened in (lambda: MetadataTable.open(str(path), write=False),
                   lambda: MetadataTable.create_if_missing(str(path))):
        with pytest.raises(UnsupportedDeltaProtocolError, match="someFutureFeature' is not supported") as refused:
            opened()
        assert not isinstance(refused.value, TransientStoreError)
    topic = TopicTable(Location.parse(str(path)), TOPIC, CompactionStrategy.OFFSET, None)
    with pytest.raises(UnsupportedDeltaProtocolError, match="delta-rs cannot read the table's protocol"):
        topic.open([0])
    assert sorted(p.name for p in (path / "_delta_log").iterdir()) == [f"{0:020d}.json"]


def add_feature(uri: str, feature: Any) -> int:
    """Turn on `feature` with delta-rs, as another writer would; returns the table's version after it."""
    DeltaTable(uri).alter.add_feature(feature, allow_protocol_versions_increase=True)
    return DeltaTable(uri).version()


def tiered(store: ObjectStore, tmp_path: Path) -> ScenarioLog:
    log = ScenarioLog(TOPIC, NOW - 10_000, 0)
    for i in range(12):
        log.record(i % 5, f"v{i}".encode())
        if i % 4 == 3:
            log.roll()
    tier([log], tmp_path / "logdir", store, NOW)
    return log


def test_the_metadata_table_with_a_writer_feature_is_refused_for_writing_and_read_as_before(
        local_store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiered(local_store, tmp_path)
    uri = local_store.delta_uri(METADATA_TABLE_NAME)
    version = add_feature(uri, TableFeatures.RowTracking)
    for opened in (lambda: table_in_store(local_store), lambda: table_in_store(local_store, create=True)):
        with pytest.raises(UnsupportedDeltaProtocolError, match=r"writer feature\(s\) rowTracking, which kcompact "
                                                                 "writing the metadata table does not implement"):
            opened()
    assert table_in_store(local_store, write=False).live_segments(TOPIC, 0)  # a read-only open reads it as before
    capsys.readouterr()
    assert main(["segments", "--store", local_store.uri, "--topic", TOPIC, "--partition", "0"]) == 0
    assert main(["gc", "--store", local_store.uri, "--now", str(NOW)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"kcompact gc: UnsupportedDeltaProtocolError: {uri}: the table requires writer feature(s) "
                          "rowTracking") and "Traceback" not in err
    assert DeltaTable(uri).version() == version


def test_a_feature_turned_on_after_the_table_was_opened_refuses_the_next_commit(local_store: ObjectStore,
                                                                                 tmp_path: Path) -> None:
    """A long-lived writer (the broker's metadata process) opened the table before another writer turned on row
    tracking: its next commit reads the protocol change, checks it again and is refused, nothing written."""
    tiered(local_store, tmp_path)
    table = table_in_store(local_store)
    follower = TableFollower(table)
    uri = local_store.delta_uri(METADATA_TABLE_NAME)
    version = add_feature(uri, TableFeatures.RowTracking)
    def touch(current: Any) -> ChangeSet:
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="late")

    for reader in (follower, None):
        with pytest.raises(UnsupportedDeltaProtocolError, match=r"writer feature\(s\) rowTracking"):
            commit_current(table, TopicPartition(TOPIC, 0), NOW, touch, reader=reader)
    assert DeltaTable(uri).version() == version


def test_the_metadata_table_with_deletion_vectors_is_refused_even_for_reading(local_store: ObjectStore,
                                                                               tmp_path: Path) -> None:
    """kcompact reads the metadata table's files through Arrow, applying no deletion vector."""
    tiered(local_store, tmp_path)
    add_feature(local_store.delta_uri(METADATA_TABLE_NAME), TableFeatures.DeletionVectors)
    with pytest.raises(UnsupportedDeltaProtocolError, match=r"reader feature\(s\) deletionVectors, which kcompact "
                                                             "reading the metadata table"):
        table_in_store(local_store, write=False)


def test_the_wal_table_with_a_writer_feature_refuses_an_upload_before_any_object_is_written(
        local_store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = ScenarioLog(TOPIC, NOW - 10_000, 0)
    for i in range(5):
        log.record(i, b"v")
    log.write(tmp_path / "logdir")
    WalTable.in_store(local_store, create=True)
    uri = local_store.delta_uri(WAL_TABLE_NAME)
    version = add_feature(uri, TableFeatures.DomainMetadata)
    assert WalTable.in_store(local_store).objects() == []  # reads are fine
    capsys.readouterr()
    assert main(["wal", "upload", "--logdir", str(tmp_path / "logdir"), "--store", local_store.uri,
                 "--now", str(NOW)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "UnsupportedDeltaProtocolError" in err and "writer feature(s) domainMetadata" in err
    assert "writing the WAL table" in err and "Traceback" not in err
    assert DeltaTable(uri).version() == version
    assert not [o for o in local_store.list("wal/")]


def topic_table(root: Path) -> TopicTable:
    """The topic table of `TOPIC` under `root`, created empty (by delta-rs: its protocol is this test's business)."""
    table = TopicTable(Location.parse(str(root / "tables" / TOPIC)), TOPIC, CompactionStrategy.OFFSET, None)
    if not table.exists():
        DeltaTable.create(table.uri, table.schema, partition_by=["partition"], description=table.description)
    return table


def test_the_topic_table_is_refused_on_open_naming_the_feature_and_accepted_while_an_inert_one_is_unused(
        tmp_path: Path) -> None:
    table = topic_table(tmp_path)
    assert table.open([0]).version == 0
    version = add_feature(table.uri, TableFeatures.AppendOnly)  # supported, not on: still kcompact's to write
    assert topic_table(tmp_path).open([0]).version == version
    DeltaTable(table.uri).alter.set_table_properties({"delta.appendOnly": "true"})
    version = DeltaTable(table.uri).version()
    with pytest.raises(UnsupportedDeltaProtocolError) as refused:
        topic_table(tmp_path).open([0])
    assert str(refused.value) == (
        f"{table.uri}: the table requires writer feature(s) appendOnly (delta.appendOnly is true), which kcompact "
        "writing the topic table does not implement (it writes through delta-spark: reader 3 / writer 7 with "
        "deletionVectors and changeDataFeed; it implements every table feature delta-spark 4.4 implements but "
        "catalogManaged and coordinatedCommits-preview, and accepts appendOnly only while unused); nothing was "
        "written to it")
    assert DeltaTable(table.uri).version() == version


def test_kcompact_table_exits_2_before_starting_spark(local_store: ObjectStore, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tiered(local_store, tmp_path)
    table = topic_table(tmp_path)
    DeltaTable(table.uri).alter.set_table_properties({"delta.appendOnly": "true"})
    version = DeltaTable(table.uri).version()

    def no_spark(master: str | None) -> Any:
        raise AssertionError("Spark started for a table kcompact refuses")

    monkeypatch.setattr(cli_options, "spark_session", no_spark)
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n")
    capsys.readouterr()
    assert main(["table", "--store", local_store.uri, "--config", str(config), "--topic", TOPIC, "--table",
                 str(tmp_path / "tables" / TOPIC), "--now", str(NOW)]) == ExitCode.CONFIG
    out = capsys.readouterr()
    assert out.err.startswith(f"kcompact table: UnsupportedDeltaProtocolError: {table.uri}: the table requires "
                              "writer feature(s) appendOnly (delta.appendOnly is true), which kcompact writing the "
                              "topic table does not implement"), out.err
    assert out.err.endswith("; nothing was written to it\n") and "Traceback" not in out.err
    assert out.out == ""
    assert DeltaTable(table.uri).version() == version
