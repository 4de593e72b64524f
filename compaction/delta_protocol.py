"""Which Delta protocols kcompact's writers honour, and the check that refuses the others before any work is done.

A Delta table's `protocol` names what a client must implement to read it (`minReaderVersion`, and at reader 3 its
`readerFeatures`) and to write it (`minWriterVersion`, and at writer 7 its `writerFeatures`); a writer must
implement the reader features too. Another writer may raise it at any time: a delta-spark job that turns on
`delta.enableRowTracking` adds the `rowTracking` and `domainMetadata` features. kcompact writes two kinds of table:

- the topic table (`kcompact table`, `compaction.topic_table`): written by Delta's own writer (delta-spark,
  `compaction.spark.delta_table`), which honours every table feature it knows; kcompact reads the table's state
  with delta-rs. It refuses only what it cannot honour (`TOPIC_TABLE`): `catalogManaged` (and its
  `catalogOwned-preview` name) and `coordinatedCommits-preview`, whose commits go through a catalog or a commit
  coordinator kcompact's path-based writes bypass; `appendOnly` while `delta.appendOnly` is true (every run
  removes rows); and any feature delta-spark 4.4 does not know (`DELTA_SPARK_FEATURES`).
- the metadata table (`compaction.metadata.table`), whose commits kcompact writes itself (`compaction.metadata.
  delta_log`: add and remove actions of whole Parquet files, overwriting partitions), checked again before each
  commit, and the WAL table (`compaction.wal.table`), written by delta-rs's `write_deltalake` (append, or overwrite
  with a predicate); both read through Arrow, which applies no deletion vector and maps no column. They implement
  no table feature (`METADATA_TABLE`).

**Conservative by design**: a table is accepted only if every feature it requires is one its writer implements, or
one of `INERT_WHEN_OFF`, features that constrain only the writes that use them, and only while the table's
metadata shows them unused. Each was decided from the Delta protocol's section on it, and each is one delta-rs 1.x
writes to (it refuses `domainMetadata`, `identityColumns`, `rowTracking` and `icebergCompatV1` itself):

- `appendOnly`: while `delta.appendOnly` is not `true` (every kcompact writer removes rows);
- `invariants`: while no column carries `delta.invariants` (kcompact evaluates none);
- `checkConstraints`: while the table has no `delta.constraints.*` property;
- `generatedColumns`: while no column carries `delta.generationExpression`;
- `changeDataFeed`: while `delta.enableChangeDataFeed` is not `true` (kcompact writes no change data files);
- `columnMapping`: in mode `none`, with no column carrying a `delta.columnMapping.*` key (kcompact reads and
  writes data files by the columns' display names).

Every other feature is refused, known to Delta or not (`rowTracking`, `domainMetadata`, `inCommitTimestamp`,
`v2Checkpoint`, `vacuumProtocolCheck`, `identityColumns`, `timestampNtz`, `typeWidening`, `clustering`, ...), as is
a reader version above 3 or a writer version above 7. A legacy version (reader 2, writer 2 to 6) counts as the
features Delta's protocol says it implies (`LEGACY_READER_FEATURES`, `LEGACY_WRITER_FEATURES`); writer 3's
checkpoint statistics settings are delta-rs's to honour, as it writes every checkpoint.

A refusal raises `UnsupportedDeltaProtocolError` (a `ConfigError`: exit 2), naming the table, the features and what
the writer implements. A table whose protocol delta-rs itself cannot read (a reader feature or version it does not
know, a catalog-managed table) fails to open in delta-rs before any check: `refused_by_delta_rs` tells that error
apart from a store's failure, so it is reported the same way rather than as a read a rerun may pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable

from compaction.errors import UnsupportedDeltaProtocolError, plain_text

LEGACY_READER_FEATURES: dict[int, tuple[str, ...]] = {2: ("columnMapping",)}
LEGACY_WRITER_FEATURES: dict[int, tuple[str, ...]] = {
    2: ("appendOnly", "invariants"), 3: ("checkConstraints",), 4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",), 6: ("identityColumns",)}
"""The features each legacy version adds to the one below it (Delta's protocol, "Reader/Writer Version
Requirements"); a table at reader 3 / writer 7 lists its features instead."""
DELTA_SPARK_FEATURES = frozenset({
    "appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns", "columnMapping",
    "identityColumns", "timestampNtz", "deletionVectors", "rowTracking", "domainMetadata", "icebergCompatV1",
    "icebergCompatV2", "clustering", "v2Checkpoint", "inCommitTimestamp", "vacuumProtocolCheck", "typeWidening",
    "typeWidening-preview", "variantType", "variantType-preview", "allowColumnDefaults", "checkpointProtection",
})
"""The table features delta-spark 4.4 reads and writes itself (Delta's `TableFeature`), bar the catalog-managed and
coordinated-commit ones, which need a catalog or a commit coordinator in the loop of every commit."""
MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7
DELETION_VECTORS = "deletionVectors"


def required_features(table: DeltaTable, *, write: bool) -> tuple[list[str], list[str]]:
    """The reader features `table`'s protocol requires, and its writer features (none unless `write`), a legacy
    version's as the features it implies. A version above the last one Delta defines counts as a feature no writer
    implements (`reader version 4`)."""
    protocol = table.protocol()
    reader, writer = int(protocol.min_reader_version), int(protocol.min_writer_version)
    readers = set(protocol.reader_features or ())
    readers.update(f for v, fs in LEGACY_READER_FEATURES.items() if v <= reader < 3 for f in fs)
    if reader > MAX_READER_VERSION:
        readers.add(f"reader version {reader}")
    if not write:
        return sorted(readers), []
    writers = set(protocol.writer_features or ())
    writers.update(f for v, fs in LEGACY_WRITER_FEATURES.items() if v <= writer < 7 for f in fs)
    if writer > MAX_WRITER_VERSION:
        writers.add(f"writer version {writer}")
    return sorted(readers), sorted(writers)


@dataclass(frozen=True)
class TableFacts:
    """What the rules of `INERT_WHEN_OFF` read of a table: its properties, and the metadata keys of its columns
    (nested ones too)."""

    configuration: Mapping[str, str]
    column_keys: frozenset[str]

    @classmethod
    def of(cls, table: DeltaTable) -> TableFacts:
        schema = json.loads(table.schema().to_json())
        keys = frozenset(k for field in _fields(schema) for k in (field.get("metadata") or {}))
        return cls(dict(table.metadata().configuration), keys)

    def is_true(self, name: str) -> bool:
        return str(self.configuration.get(name, "")).strip().lower() == "true"

    def column_key(self, prefix: str) -> str | None:
        """The first column metadata key that starts with `prefix`, if any."""
        return next((k for k in sorted(self.column_keys) if k.startswith(prefix)), None)


def _fields(schema: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every field of a Delta schema's JSON, and those nested in its types (structs, array elements, map keys and
    values)."""
    for field in schema.get("fields", ()):
        yield field
        yield from _nested(field.get("type"))


def _nested(kind: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(kind, dict):
        if kind.get("type") == "struct":
            yield from _fields(kind)
        for key in ("elementType", "keyType", "valueType"):
            yield from _nested(kind.get(key))


Rule = Callable[[TableFacts], "str | None"]


def _property_on(name: str) -> Rule:
    return lambda facts: f"{name} is true" if facts.is_true(name) else None


def _column_carries(prefix: str) -> Rule:
    return lambda facts: f"a column carries {key}" if (key := facts.column_key(prefix)) else None


def _constraints(facts: TableFacts) -> str | None:
    names = sorted(k for k in facts.configuration if k.startswith("delta.constraints."))
    return f"the table has CHECK constraint {names[0].removeprefix('delta.constraints.')}" if names else None


def _column_mapping(facts: TableFacts) -> str | None:
    mode = str(facts.configuration.get("delta.columnMapping.mode", "none")).strip().lower()
    return f"delta.columnMapping.mode is {mode}" if mode != "none" else _column_carries("delta.columnMapping.")(facts)


INERT_WHEN_OFF: dict[str, Rule] = {
    "appendOnly": _property_on("delta.appendOnly"),
    "invariants": _column_carries("delta.invariants"),
    "checkConstraints": _constraints,
    "generatedColumns": _column_carries("delta.generationExpression"),
    "changeDataFeed": _property_on("delta.enableChangeDataFeed"),
    "columnMapping": _column_mapping,
}
"""The features a table may have while kcompact writes it, each as long as its rule finds it unused (a rule returns
why the feature is in use, None when it is not); see the module."""


@dataclass(frozen=True)
class DeltaWriter:
    """One kcompact writer's Delta capabilities: the table it writes, the reader and writer features it implements,
    and the protocols it writes (for the refusal's message)."""

    table: str
    reader_features: frozenset[str]
    writer_features: frozenset[str]
    writes: str
    implements: str | None = None
    """What it implements, in the refusal's words (default: the features, listed)."""

    def unsupported(self, table: DeltaTable, *, write: bool = True) -> tuple[list[str], list[str]]:
        """The reader features of `table`, and (`write`) its writer features, that this writer does not honour; an
        inert feature in use says why (`appendOnly (delta.appendOnly is true)`)."""
        readers, writers = required_features(table, write=write)
        facts: list[TableFacts] = []  # read once, if a rule needs them

        def refused(features: Iterable[str], implemented: frozenset[str]) -> list[str]:
            out = []
            for feature in features:
                if feature in implemented:
                    continue
                if (rule := INERT_WHEN_OFF.get(feature)) is not None:
                    facts[:] = facts or [TableFacts.of(table)]
                    if (why := rule(facts[0])) is None:
                        continue
                    feature = f"{feature} ({why})"
                out.append(feature)
            return out

        return refused(readers, self.reader_features), refused(writers, self.writer_features)

    def check(self, table: DeltaTable, uri: str, *, write: bool = True,
              consequence: str = "nothing was written to it") -> None:
        """Refuse `table` (at `uri`) unless this writer honours its protocol for reading it, and (`write`) for writing
        it; `consequence` ends the message.

        Raises:
            UnsupportedDeltaProtocolError: naming the features it does not implement, and what it implements.
        """
        readers, writers = self.unsupported(table, write=write)
        writers = [f for f in writers if f not in readers]  # a reader feature is a writer feature too: named once
        if not readers and not writers:
            return
        needs = " and ".join([f"reader feature(s) {', '.join(readers)}"] * bool(readers)
                             + [f"writer feature(s) {', '.join(writers)}"] * bool(writers))
        implemented = self.implements or ", ".join(sorted(self.reader_features | self.writer_features))
        raise UnsupportedDeltaProtocolError(
            f"{uri}: the table requires {needs}, which kcompact {'writing' if write else 'reading'} the {self.table} "
            f"table does not implement (it writes {self.writes}; it implements "
            f"{implemented or 'no table feature'}, and accepts "
            f"{', '.join(sorted(set(INERT_WHEN_OFF) - self.writer_features))} only while unused); {consequence}")


_DELTA_RS_REFUSALS = re.compile(r"Unsupported: Feature '[^']+' is not supported|Unsupported minimum reader version"
                                r"|catalog-managed table")
"""delta-rs 1.x's (delta-kernel's) errors when it cannot read a table's protocol."""


def refused_by_delta_rs(error: BaseException, uri: str) -> UnsupportedDeltaProtocolError | None:
    """`error` (delta-rs's, opening the table at `uri`) as the refusal of a protocol delta-rs cannot read; None when it
    is another failure."""
    line = plain_text(error)
    if _DELTA_RS_REFUSALS.search(line) is None:
        return None
    return UnsupportedDeltaProtocolError(
        f"{uri}: delta-rs cannot read the table's protocol ({line}), so no kcompact command reads or writes it "
        "(kcompact reads the topic table's state through delta-rs, and the metadata and WAL tables); nothing was "
        "written to it")


TOPIC_TABLE = DeltaWriter("topic", DELTA_SPARK_FEATURES, DELTA_SPARK_FEATURES - {"appendOnly"},
                          "through delta-spark: reader 3 / writer 7 with deletionVectors and changeDataFeed",
                          "every table feature delta-spark 4.4 implements but catalogManaged and "
                          "coordinatedCommits-preview")
METADATA_TABLE = DeltaWriter("metadata", frozenset(), frozenset(), "protocol reader 1 / writer 2")
WAL_TABLE = DeltaWriter("WAL", frozenset(), frozenset(), "protocol reader 1 / writer 2")


__all__ = ["DELETION_VECTORS", "DELTA_SPARK_FEATURES", "INERT_WHEN_OFF", "LEGACY_READER_FEATURES",
           "LEGACY_WRITER_FEATURES", "METADATA_TABLE", "TOPIC_TABLE", "WAL_TABLE", "DeltaWriter", "TableFacts",
           "refused_by_delta_rs", "required_features"]
