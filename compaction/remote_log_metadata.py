"""The metadata table as a Kafka broker's RemoteLogMetadataManager sees it, served over a pipe.

The tiered plugin (`kafka/tiered-plugin`, `KcompactRemoteLogMetadataManager`) starts
`python -m compaction.remote_log_metadata --store STORE [--endpoint-url URL]` (a directory or `s3://bucket/prefix`)
and speaks JSON lines with it on stdin/stdout: one
request per line, one answer per line, in order. The table is read and written here, through the same
commit path every other kcompact writer uses (`compaction.metadata.commit`), so the broker's rows
are kcompact's rows by construction, conditional commits and fencing included. The broker owns the process's
life: it ends when its stdin closes (the broker closed the manager, or died), and ignores SIGTERM and SIGINT, which
a broker's own stop may send its whole process group while the broker still finishes a copy.

Requests (`op` and its fields, as `compaction/pipes.json` names them: each request is checked against it;
every answer is `{"ok": true, "result": ...}` or
`{"ok": false, "error": "<one line>", "type": "<kcompact error class>", "version": <the table's latest version>}`):

- `add`: KIP-405's addRemoteLogSegmentMetadata as its own commit (what a plugin older than `copy` sends, and the
  first step of a copy overlapping the tier). A row in COPY_SEGMENT_STARTED with the object keys of
  `compaction.storage.layout`, the `.txnindex` only when the broker says the segment has one.
- `copy`: a whole copy in one commit: `add`'s fields and `transactional`, the row going in as COPY_SEGMENT_FINISHED.
  The plugin holds a copy's addRemoteLogSegmentMetadata in the broker (it answers from memory) and sends this at
  its COPY_SEGMENT_FINISHED: one Delta commit per copy instead of two. A copy that overlaps the tier (a new leader's
  first after a failover) is committed as `add` then `update` would be, so that it is trimmed as they trim it.
- `update`: updateRemoteLogSegmentMetadata: `segment_id` moves to `state`; `transactional` (true, false or null)
  is what the plugin's storage manager found in the copied segment's batch headers (a transactional or control
  batch), passed by Kafka from its copy to this update as the segment's custom metadata (KIP-917), and goes into the
  row: a compaction then knows the segment's marker-walk state at plan time (docs/compaction-run.md).
- `segments`: every segment row of a partition, each with `live` (COPY_SEGMENT_FINISHED and not a zombie),
  and the table version they are the rows of.
- `batch`: `requests`, writes (`copy`, `add`, `update`) of different partitions committed in one Delta commit, each
  planned and refused alone; `answers`, one per request in order, each as its own request would be answered.
- `load`: `segments` for many `partitions` at one version, their files read together (a broker that just became
  leader of them).
- `follow`: the newest version, and the partitions asked for before whose rows another writer's commit changed after
  the request's `since` (each as `segments` answers it; a change by this process's own writes was in their answers),
  or `reset` when `since` is older than this process's first version.

`copy`, `add` and `update` answer as `segments` does, at a version holding their commit: a broker knows its own write at
once. The process follows the table (`compaction.metadata.follower`): every request first reads the commits since
the last one, if any, and a partition's rows are read again only when a commit changed them; the broker's plugin
keeps each partition's answer with its version and asks `follow` for what changed (docs/broker.md).

Two epochs, kept apart. The broker's rows carry the leader epochs Kafka gives each segment
(`RemoteLogSegmentMetadata.segmentLeaderEpochs`), which also grow the partition's leader-epoch lineage, and a broker
is fenced by them: an `add` whose segment's latest leader epoch is older than the lineage's latest is a deposed
leader's and is refused (`FencedError`). kcompact's fencing epoch (docs/fencing.md) is the cleaner's alone: the
broker holds none and writes under the partition's current one, so a run acquiring the partition never fences the
broker, and the broker's appends never fence a run (a compaction rebases over them, `compaction.metadata.rebase`).
A commit that lands first (another writer's, a compaction's new fencing epoch included) makes the broker's change
plan again on the rows after it, a few times (`compaction.metadata.commit_current`).

After a failover a new leader's first copy overlaps the tier (its replica rolled elsewhere): it goes live trimmed to
the offsets above the tier's end (`compaction.tier.overlap`), so the tier goes on from where the old leader stopped.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import IO, Any

from compaction.errors import FencedError, KcompactError
from compaction.format.checkpoints import EpochEntry
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    NewSegment,
    ObjectKey,
    PartitionSnapshot,
    SegmentMetadata,
    SegmentState,
    StateChange,
    TopicPartition,
    broker_writer,
    commit_current,
    commit_current_batch,
    new_kafka_uuid,
    table_in_store,
)
from compaction.metadata.batch import CommitResult
from compaction.metadata.commit import Plan
from compaction.metadata.follower import TableFollower
from compaction.pipes import check_request
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import is_parts_key
from compaction.storage.layout import Suffix, segment_object_key
from compaction.tier.overlap import tier_end, trim_copy

_ATTEMPTS = 5
_SUFFIXES = (Suffix.LOG, Suffix.OFFSET_INDEX, Suffix.TIME_INDEX, Suffix.PRODUCER_SNAPSHOT,
             Suffix.LEADER_EPOCH_CHECKPOINT)


@dataclass(frozen=True)
class RemoteTier:
    """What the requests are answered on: the metadata table as followed, and the store holding the segments'
    objects (read and written only to trim a copy that overlaps the tier, `compaction.tier.overlap`)."""

    follower: TableFollower
    store: ObjectStore

    @classmethod
    def of(cls, table: MetadataTable, store: ObjectStore) -> RemoteTier:
        return cls(TableFollower(table), store)

    @property
    def table(self) -> MetadataTable:
        return self.follower.table


def new_segment(req: Mapping[str, Any], prefix: str = "") -> NewSegment:
    """The COPY_SEGMENT_STARTED row of an `add` request, with the object keys the plugin writes."""
    suffixes = _SUFFIXES if req["txn_index_empty"] else (*_SUFFIXES, Suffix.TXN_INDEX)
    keys = tuple(
        ObjectKey(s, segment_object_key(req["topic"], req["topic_id"], req["partition"], req["start_offset"],
                                        req["segment_id"], s, prefix))
        for s in suffixes
    )
    return NewSegment(
        segment_id=req["segment_id"],
        start_offset=req["start_offset"],
        end_offset=req["end_offset"],
        max_timestamp_ms=req["max_timestamp_ms"],
        segment_leader_epochs=tuple(EpochEntry(e, o) for e, o in req["leader_epochs"]),
        segment_size_bytes=req["segment_size_bytes"],
        object_keys=keys,
        state=SegmentState.COPY_SEGMENT_STARTED,
    )


def check_leader_epoch(current: PartitionSnapshot, segment: NewSegment, writer: str) -> None:
    """Refuse a segment whose latest leader epoch is older than the partition's latest: a deposed leader's copy.

    Raises:
        FencedError: naming both epochs; the broker drops the copy (a newer leader tiers the partition).
    """
    lineage = current.state.leader_epochs if current.state else ()
    if lineage and segment.segment_leader_epochs and segment.segment_leader_epochs[-1].epoch < lineage[-1].epoch:
        raise FencedError(
            f"{current.topic}-{current.partition}: expected leader epoch {lineage[-1].epoch} or newer, found "
            f"{segment.segment_leader_epochs[-1].epoch} (segment {segment.segment_id} "
            f"[{segment.start_offset}, {segment.end_offset}] from {writer}, a deposed leader)"
        )


def _committed(tier: RemoteTier, req: Mapping[str, Any], plan: Plan
               ) -> dict[str, Any]:
    """Commit under the partition's current state (`commit_current`, on the followed rows): the broker holds no
    fencing epoch, so a compaction taking the partition meanwhile makes it plan again, never refuses it. The
    partition's rows at a version holding the commit."""
    tp = TopicPartition(req["topic"], req["partition"])
    result = commit_current(tier.table, tp, req["event_timestamp_ms"], plan, attempts=_ATTEMPTS,
                            reader=tier.follower)
    assert result is not None  # every plan here returns a change set
    return _partition_json(tier.follower.partitions([tp])[tp])


