"""The metadata table followed commit by commit, for a process that answers many reads between its writes: the
broker's metadata process (`compaction.remote_log_metadata`), as Kafka's own topic-based manager answers from the
state it consumed off its topic.

A `TableFollower` holds the data files of the version it followed, per partition, and every partition it was asked
for, loaded once and loaded again only when its files change. It starts from delta-rs's state of the table (its
file list), then reads each commit file after its version from the log (`delta_log.read_commit`: the files it
added and removed), so a version costs its own commit file however large the table; delta-rs's state is brought up
to date instead (`update_incremental`, and the whole file list diffed) only now and then (`follow`). Every commit
replaces the files of the partitions it writes (`compaction.metadata.batch`), so a partition whose files did not
change between two versions has the same rows at both: its snapshot is the one loaded, at the newer version. A read
costs one look for newer commits and no data file unless the partition changed.

What a follower answers is exact for its version and says which (`version`): staleness is a version number, never
a time. `changed_since` tells a client holding partitions at an older version which of them moved (a client that
saw versions older than this follower's first must drop everything it holds: the follower cannot say what changed
before it started).

The follower is also the `batch.Reader` of the process's own commits, so they plan on the followed rows and write on
top of the followed version (the commit checks the commits in between, as for any writer), never reopening the
table, and each lands in the followed state with no read. Its commits do not write checkpoints themselves (a
broker's copier thread would wait a whole checkpoint, up to a second at 10,000 partitions, on every
`delta.checkpointInterval`-th commit): when a commit it landed, or one it followed, passes a multiple of the
interval with no checkpoint written for it, the follower has that version's checkpoint written, one at a time, while
requests go on: by a child process at a lower CPU priority (`checkpointer`), which a background thread waits for. A
checkpoint that fails is reported on stderr and written at the next due version instead: the table stays correct
without it, a fresh reader only reads more commits.

Not thread-safe: one process, one thread of requests.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from compaction.errors import plain_text
from compaction.metadata.checkpointer import checkpointer
from compaction.metadata.delta_log import Commit, PartitionFile, read_commit, store_of
from compaction.metadata.model import TopicPartition
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import DataFile, MetadataTable, reading, snapshot_of_files

FOLLOW_FILES = 32
"""The most commit files one `follow` reads one after the other (a GET each on S3) before it brings delta-rs's state
up to date instead: a broker's follower looks every second, and finds a few."""

RESYNC_SECONDS = 60.0
"""A follower that has not looked at the log for longer brings delta-rs's state up to date instead of reading the
commit files after its version one by one (`follow`)."""


