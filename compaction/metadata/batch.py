"""One Delta commit for many partitions, each still checked as if it were committed alone.

A writer hands `land` a *build* per partition: a function from the partition's latest rows to its complete new row
set (`PartitionRows`), None when there is nothing to do, or a `KcompactError` raised to refuse (a fencing epoch that
is not the partition's, a stale change set, a broken invariant). `land` reads every partition of a batch at one
table version `v` (one read), builds each, and writes all the row sets in one Delta commit on top of `v` that removes
every file of the batch's partitions and adds one new file each (`delta_log.overwrite_partitions`; its commitInfo
records the predicate `partitions_predicate` gives: `topic = 't' AND partition IN (0, 3)`, an OR of such terms
across topics).

Conflicts stay per partition. The commit checks every commit that landed after `v`: one that added or removed a file
of a partition in the batch takes that partition out of the write, and the rest of the batch lands without it
(`delta_log.overwrite_partitions`'s `narrow`: the partition's actions and data file dropped, the commitInfo's
predicate narrowed); commits to other partitions, or to partitions the table does not hold yet and the batch does
not name, take none (tests/integration/test_metadata_batch.py checks both). A write whose every partition was taken,
or that met a change of the table's metadata, fails whole (`delta_log.DeltaConflict`, nothing of it visible). The
partitions taken are read again: one whose rows moved since `v` has used one of its `attempts` and is built again on
its new rows (where a change set is checked again, rebased or refused), and they are written again, in a commit of
their own, without those that were refused or ran out of attempts. One partition's refusal never holds back the
others, a partition that did not move is never charged for another's conflict, and a conflict costs the writes of
the partitions it took, not of the whole batch: a batch of thousands of partitions lands beside a broker that keeps
copying into some of them.

A read or write that still fails after the store's own retries (`TransientStoreError`) fails the batch it was for.
The batch is then split in halves, each landed on its own, so that a partition whose files the store keeps refusing
(a throttled prefix) fails alone, for about two writes per halving; when both halves fail as well, the store is what
fails, and every partition of both fails with its error, without more writes. A rerun is safe either way.

A batch holds at most `BATCH_PARTITIONS` partitions; `land` commits more in several batches of that size, one after
the other. Each partition's outcome is returned: `Landed` (its rows and the version that holds them), None, or the
`KcompactError` that refused it (nothing of it landed; a `TransientStoreError` may hide a commit that landed).
Builds are called again on every attempt and must be pure but for what they record of their last call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from compaction.delta_protocol import METADATA_TABLE
from compaction.errors import CommitConflictError, KcompactError, MetadataInvariantError, TransientStoreError
from compaction.metadata.change_set import PartitionRows
from compaction.metadata.delta_log import Commit, DeltaConflict, PartitionFile, overwrite_partitions, store_of
from compaction.metadata.model import (
    LEGACY_METADATA_SCHEMA,
    METADATA_SCHEMA,
    PartitionState,
    TopicPartition,
    check_topic,
    partition_rows,
)
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import MetadataTable, load_partitions, partition_files

BATCH_PARTITIONS = 10_000
"""The most partitions one Delta commit rewrites: a bigger run commits in batches of this size. A commit of 10,000
partitions is a log entry of ~6 MB (a remove and an add action a partition) that a follower reads once; a conflict
costs only the partitions it took (module docstring), so a larger batch is not a more fragile one."""

Build = Callable[[PartitionSnapshot], PartitionRows | None]
"""A partition's latest rows -> its new row set; None: nothing to do; raising a `KcompactError`: refused."""


class Reader(Protocol):
    """Where a batch reads its partitions' latest rows: the table at a version and the partitions at it, the commit
    written on top of that `DeltaTable`. By default the table opened afresh (`fresh_reader`); a process that keeps
    the table followed reuses its state (`compaction.metadata.follower.TableFollower`); a writer that has just read
    the partitions reuses those rows while no other commit landed (`known_reader`)."""

    @property
    def table(self) -> MetadataTable:
        """The table read and written."""

    def read(self, partitions: Iterable[TopicPartition]
             ) -> tuple[DeltaTable, dict[TopicPartition, PartitionSnapshot]]: ...

    def files(self, dt: DeltaTable, partitions: Iterable[TopicPartition]) -> list[PartitionFile]:
        """Every data file of `partitions` at the version of the last `read` (`dt`, the table it returned)."""

    def landed(self, snapshots: Sequence[PartitionSnapshot], commit: Commit) -> None:
        """The partitions a commit written on the last `read`'s version just landed, at its version (`commit`)."""

    @property
    def checkpoints_inline(self) -> bool:
        """Whether a commit on a version that is a multiple of `delta.checkpointInterval` writes that checkpoint
        before it returns (as delta-rs's post-commit hook would); False for a reader that writes checkpoints itself,
        off the commit's path (the follower, whose commits a broker waits for)."""

    @property
    def rows_files(self) -> bool:
        """Whether a commit of `delta_log.ROWS_FILE_MIN_PARTITIONS` partitions or more also puts their rows file; False
        for the follower (a broker's group commit: each of its files is replaced by its partition's next copy within
        seconds, so no read would want many of them, and the file would cost its encoding and a put on the path the
        broker waits on)."""