def add(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    return _committed(tier, req, _add_plan(tier, req))


def copy(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return _committed(tier, req, _copy_plan(tier, req))
    except _Overlaps:
        return _copied_in_two(tier, req)


def _copied_in_two(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    """A copy overlapping the tier, as its `add` and its `update` to COPY_SEGMENT_FINISHED: two commits, the second
    trimming it (`_update_plan`)."""
    add(tier, req)
    return update(tier, {**req, "op": "update", "state": SegmentState.COPY_SEGMENT_FINISHED.value})


def update(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    return _committed(tier, req, _update_plan(tier, req))


_WRITES: dict[str, Callable[[RemoteTier, Mapping[str, Any]], Plan]] = {}


def batch(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    """Writes (`copy`, `add`, `update`) of different partitions, committed together (`commit_current_batch`: one Delta
    commit, each partition planned and refused alone): the plugin's group commit of the writes its threads make at
    once. Answers each request in order, as its own request would be answered."""
    requests = req["requests"]
    tps = [TopicPartition(r["topic"], r["partition"]) for r in requests]
    if len(set(tps)) != len(tps):
        raise ValueError(f"expected one write per partition in a batch, found {len(tps)} writes to {len(set(tps))}")
    plans: dict[TopicPartition, Plan] = {}
    answers: dict[TopicPartition, dict[str, Any]] = {}
    for tp, r in zip(tps, requests, strict=True):
        try:
            plans[tp] = _WRITES[check_request("metadata", r)](tier, r)
        except KcompactError as e:
            answers[tp] = _error(tier, e)
    now_ms = max((int(r["event_timestamp_ms"]) for r in requests), default=0)
    outcomes = commit_current_batch(tier.table, plans, now_ms, attempts=_ATTEMPTS, reader=tier.follower)
    landed = [tp for tp, outcome in outcomes.items() if isinstance(outcome, CommitResult)]
    snapshots = tier.follower.partitions(landed)
    for tp, outcome in outcomes.items():
        if isinstance(outcome, _Overlaps):
            try:
                answers[tp] = {"ok": True, "result": _copied_in_two(tier, requests[tps.index(tp)])}
            except KcompactError as e:
                answers[tp] = _error(tier, e)
        else:
            answers[tp] = _error(tier, outcome) if isinstance(outcome, KcompactError) else {
                "ok": True, "result": _partition_json(snapshots[tp])}
    return {"answers": [answers[tp] for tp in tps]}


def _add_plan(tier: RemoteTier, req: Mapping[str, Any]) -> Plan:
    return _new_row_plan(req, new_segment(req), overlapping=True)


def _new_row_plan(req: Mapping[str, Any], segment: NewSegment, *, overlapping: bool) -> Plan:
    """The broker's new row `segment`, refused for a deposed leader's (`check_leader_epoch`); unless `overlapping`,
    one that starts within the tier's live segments raises `_Overlaps`."""
    writer = broker_writer(req["broker_id"])

    def plan(current: PartitionSnapshot) -> ChangeSet:
        check_leader_epoch(current, segment, writer)
        end = tier_end(current)
        if not overlapping and end is not None and segment.start_offset <= end:
            raise _Overlaps(f"segment {segment.segment_id} starts at {segment.start_offset}, in the tier (to {end})")
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                      new_segments=(segment,), topic_id=req["topic_id"])

    return plan


def _update_plan(tier: RemoteTier, req: Mapping[str, Any]) -> Plan:
    """updateRemoteLogSegmentMetadata. A copy going COPY_SEGMENT_FINISHED that overlaps the live segments (a new
    leader's first copy after a failover, whose replica rolled elsewhere) goes live trimmed to the offsets above the
    tier's end, or is superseded when it holds none (`compaction.tier.overlap`); the trimmed objects are written once
    for each tier end a plan meets."""
    segment_id, state, writer = req["segment_id"], SegmentState(req["state"]), broker_writer(req["broker_id"])
    transactional = req["transactional"] if state is SegmentState.COPY_SEGMENT_FINISHED else None
    trimmed: dict[int, NewSegment] = {}

    def plan(current: PartitionSnapshot) -> ChangeSet:
        row, end = current.segment(segment_id), tier_end(current)
        overlaps = (state is SegmentState.COPY_SEGMENT_FINISHED and row is not None and end is not None
                    and row.state is SegmentState.COPY_SEGMENT_STARTED and row.start_offset <= end)
        if not overlaps:
            return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                          state_changes=(StateChange(segment_id, state, transactional),))
        assert row is not None and end is not None
        superseded = StateChange(segment_id, SegmentState.DELETE_SEGMENT_STARTED)
        if row.end_offset <= end:
            return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                          state_changes=(superseded,))
        if end not in trimmed:
            trimmed[end] = trim_copy(tier.store, row, end + 1, new_kafka_uuid())
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                      new_segments=(trimmed[end],), state_changes=(superseded,))

    return plan


class _Overlaps(KcompactError):
    """A `copy` overlapping the tier's live segments: committed in two steps instead (`_copied_in_two`)."""


def _copy_plan(tier: RemoteTier, req: Mapping[str, Any]) -> Plan:
    finished = replace(new_segment(req), state=SegmentState.COPY_SEGMENT_FINISHED, transactional=req["transactional"])
    return _new_row_plan(req, finished, overlapping=False)


_WRITES.update(add=_add_plan, update=_update_plan, copy=_copy_plan)


def _segment_json(s: SegmentMetadata, live: bool) -> dict[str, Any]:
    """A row as the broker's plugin reads it, `parts` the files it reads from the segment's `.indexes` object
    (`compaction.storage.indexes`; the others are objects of their own). A segment that holds no batch (a
    compaction output that kept nothing, whose row carries its inputs' largest timestamp for retention) shows the
    broker no timestamp: its
    `RemoteLogManager.findOffsetByTimestamp` looks only in the first segment whose maxTimestampMs reaches the target,
    and would find nothing there."""
    return {
        "segment_id": s.segment_id, "topic_id": s.topic_id, "start_offset": s.start_offset,
        "end_offset": s.end_offset, "max_timestamp_ms": s.max_timestamp_ms if s.segment_size_bytes else -1,
        "event_timestamp_ms": s.event_timestamp_ms, "segment_size_bytes": s.segment_size_bytes,
        "state": s.state.value, "live": live, "writer": s.writer,
        "leader_epochs": [[e.epoch, e.start_offset] for e in s.segment_leader_epochs],
        "txn_index": s.object_key(Suffix.TXN_INDEX) is not None,
        "parts": [o.suffix.value for o in s.object_keys if o.suffix is not Suffix.INDEXES and is_parts_key(o.key)],
    }


def _partition_json(snap: PartitionSnapshot) -> dict[str, Any]:
    live = {s.segment_id for s in snap.live_segments}
    return {"topic": snap.topic, "partition": snap.partition, "version": snap.version,
            "segments": [_segment_json(s, s.segment_id in live) for s in snap.segments]}


def segments(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    """One partition's `load`."""
    (partition,) = load(tier, {"partitions": [req]})["partitions"]
    return partition


def load(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    """`segments` for many partitions at once (a broker that just became leader of them), at one version: one look
    at the log, and the partitions' files read together."""
    tier.follower.follow()
    tps = [TopicPartition(p["topic"], p["partition"]) for p in req["partitions"]]
    snapshots = tier.follower.partitions(tps)
    return {"version": tier.follower.version, "partitions": [_partition_json(snapshots[tp]) for tp in tps]}


def follow(tier: RemoteTier, req: Mapping[str, Any]) -> dict[str, Any]:
    """The newest version and the partitions asked for before that another writer's commit changed after `since`;
    `reset` (and no partitions) when `since` is older than the follower's first version: the client drops what it
    holds. A partition changed after `since` only by this process's own commits is left out: the client had its rows
    in the answer to each of those writes (or, the write failed, dropped its view), and a broker tiering every
    partition it leads would otherwise have them all sent again on every follow."""
    version, since = tier.follower.follow(), int(req["since"])
    if since < tier.follower.first_version:
        return {"version": version, "reset": True, "partitions": []}
    changed = tier.follower.changed_since(since, by_others=True)
    snapshots = tier.follower.partitions(changed)
    return {"version": version, "reset": False, "partitions": [_partition_json(snapshots[tp]) for tp in changed]}


_OPS: dict[str, Callable[[RemoteTier, Mapping[str, Any]], Any]] = {
    "add": add, "copy": copy, "update": update, "batch": batch, "segments": segments, "load": load, "follow": follow,
}


def _error(tier: RemoteTier, e: KcompactError) -> dict[str, Any]:
    return {"ok": False, "error": str(e).replace("\n", " "), "type": type(e).__name__,
            "version": tier.follower.version}


def answer(tier: RemoteTier, line: str) -> dict[str, Any]:
    """The answer to one request line. Any failure is an error answer, so the broker gets it as a
    RemoteStorageException and the process goes on serving: a kcompact error with its message, anything else (a bad
    request, a bug) with its type and message."""
    try:
        req = json.loads(line)
        return {"ok": True, "result": _OPS[check_request("metadata", req)](tier, req)}
    except KcompactError as e:
        return _error(tier, e)
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e} (request: {line.strip()[:200]})".replace("\n", " "),
                "type": "InternalError", "version": tier.follower.version}


class HeldHeap:
    """Keeps Python's cyclic garbage collector off the followed table's state, so that no call waits for it to walk
    that state.

    The process holds every followed partition's rows as Python objects (~300,000 at 1,000 partitions). A full
    collection walks all of them: 80-380 ms at 1,000 partitions in P11b (BENCHMARKS.md), eleven times in four minutes,
    each stalling every write queued on the pipe, and none of them found anything to free: the state is acyclic, and
    what a request replaces is freed by its reference count. So after each answer the surviving objects are frozen
    (`gc.freeze`, which moves them out of the collector's generations at no cost), and a collection walks only what the
    current request allocated. Frozen objects are still freed by their reference counts; only a reference cycle among
    them would stay. To bound that, once the frozen objects have grown `growth` times since the last full collection
    (checked every `check_every` answers: counting them walks them), they are thawed and collected once."""

    def __init__(self, *, growth: float = 2.0, check_every: int = 1000) -> None:
        self.growth = growth
        self.check_every = check_every
        self.full_collections = 0
        self.answers = 0
        self._collect()

    def _collect(self) -> None:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._after = max(gc.get_freeze_count(), 1)
        self.full_collections += 1

    def answered(self) -> None:
        """After an answer went out: freeze what survived it; a full collection when the frozen objects grew."""
        gc.freeze()
        self.answers += 1
        if self.answers % self.check_every == 0 and gc.get_freeze_count() > self.growth * self._after:
            self._collect()


def serve(tier: RemoteTier, requests: IO[str], answers: IO[str], heap: HeldHeap | None = None) -> None:
    """Answer every request line of `requests` until it closes; `heap`: the process's `HeldHeap`, told of each answer
    once it went out."""
    for line in requests:
        if line.strip():
            answers.write(json.dumps(answer(tier, line)) + "\n")
            answers.flush()
            if heap is not None:
                heap.answered()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store holding _kcompact_metadata")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS's)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store = open_store(args.store, endpoint_url=args.endpoint_url)
    tier = RemoteTier.of(table_in_store(store, create=True), store)
    sys.stdout.write(json.dumps({"ok": True, "result": {"ready": tier.follower.version}}) + "\n")
    sys.stdout.flush()
    serve(tier, sys.stdin, sys.stdout, HeldHeap())


if __name__ == "__main__":
    main()