class TableFollower:
    """The table at the newest version followed, and the partitions asked for, at that version."""

    def __init__(self, table: MetadataTable) -> None:
        self._table = table
        self._dt = table.delta_table()
        self._first = int(self._dt.version())
        self._version = self._first
        self._checkpointed = self._first  # the newest version a checkpoint is known for, or nothing is due before
        self._checkpointing: threading.Thread | None = None
        self._loaded: dict[TopicPartition, PartitionSnapshot] = {}
        self._watched: set[TopicPartition] = set()
        self._changed_at: dict[TopicPartition, int] = {}
        self._others_at: dict[TopicPartition, int] = {}  # the last version a commit not landed here changed it at
        self._landing: int | None = None  # the version of the commit `landed` is taking in: this process's own
        self._files: dict[TopicPartition, set[str]] = {}
        self._file_of: dict[str, tuple[TopicPartition, int]] = {}  # by path: its partition and size (add actions)
        self._take_files(self._first)
        self._looked = time.monotonic()  # the last look at the log
        self._store = store_of(table.table_uri, table.storage_options)  # where its commit files are read

    @property
    def table(self) -> MetadataTable:
        return self._table

    @property
    def version(self) -> int:
        """The newest table version followed."""
        return self._version

    @property
    def checkpoints_inline(self) -> bool:
        """`batch.Reader`: no, the follower writes them off the commit's path (the module docstring)."""
        return False

    @property
    def rows_files(self) -> bool:
        """`batch.Reader`: no, a broker's group commits put no rows file (`batch.Reader.rows_files`)."""
        return False

    @property
    def first_version(self) -> int:
        """The version this follower started from: it knows what changed after it, not before."""
        return self._first

    def follow(self) -> int:
        """Read the commits after the version followed, if any; the newest version.

        Each commit file after the version is read and applied to the file list held (`delta_log.read_commit`),
        until the log has none: a version costs its own file, however large the table. delta-rs's state is
        brought up to date instead, and the whole file list diffed (`_take_files`), when a commit changes the
        table's metadata or protocol, when more than `FOLLOW_FILES` commits came since, or when the last look is
        older than `RESYNC_SECONDS` (a commit file read then may have been expired from the log since:
        `expire_log` keeps far longer than that).

        Raises:
            TransientStoreError: the log could not be read after the store's retries (the state stays at its
                version).
        """
        looked, self._looked = self._looked, time.monotonic()
        with reading(self._table.table_uri):
            if self._looked - looked > RESYNC_SECONDS:
                self._resync()
                return self._version
            for _read in range(FOLLOW_FILES):
                if (commit := read_commit(self._store, self._version + 1)) is None:
                    break
                if commit.table_changed:
                    self._resync()
                    break
                self._apply(commit)
            else:  # far behind: one listing and delta-rs's concurrent reads rather than a GET after another
                self._resync()
        return self._version

    def partitions(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionSnapshot]:
        """Each of `partitions` at the version followed (no new look at the log): those whose files changed since
        they were loaded are read again, together, in one read of just their files."""
        wanted = set(partitions)
        self._watched |= wanted
        missing = [tp for tp in wanted if tp not in self._loaded]
        if missing:
            files: list[DataFile] = [(path, {"topic": tp.topic, "partition": tp.partition}, self._file_of[path][1])
                                     for tp in missing for path in self._files.get(tp, ())]
            read = snapshot_of_files(self._dt, files, self._table.table_uri, self._table.storage_options)
            self._loaded.update({tp: read.partition(tp.topic, tp.partition) for tp in missing})
        return {tp: self._at_version(self._loaded[tp]) for tp in wanted}

    def read(self, partitions: Iterable[TopicPartition]) -> tuple[DeltaTable, dict[TopicPartition, PartitionSnapshot]]:
        """`batch.Reader`: follow, then `partitions` at the newest version, with the `DeltaTable` the follower holds
        (its schema and configuration; a commit is written on top of the version followed)."""
        self.follow()
        return self._dt, self.partitions(partitions)

    def files(self, dt: DeltaTable, partitions: Iterable[TopicPartition]) -> list[PartitionFile]:
        """`batch.Reader`: the data files of `partitions` at the version followed, from the list held."""
        return [(path, tp, self._file_of[path][1]) for tp in partitions for path in sorted(self._files.get(tp, ()))]

    def landed(self, snapshots: Sequence[PartitionSnapshot], commit: Commit) -> None:
        """`batch.Reader`: a commit written on the version followed landed these rows, at its version: they are
        the partitions' rows there, with no read. When it is the next version its files are applied as they are;
        else the commits in between are read first."""
        self._landing = commit.version
        try:
            if commit.version == self._version + 1:
                self._apply(commit)
            else:
                self.follow()
        finally:
            self._landing = None
        for snapshot in snapshots:
            if snapshot.version == self._version:
                tp = snapshot.tp
                self._loaded[tp] = snapshot
                self._watched.add(tp)

    def changed_since(self, version: int, *, by_others: bool = False) -> list[TopicPartition]:
        """The partitions asked for before whose rows changed after `version`; with `by_others`, only those changed
        by a commit this process did not land (`landed`) itself, or one it could not tell from another's (a version
        taken in by `_resync`): whoever asked for this process's commits already has their rows.

        Raises:
            ValueError: `version` is older than `first_version` (what changed then is unknown here).
        """
        if version < self._first:
            raise ValueError(f"expected a version of {self._first} or newer (this follower's first), found {version}")
        changed = self._others_at if by_others else self._changed_at
        return sorted(tp for tp in self._watched if changed.get(tp, -1) > version)

    def _at_version(self, snapshot: PartitionSnapshot) -> PartitionSnapshot:
        if snapshot.version == self._version:
            return snapshot
        return dataclasses.replace(snapshot, version=self._version)

    def _resync(self) -> None:
        """Bring delta-rs's state to the log's newest version and take in its whole file list."""
        self._dt.update_incremental()
        version = int(self._dt.version())
        if version != self._version:
            self._take_files(version)
            self._checkpoint_if_due()

    def _apply(self, commit: Commit) -> None:
        """Take in the commit of the version after the one followed: the partitions whose files it changed are
        dropped, to be loaded again when asked for; a due checkpoint is started."""
        changed: set[TopicPartition] = set()
        for path in commit.removed:
            if (held := self._file_of.pop(path, None)) is not None:
                self._files[held[0]].discard(path)
                changed.add(held[0])
        for path, tp, size in commit.added:
            self._file_of[path] = (tp, size)
            self._files.setdefault(tp, set()).add(path)
            changed.add(tp)
        self._version = commit.version
        self._changed(changed, own=commit.version == self._landing)
        self._checkpoint_if_due()

    def _changed(self, partitions: Iterable[TopicPartition], *, own: bool = False) -> None:
        for tp in partitions:
            if not self._files.get(tp):
                self._files.pop(tp, None)
            self._changed_at[tp] = self._version
            if not own:
                self._others_at[tp] = self._version
            self._loaded.pop(tp, None)

    def _take_files(self, version: int) -> None:
        """Diff the file list of the `DeltaTable` (at `version`) against the one held, by path: only the files
        added or removed are looked at one by one, so a version costs its changes plus one listing."""
        adds = pa.table(self._dt.get_add_actions(flatten=True))
        paths = [unquote(path) for path in adds.column("path").to_pylist()]
        now = set(paths)
        changed: set[TopicPartition] = set()
        for path in self._file_of.keys() - now:
            tp, _ = self._file_of.pop(path)
            self._files[tp].discard(path)
            changed.add(tp)
        added = [(i, path) for i, path in enumerate(paths) if path not in self._file_of]
        if added:
            topics, numbers = adds.column("partition.topic"), adds.column("partition.partition")
            sizes = adds.column("size_bytes")
            for i, path in added:
                tp = TopicPartition(topics[i].as_py(), numbers[i].as_py())
                self._file_of[path] = (tp, sizes[i].as_py())
                self._files.setdefault(tp, set()).add(path)
                changed.add(tp)
        self._version = version
        self._changed(changed)

    def _checkpoint_if_due(self) -> None:
        """Start writing the checkpoint of the newest version when a version delta-rs would have checkpointed (every
        `delta.checkpointInterval`-th) was passed since the last one known and no checkpoint is being written."""
        interval = int(self._dt.metadata().configuration.get("delta.checkpointInterval", "100"))
        if (self._version + 1) // interval <= (self._checkpointed + 1) // interval:  # delta-rs's: 9, 19, ... at 10
            return
        if self._checkpointing is not None and self._checkpointing.is_alive():
            return
        version, uri, options = self._version, self._table.table_uri, self._table.storage_options

        def write() -> None:
            try:
                checkpointer().write(uri, version, options)
            except Exception as e:  # a checkpoint only speeds reads up: report, never fail a call
                print(f"kcompact: {uri}: writing the checkpoint of version {version} failed, the next due version "
                      f"will have one: {plain_text(e)}", file=sys.stderr)

        self._checkpointed = version
        self._checkpointing = threading.Thread(target=write, name=f"kcompact-checkpoint-{version}", daemon=True)
        self._checkpointing.start()

    def wait_for_checkpoint(self) -> None:
        """Return when no checkpoint is being written (tests; a process about to exit)."""
        if self._checkpointing is not None:
            self._checkpointing.join()


__all__ = ["TableFollower"]
