"""The parts of the Delta log kcompact reads and writes itself, because delta-rs's Python API carries no deletion
vectors: its `get_add_actions` omits an `add`'s `deletionVector`, and its `AddAction` cannot hold one.

- **`log_files`** replays the log up to a version (the last checkpoint, then each JSON commit after it; or, given
  an earlier replay, the commits after it) into the live files keyed by path, each with its deletion vector, and
  the vectors of removed files with the time of their removal (a vacuum keeps what a time travel inside the
  retention reads).
- **`write_commit`** writes a commit as Delta writers do: `_delta_log/<version>.json`, created only if absent (the
  store's create-only PUT). When another writer took that version first, the caller's `conflict` rule reads the
  winner's actions and either fails the commit or lets it go on at the next version.

Classic checkpoints only (one file or several parts); a table with v2 checkpoints (its `v2Checkpoint` feature) is
refused (`ConfigError`): nothing kcompact writes turns them on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from compaction.errors import CommitConflictError, CorruptInputError, MissingObjectError, ObjectExistsError
from compaction.storage.base import ObjectStore
from compaction.topic_table.deletion_vectors import DeletionVector

LOG = "_delta_log"
Action = dict[str, object]


def commit_key(table: str, version: int) -> str:
    return f"{table}/{LOG}/{version:020d}.json"


@dataclass
class LogFiles:
    """The table's files as the log has them at `version`: every file by (path, its vector's id), and the vectors of
    the files removed, with the time of their removal."""

    version: int = -1
    files: dict[tuple[str, str], DeletionVector | None] = field(default_factory=dict)
    removed: list[tuple[int, DeletionVector]] = field(default_factory=list)

    @property
    def live(self) -> dict[str, DeletionVector | None]:
        """Each live file's deletion vector (None: none) by path."""
        return {path: dv for (path, _), dv in self.files.items()}

    def removed_since(self, since_ms: int) -> list[DeletionVector]:
        """The vectors of the files removed at or after `since_ms`."""
        return [dv for at, dv in self.removed if at >= since_ms]


def _vector(action: dict[str, object] | None) -> DeletionVector | None:
    dv = None if action is None else action.get("deletionVector")
    return DeletionVector.from_json(dv) if isinstance(dv, dict) else None


def _apply(files: dict[tuple[str, str], DeletionVector | None], removed: list[tuple[int, DeletionVector]],
           actions: Sequence[Action]) -> None:
    for action in actions:
        if isinstance(add := action.get("add"), dict):
            dv = _vector(add)
            files[(unquote(str(add["path"])), dv.unique_id if dv else "")] = dv
        elif isinstance(remove := action.get("remove"), dict):
            dv = _vector(remove)
            files.pop((unquote(str(remove["path"])), dv.unique_id if dv else ""), None)
            if dv is not None:
                removed.append((int(str(remove.get("deletionTimestamp") or 0)), dv))


def read_commit(store: ObjectStore, table: str, version: int) -> list[Action]:
    """The actions of one JSON commit.

    Raises:
        CorruptInputError: a line is not a JSON object (naming the commit and the line's byte position).
    """
    key = commit_key(table, version)
    data = store.get(key)
    actions, position = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            try:
                action = json.loads(line)
            except ValueError as exc:
                raise CorruptInputError(f"Delta commit line is not JSON ({exc})", obj=store.object_uri(key),
                                        position=position) from exc
            if not isinstance(action, dict):
                raise CorruptInputError("Delta commit line is not a JSON object", obj=store.object_uri(key),
                                        position=position)
            actions.append(action)
        position += len(line) + 1
    return actions


def _checkpoint_files(store: ObjectStore, table: str, version: int) -> tuple[int, list[str]]:
    """The newest complete classic checkpoint at or below `version`: its version and the keys of its parts
    (-1 and none when there is none).

    Raises:
        CorruptInputError: it is a v2 checkpoint (UUID-named).
    """
    parts: dict[int, dict[str, list[str]]] = {}
    for info in store.list(f"{table}/{LOG}/"):
        name = info.key.rsplit("/", 1)[-1]
        pieces = name.split(".")
        if not (pieces[0].isdigit() and len(pieces) > 2 and pieces[1] == "checkpoint") or int(pieces[0]) > version:
            continue
        if len(pieces) == 3 and pieces[2] == "parquet":
            parts.setdefault(int(pieces[0]), {}).setdefault("1", []).append(info.key)
        elif len(pieces) == 5 and pieces[2].isdigit() and pieces[3].isdigit():
            parts.setdefault(int(pieces[0]), {}).setdefault(str(int(pieces[3])), []).append(info.key)
        else:
            raise CorruptInputError("a v2 checkpoint: kcompact reads classic (single or multi-part) checkpoints only",
                                    obj=store.object_uri(info.key))
    for at in sorted(parts, reverse=True):
        complete = [keys for count, keys in parts[at].items() if len(keys) == int(count)]
        if complete:
            return at, sorted(complete[0])
    return -1, []


def _checkpoint(store: ObjectStore, keys: Sequence[str]) -> Iterator[Action]:
    """The add and remove actions of a checkpoint's parts."""
    for key in keys:
        data = pq.read_table(pa.BufferReader(store.get(key)), columns=["add", "remove"])
        for column in ("add", "remove"):
            for value in data[column].to_pylist():
                if value is not None:
                    yield {column: value}


def log_files(store: ObjectStore, table: str, version: int, known: LogFiles | None = None) -> LogFiles:
    """Replay the log of the table stored under `table` up to `version` (see the module): from `known`, a replay at
    an earlier version, reading only the commits after it, else from the newest checkpoint."""
    if known is not None and known.version <= version:
        files, removed, start = dict(known.files), list(known.removed), known.version
    else:
        files, removed = {}, []
        start, checkpoint = _checkpoint_files(store, table, version)
        _apply(files, removed, list(_checkpoint(store, checkpoint)))
    for v in range(start + 1, version + 1):
        try:
            _apply(files, removed, read_commit(store, table, v))
        except MissingObjectError as exc:
            raise CorruptInputError(f"Delta log: commit {v} is missing below version {version} and after the "
                                    f"version {start} read before", obj=store.object_uri(commit_key(table, v))) from exc
    return LogFiles(version, files, removed)


def write_commit(store: ObjectStore, table: str, read_version: int, actions: Sequence[Action],
                 conflict: Callable[[Sequence[Action]], str | None]) -> int:
    """Write `actions` as the commit after `read_version`, or after the commits that took its place when `conflict`
    finds none of them conflicting (it returns what conflicts, None if nothing); returns the version written.

    Raises:
        CommitConflictError: a commit after `read_version` conflicts (nothing was written).
    """
    body = ("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n").encode()
    version = read_version + 1
    while True:
        try:
            store.put(commit_key(table, version), body)
            return version
        except ObjectExistsError:
            found = conflict(read_commit(store, table, version))
            if found is not None:
                raise CommitConflictError(f"table {store.object_uri(table)}: expected no commit touching the same "
                                          f"partitions or files after version {read_version}, found version "
                                          f"{version}, which {found}; nothing was committed, rerun") from None
            version += 1


__all__ = ["Action", "LogFiles", "commit_key", "log_files", "read_commit", "write_commit"]
