"""The WAL metadata table: reads, and the commits of the combined objects' lifecycle.

- `record_started` appends an object's rows in COPY_SEGMENT_STARTED (a blind append is safe here: the
  object id is new, so no other writer can hold rows of it).
- `forget_finished` drops the rows of objects gc deleted a day ago or more (`FINISHED_ROWS_RETENTION_MS`), so the
  table holds what is live or in flight, not everything ever uploaded.
- `change_state` moves objects to a new state with one Delta commit that rewrites exactly their rows
  (`write_deltalake(..., mode="overwrite", predicate="object_id IN (...)")`). It checks the objects' current
  states against the allowed KIP-405 transitions first, and delta-rs refuses the commit if another commit
  rewrote any of those rows after the version it read (tested in tests/integration/test_wal_table.py),
  so an uploader's FINISHED and gc's DELETE_SEGMENT_STARTED of one object can never both land. A refused
  commit is re-planned from the latest version a bounded number of times.

Like the segment metadata table, `WalTable` holds only a URI and storage options: it pickles and shares. Each open
checks the table's Delta protocol as the metadata table's (`compaction.delta_protocol.WAL_TABLE`): a reader feature
kcompact does not implement is refused on every read, a writer feature before each write
(`UnsupportedDeltaProtocolError`, exit 2; nothing written).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from compaction.delta_protocol import WAL_TABLE
from compaction.errors import (
    CommitConflictError,
    MetadataInvariantError,
    MetadataSchemaError,
    MetadataTableNotFoundError,
    TransientStoreError,
    plain_text,
)
from compaction.metadata.model import SegmentState, check_transition
from compaction.metadata.table import DeltaTableRef, ObjectStoreLike, read_rows, reading
from compaction.metadata.upkeep import compact_if_crowded, vacuum
from compaction.wal.model import WAL_SCHEMA, WAL_TABLE_NAME, WalObject, objects_from_rows, objects_to_arrow

FINISHED_ROWS_RETENTION_MS = 86_400_000
"""How long the rows of an object gc deleted (DELETE_SEGMENT_FINISHED) stay in the WAL table: a day, as the metadata
table's log keeps its entries. Nothing reads them but `kcompact wal list`; kept for ever, every upload's rows (one
per partition it holds) would stay, and every state change, which reads the table and rewrites the file holding its
object's rows, would grow with everything ever uploaded."""

MAX_FILES = 64
"""The WAL table's data files before `WalTable.upkeep` compacts them: past that, a read of the table (every upload,
roll, read and gc reads it) spends more on opening files than on their rows."""