@dataclass(frozen=True)
class _Fresh:
    table: MetadataTable
    checkpoints_inline: bool = True
    rows_files: bool = True

    def read(self, partitions: Iterable[TopicPartition]
             ) -> tuple[DeltaTable, dict[TopicPartition, PartitionSnapshot]]:
        dt = self.table.delta_table()
        return dt, load_partitions(dt, partitions, self.table.table_uri, self.table.storage_options)

    def files(self, dt: DeltaTable, partitions: Iterable[TopicPartition]) -> list[PartitionFile]:
        return partition_files(dt, partitions)

    def landed(self, snapshots: Sequence[PartitionSnapshot], commit: Commit) -> None:
        pass


def fresh_reader(table: MetadataTable) -> Reader:
    """The table's latest version, opened afresh for every read."""
    return _Fresh(table)


class KnownRows:
    """A `Reader` that reuses the rows its caller already holds, all of one table version (`known_reader`)."""

    checkpoints_inline = True
    rows_files = True

    def __init__(self, table: MetadataTable, version: int, snapshots: Mapping[TopicPartition, PartitionSnapshot]
                 ) -> None:
        self.table = table
        self.version = version
        self.snapshots = dict(snapshots)
        self._served: int | None = None  # the version the last read was answered at

    def read(self, partitions: Iterable[TopicPartition]
             ) -> tuple[DeltaTable, dict[TopicPartition, PartitionSnapshot]]:
        dt = self.table.delta_table()
        wanted, version = list(partitions), int(dt.version())
        if version != self.version:
            self.snapshots.clear()
            self.version = version
        missing = [tp for tp in wanted if tp not in self.snapshots]
        if missing:
            self.snapshots.update(load_partitions(dt, missing, self.table.table_uri, self.table.storage_options))
        self._served = version
        held = {tp: self.snapshots[tp] for tp in wanted}  # a partition no commit touched since: its rows, restamped
        return dt, {tp: s if s.version == version else replace(s, version=version) for tp, s in held.items()}

    def files(self, dt: DeltaTable, partitions: Iterable[TopicPartition]) -> list[PartitionFile]:
        return partition_files(dt, partitions)

    def landed(self, snapshots: Sequence[PartitionSnapshot], commit: Commit) -> None:
        """The partitions a commit written on the last read's version landed: when it is the very next version,
        nothing else changed in between and every other partition held is still current; else only these are."""
        if not snapshots:
            return
        version = snapshots[0].version
        if self._served is None or version != self._served + 1 or self._served != self.version:
            self.snapshots.clear()
        self.snapshots.update({s.tp: s for s in snapshots})
        self.version = version


def known_reader(table: MetadataTable, snapshots: Mapping[TopicPartition, PartitionSnapshot]) -> Reader:
    """The table's latest version, opened afresh for every read, with rows the caller already holds: while the latest
    version is still theirs, partitions among them are answered from them rather than read from the table's files
    (a run that read the table to plan commits with one look at the log instead of a read of every partition's file),
    and each commit landed through the reader keeps them current (`landed`: a commit that is the next version
    changed only its own partitions). After any other commit, or for a partition not held, the partitions asked for
    are read afresh. `snapshots` of several versions keep only those of the newest."""
    newest = max((s.version for s in snapshots.values()), default=-1)
    return KnownRows(table, newest, {tp: s for tp, s in snapshots.items() if s.version == newest})


@dataclass(frozen=True)
class CommitResult:
    """Where a commit landed: the table version it created and the partition's new commit_seq."""

    topic: str
    partition: int
    version: int
    commit_seq: int
    fencing_epoch: int


@dataclass(frozen=True)
class Landed:
    """A partition's new row set and the table version whose commit wrote it."""

    rows: PartitionRows
    version: int

    @property
    def result(self) -> CommitResult:
        s = self.rows.state
        return CommitResult(s.topic, s.partition, self.version, s.commit_seq, s.fencing_epoch)

    @property
    def snapshot(self) -> PartitionSnapshot:
        """The partition at `version`: the commit replaced every row of it with exactly these."""
        s = self.rows.state
        return PartitionSnapshot(s.topic, s.partition, self.version, s, self.rows.segments)


Outcome = Landed | KcompactError | None


def partitions_predicate(partitions: Iterable[TopicPartition]) -> str:
    """The literal Delta predicate selecting exactly the rows of `partitions`: `topic = 't' AND partition = 0` for
    one, `topic = 't' AND partition IN (0, 3)` per topic for more, ORed across topics."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(set(partitions)):
        by_topic.setdefault(check_topic(tp.topic), []).append(int(tp.partition))
    if not by_topic:
        raise MetadataInvariantError("a predicate for no partition would select none, or all")
    terms = [f"topic = '{topic}' AND partition = {numbers[0]}" if len(numbers) == 1 else
             f"topic = '{topic}' AND partition IN ({', '.join(map(str, numbers))})"
             for topic, numbers in by_topic.items()]
    return terms[0] if len(terms) == 1 else " OR ".join(f"({t})" for t in terms)


def _named(states: Sequence[PartitionState]) -> str:
    first = f"{states[0].topic}-{states[0].partition}"
    return first if len(states) == 1 else f"{len(states)} partitions ({first}, ...)"


def _commit_metadata(states: Sequence[PartitionState]) -> dict[str, str]:
    """What the Delta log records of a commit beside its files: who wrote it, and for one partition its state."""
    writers, runs = sorted({s.writer for s in states}), sorted({s.run_id or "" for s in states})
    metadata = {"kcompact.partitions": str(len(states)), "kcompact.writer": ",".join(writers),
                "kcompact.run_id": ",".join(runs)}
    if len(states) == 1:
        s = states[0]
        metadata |= {"kcompact.partition": f"{s.topic}-{s.partition}", "kcompact.commit_seq": str(s.commit_seq),
                     "kcompact.fencing_epoch": str(s.fencing_epoch)}
    return metadata


def _write(reader: Reader, dt: DeltaTable, base: int, rows: Sequence[PartitionRows], checkpoint: bool) -> Commit:
    """Replace every row of the partitions of `rows` with `rows`, in one Delta commit on top of version `base`
    (`dt` is the table `reader` read it from); the commit (`delta_log.overwrite_partitions`).
    `checkpoint`: whether the commit writes the version's checkpoint when it is due (`Reader.checkpoints_inline`).

    Raises:
        CommitConflictError: a commit after `base` touched one of the partitions; nothing landed.
        TransientStoreError: the store kept failing under its retries.
        UnsupportedDeltaProtocolError: another writer turned on a table feature since the table was opened, which
            kcompact's commits do not honour (a change after `base` is a conflict, and read again).
    """
    states = [r.state for r in rows]
    where = _named(states)
    table = reader.table
    METADATA_TABLE.check(dt, table.table_uri)
    legacy = pa.schema(dt.schema().to_arrow()).equals(LEGACY_METADATA_SCHEMA)  # created before `transactional`
    schema = LEGACY_METADATA_SCHEMA if legacy else METADATA_SCHEMA
    built = partition_rows([(r.state, r.segments) for r in rows])
    tables = {r.state.tp: t for r, t in zip(rows, built, strict=True)}
    by_tp = {s.tp: s for s in states}

    def narrow(left: Collection[TopicPartition]) -> tuple[str, dict[str, str]]:
        return partitions_predicate(left), _commit_metadata([by_tp[tp] for tp in sorted(left)])

    try:
        return overwrite_partitions(dt, base, store_of(table.table_uri, table.storage_options), tables,
                                    reader.files(dt, tables), partitions_predicate(tables),
                                    _commit_metadata(states), checkpoint, reader.rows_files, schema, narrow)
    except DeltaConflict as e:
        raise CommitConflictError(
            f"{where}: expected no commit to the partition after table version {base}, "
            f"found one ({e}); re-plan and retry"
        ) from e
    except (DeltaError, OSError) as e:  # delta-rs failed to load the version written for its checkpoint
        raise TransientStoreError(
            f"{where}: writing the metadata commit after table version {base} failed "
            f"(delta-rs: {str(e).splitlines()[0]}); re-read the partition and rerun"
        ) from e


@dataclass(frozen=True)
class _Lost:
    """A write that lost to a concurrent commit: the rows it was built on (at table version `base`), and what the
    commit found."""

    seen: Mapping[TopicPartition, PartitionSnapshot]
    base: int
    detail: str

    def moved(self, current: Mapping[TopicPartition, PartitionSnapshot]) -> list[TopicPartition]:
        """The partitions whose rows changed since; all of them when none did (a conflict that is no row's, such as a
        protocol change: then every partition pays)."""
        moved = [tp for tp, now in current.items()
                 if (now.state, now.segments) != (self.seen[tp].state, self.seen[tp].segments)]
        return moved or list(current)

    def refusal(self, tp: TopicPartition) -> CommitConflictError:
        return CommitConflictError(f"{tp.topic}-{tp.partition}: expected no commit to the partition after table "
                                   f"version {self.base}, found one ({self.detail}); re-plan and retry")


_Failed = tuple[dict[TopicPartition, Build], TransientStoreError]
"""A batch the store failed: the builds still pending, and the error."""


def _land_batch(reader: Reader, builds: Mapping[TopicPartition, Build], attempts: int,
                outcomes: dict[TopicPartition, Outcome]) -> _Failed | None:
    """Land one batch, the conflict loop of the module docstring; outcomes go into `outcomes`, but for the pending
    builds of a batch the store failed, which are returned with the error."""
    pending = dict(builds)
    conflicts: Counter[TopicPartition] = Counter()
    lost: _Lost | None = None
    while pending:
        try:
            dt, current = reader.read(pending)
        except TransientStoreError as e:
            return pending, e
        if lost is not None:
            for tp in lost.moved(current):
                conflicts[tp] += 1
                if conflicts[tp] >= attempts:
                    outcomes[tp] = lost.refusal(tp)
                    del pending[tp]
        rows: dict[TopicPartition, PartitionRows] = {}
        for tp, build in list(pending.items()):
            built: PartitionRows | KcompactError | None
            try:
                built = build(current[tp])
            except KcompactError as e:
                built = e
            if isinstance(built, PartitionRows):
                rows[tp] = built
            else:
                outcomes[tp] = built
                del pending[tp]
        if not rows:
            return None
        base = next(iter(current.values())).version  # every partition read is at the version read
        try:
            commit = _write(reader, dt, base, list(rows.values()), reader.checkpoints_inline)
        except CommitConflictError as e:
            lost = _Lost(current, base, str(e.__cause__ or e).splitlines()[0])
            continue
        except TransientStoreError as e:
            return pending, e
        dropped = dict(commit.lost)
        landed = {tp: Landed(r, commit.version) for tp, r in rows.items() if tp not in dropped}
        reader.landed([outcome.snapshot for outcome in landed.values()], commit)
        outcomes.update(landed)
        if not dropped:
            return None
        pending = {tp: pending[tp] for tp in dropped}  # taken by a commit that landed first: checked again alone
        lost = _Lost({tp: current[tp] for tp in dropped}, base, next(iter(dropped.values())))
    return None


def _split(reader: Reader, failed: _Failed, attempts: int, outcomes: dict[TopicPartition, Outcome]) -> None:
    """After the store failed a batch: land each half on its own, and halve again the one half that fails alone."""
    builds, error = failed
    order = sorted(builds)
    if len(order) == 1:
        outcomes[order[0]] = error
        return
    middle = len(order) // 2
    halves = [{tp: builds[tp] for tp in half} for half in (order[:middle], order[middle:])]
    still = [f for f in (_land_batch(reader, half, attempts, outcomes) for half in halves) if f is not None]
    if len(still) == 2:  # the store, not a partition: stop writing
        outcomes.update({tp: e for pending, e in still for tp in pending})
        return
    for f in still:
        _split(reader, f, attempts, outcomes)


def land(table: MetadataTable, builds: Mapping[TopicPartition, Build], attempts: int,
         reader: Reader | None = None) -> dict[TopicPartition, Outcome]:
    """Land every partition's build, `BATCH_PARTITIONS` to a Delta commit; every partition's outcome (see the module
    docstring). A build raising anything but a `KcompactError` ends the call at once. `reader`: where the latest
    rows come from (default: `table` opened afresh each time).

    Raises:
        MetadataInvariantError: `attempts` < 1.
    """
    if attempts < 1:
        raise MetadataInvariantError(f"attempts must be >= 1, found {attempts}")
    outcomes: dict[TopicPartition, Outcome] = {}
    order = sorted(builds)
    for start in range(0, len(order), BATCH_PARTITIONS):
        batch = {tp: builds[tp] for tp in order[start:start + BATCH_PARTITIONS]}
        failed = _land_batch(reader or fresh_reader(table), batch, attempts, outcomes)
        if failed is not None:
            _split(reader or fresh_reader(table), failed, attempts, outcomes)
    return outcomes


__all__ = [
    "BATCH_PARTITIONS",
    "Build",
    "CommitResult",
    "KnownRows",
    "Landed",
    "Outcome",
    "Reader",
    "fresh_reader",
    "known_reader",
    "land",
    "partitions_predicate",
]