class WalTable(DeltaTableRef):
    """The Delta table of combined objects (`compaction.wal.model` documents its columns)."""

    @classmethod
    def in_store(cls, store: ObjectStoreLike, *, create: bool = False) -> WalTable:
        """The WAL table of `store` (`<store>/_kcompact_wal`); created empty if `create` and missing."""
        table = cls(store.delta_uri(WAL_TABLE_NAME), store.delta_storage_options(), store.diagnose)
        if create:
            table._create_if_missing()
        return table

    def exists(self) -> bool:
        try:
            self._delta_table()
        except MetadataTableNotFoundError:
            return False
        return True

    def _create_if_missing(self) -> None:
        if self.exists():
            self._check_schema(self._delta_table(write=True))
            return
        with contextlib.suppress(DeltaError):  # lost the race to version 0: the other creator's table is fine
            DeltaTable.create(
                self._uri,
                WAL_SCHEMA,
                mode="ignore",
                name=WAL_TABLE_NAME,
                description="kcompact combined WAL objects (KIP-1176)",
                storage_options=self._options or None,
            )
        self._check_schema(self._delta_table(write=True))

    def _delta_table(self, *, write: bool = False) -> DeltaTable:
        """The latest version, its protocol checked for reading or (`write`) writing it.

        Raises:
            MetadataTableNotFoundError, TransientStoreError, UnsupportedDeltaProtocolError.
        """
        try:
            with reading(self._uri, self._diagnose):
                dt = DeltaTable(self._uri, storage_options=self._options or None)
        except TableNotFoundError as e:
            raise MetadataTableNotFoundError(f"{self._uri}: no WAL table here ({e})") from e
        WAL_TABLE.check(dt, self._uri, write=write)
        return dt

    def _check_schema(self, dt: DeltaTable) -> None:
        found = pa.schema(dt.schema().to_arrow())
        if not found.equals(WAL_SCHEMA):
            raise MetadataSchemaError(
                f"{self._uri}: not a kcompact WAL table: expected columns {WAL_SCHEMA.names}, found {found.names}"
            )

    def version(self) -> int:
        return int(self._delta_table().version())

    def objects(self, states: Iterable[SegmentState] | None = None) -> list[WalObject]:
        """Every object (in `states`, if given), oldest first. An absent table holds none."""
        try:
            dt = self._delta_table()
        except MetadataTableNotFoundError:
            return []
        return self._objects_of(dt, states)

    def partition_objects(self, topic: str, partition: int) -> list[WalObject]:
        """The objects with an entry of `topic`-`partition`, each with those entries only (a filtered read)."""
        try:
            dt = self._delta_table()
        except MetadataTableNotFoundError:
            return []
        filters: Any = [("topic", "=", topic), ("partition", "=", int(partition))]
        return objects_from_rows(read_rows(dt, self._options, filters).to_pylist())

    def _objects_of(self, dt: DeltaTable, states: Iterable[SegmentState] | None = None) -> list[WalObject]:
        rows = read_rows(dt, self._options)
        if states is not None:
            rows = rows.filter(pc.is_in(rows["state"], value_set=_strings(s.value for s in states)))
        return objects_from_rows(rows.to_pylist())

    def record_started(self, objects: Sequence[WalObject], now_ms: int) -> int:
        """Append `objects` in COPY_SEGMENT_STARTED (before their bytes are written); returns the version."""
        started = [replace(o, state=SegmentState.COPY_SEGMENT_STARTED, created_ms=now_ms, event_timestamp_ms=now_ms)
                   for o in objects]
        dt = self._delta_table(write=True)
        try:
            write_deltalake(dt, objects_to_arrow(started), mode="append",
                            commit_properties=CommitProperties(custom_metadata={"kcompact.wal": "started"}))
        except (DeltaError, OSError) as e:
            raise TransientStoreError(f"{self._uri}: recording {len(objects)} WAL objects started failed "
                                      f"({plain_text(e)})") from e
        return int(dt.version())

    def change_state(
        self,
        object_ids: Iterable[str],
        state: SegmentState,
        now_ms: int,
        *,
        expected: SegmentState | None = None,
        attempts: int = 5,
    ) -> list[WalObject]:
        """Move `object_ids` to `state` in one commit; returns the objects as committed.

        Objects already in `state` are left as they are (idempotent), and with `expected`, so are objects no
        longer in that state (gc retires only what is still as it planned from). Raises InvalidStateTransitionError
        for a transition KIP-405 does not allow (e.g. DELETE_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED:
        gc took the object over), MetadataInvariantError for an unknown id, and CommitConflictError if
        other commits kept rewriting these rows for `attempts` tries.
        """
        wanted = sorted(set(object_ids))
        if not wanted:
            return []
        for attempt in range(1, attempts + 1):
            dt = self._delta_table(write=True)
            current = {o.object_id: o for o in self._objects_of(dt)}
            unknown = [i for i in wanted if i not in current]
            if unknown:
                raise MetadataInvariantError(f"{self._uri}: unknown WAL object ids {unknown}")
            candidates = [i for i in wanted if expected is None or current[i].state is expected]
            for i in candidates:
                check_transition(i, current[i].state, state)
            todo = [current[i] for i in candidates if current[i].state is not state]
            if not todo:
                return [current[i] for i in wanted]
            changed = [replace(o, state=state, event_timestamp_ms=now_ms) for o in todo]
            ids = ", ".join(f"'{o.object_id}'" for o in todo)
            try:
                write_deltalake(
                    dt,
                    objects_to_arrow(changed),
                    mode="overwrite",
                    predicate=f"object_id IN ({ids})",
                    commit_properties=CommitProperties(custom_metadata={"kcompact.wal": state.value}),
                )
            except CommitFailedError as e:
                if attempt == attempts:
                    raise CommitConflictError(
                        f"{self._uri}: WAL objects {[o.object_id for o in todo]} kept being changed by other "
                        f"commits ({str(e).splitlines()[0]}); rerun"
                    ) from e
                time.sleep(0.05 * attempt)
                continue
            except (DeltaError, OSError) as e:
                raise TransientStoreError(f"{self._uri}: WAL state commit failed ({plain_text(e)}); rerun") from e
            done = {o.object_id: o for o in changed}
            return [done.get(i, current[i]) for i in wanted]
        raise AssertionError("unreachable")

    def forget_finished(self, before_ms: int, attempts: int = 5) -> int:
        """Drop the rows of the objects that reached DELETE_SEGMENT_FINISHED before `before_ms` (their bytes are gone:
        gc deleted them), in one commit; returns how many objects' rows went. A commit that rewrote those rows first
        is refused by delta-rs and the drop planned again.

        Raises:
            CommitConflictError: other commits kept rewriting the rows for `attempts` tries; TransientStoreError.
        """
        finished = SegmentState.DELETE_SEGMENT_FINISHED.value
        predicate = f"state = '{finished}' AND event_timestamp_ms < {int(before_ms)}"
        for attempt in range(1, attempts + 1):
            dt = self._delta_table(write=True)
            done = {o.object_id for o in self._objects_of(dt, [SegmentState.DELETE_SEGMENT_FINISHED])
                    if o.event_timestamp_ms < before_ms}
            if not done:
                return 0
            try:
                dt.delete(predicate, commit_properties=CommitProperties(custom_metadata={"kcompact.wal": "forget"}))
            except CommitFailedError as e:
                if attempt == attempts:
                    raise CommitConflictError(
                        f"{self._uri}: dropping the rows of {len(done)} deleted WAL objects kept conflicting with "
                        f"other commits ({str(e).splitlines()[0]}); rerun") from e
                time.sleep(0.05 * attempt)
                continue
            except (DeltaError, OSError) as e:
                raise TransientStoreError(f"{self._uri}: dropping the rows of deleted WAL objects failed "
                                          f"({plain_text(e)}); rerun") from e
            return len(done)
        raise AssertionError("unreachable")

    def upkeep(self, exists: Callable[[str], bool], max_files: int = MAX_FILES) -> tuple[int, int]:
        """Keep the table compact: bin-pack its files once it holds more than `max_files` (every upload and state
        change adds one), then vacuum the files removed longer ago than its retention; `exists` tells whether a
        path relative to the table is still in the store. Returns (files compacted, files vacuumed). A state change
        racing the compaction is refused by delta-rs and re-planned, as against any other commit."""
        compacted = compact_if_crowded(self._delta_table(write=True), max_files)
        return compacted, len(vacuum(self._delta_table(write=True), self._uri, exists))

def _strings(values: Iterable[str]) -> pa.Array:
    return pa.array(list(values), pa.string())
