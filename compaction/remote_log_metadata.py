"""The metadata table as a Kafka broker's RemoteLogMetadataManager sees it, served over a pipe.

The tiered plugin (`kafka/tiered-plugin`, `KcompactRemoteLogMetadataManager`) starts
`python -m compaction.remote_log_metadata --store STORE [--endpoint-url URL]` (a directory or `s3://bucket/prefix`)
and speaks JSON lines with it on stdin/stdout: one
request per line, one answer per line, in order. The table is read and written here, through the same
delta-rs commit path every other kcompact writer uses (`compaction.metadata.commit`), so the broker's rows
are kcompact's rows by construction, conditional commits and fencing included. The broker owns the process's
life: it ends when its stdin closes (the broker closed the manager, or died), and ignores SIGTERM and SIGINT, which
a broker's own stop may send its whole process group while the broker still finishes a copy.

Requests (`op` and its fields; every answer is `{"ok": true, "result": ...}` or
`{"ok": false, "error": "<one line>", "type": "<kcompact error class>", "version": <the table's latest version>}`):

- `add`: KIP-405's addRemoteLogSegmentMetadata. A row in COPY_SEGMENT_STARTED with the object keys of
  `compaction.storage.layout`, the `.txnindex` only when the broker says the segment has one.
- `update`: updateRemoteLogSegmentMetadata: `segment_id` moves to `state`.
- `segments`: every segment row of a partition, each with `live` (COPY_SEGMENT_FINISHED and not a zombie),
  and the table version read.

Two epochs, kept apart. The broker's rows carry the leader epochs Kafka gives each segment
(`RemoteLogSegmentMetadata.segmentLeaderEpochs`), which also grow the partition's leader-epoch lineage, and a broker
is fenced by them: an `add` whose segment's latest leader epoch is older than the lineage's latest is a deposed
leader's and is refused (`FencedError`). kcompact's fencing epoch (docs/fencing.md) is the cleaner's alone: the
broker holds none and writes under the partition's current one, so a run acquiring the partition never fences the
broker, and the broker's appends never fence a run (a compaction rebases over them, `compaction.metadata.rebase`).
A plain conflict with another writer is re-planned and retried a few times, as `kcompact tier` does.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

from compaction.errors import CommitConflictError, FencedError, KcompactError
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
    broker_writer,
    commit,
    table_in_store,
)
from compaction.storage import open_store
from compaction.storage.layout import Suffix, segment_object_key

_ATTEMPTS = 5
_SUFFIXES = (Suffix.LOG, Suffix.OFFSET_INDEX, Suffix.TIME_INDEX, Suffix.PRODUCER_SNAPSHOT,
             Suffix.LEADER_EPOCH_CHECKPOINT)


def _committed(table: MetadataTable, topic: str, partition: int, now_ms: int,
               plan: Callable[[PartitionSnapshot], ChangeSet]) -> int:
    """Plan against the latest partition and commit; a plain conflict is re-planned, a fenced writer never. The new
    table version."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return commit(table, plan(table.partition_snapshot(topic, partition)), now_ms).version
        except FencedError:
            raise
        except CommitConflictError:
            if attempt == _ATTEMPTS:
                raise
    raise AssertionError("unreachable")


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


def add(table: MetadataTable, req: Mapping[str, Any]) -> int:
    segment, writer = new_segment(req), broker_writer(req["broker_id"])

    def plan(current: PartitionSnapshot) -> ChangeSet:
        check_leader_epoch(current, segment, writer)
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                      new_segments=(segment,), topic_id=req["topic_id"])

    return _committed(table, req["topic"], req["partition"], req["event_timestamp_ms"], plan)


def update(table: MetadataTable, req: Mapping[str, Any]) -> int:
    change, writer = StateChange(req["segment_id"], SegmentState(req["state"])), broker_writer(req["broker_id"])
    return _committed(table, req["topic"], req["partition"], req["event_timestamp_ms"], lambda current:
                      ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer,
                                             state_changes=(change,)))


def _segment_json(s: SegmentMetadata, live: bool) -> dict[str, Any]:
    """A row as the broker's plugin reads it. A segment that holds no batch (a compaction output that kept nothing,
    whose row carries its inputs' largest timestamp for retention) shows the broker no timestamp: its
    `RemoteLogManager.findOffsetByTimestamp` looks only in the first segment whose maxTimestampMs reaches the target,
    and would find nothing there."""
    return {
        "segment_id": s.segment_id, "topic_id": s.topic_id, "start_offset": s.start_offset,
        "end_offset": s.end_offset, "max_timestamp_ms": s.max_timestamp_ms if s.segment_size_bytes else -1,
        "event_timestamp_ms": s.event_timestamp_ms, "segment_size_bytes": s.segment_size_bytes,
        "state": s.state.value, "live": live, "writer": s.writer,
        "leader_epochs": [[e.epoch, e.start_offset] for e in s.segment_leader_epochs],
        "txn_index": s.object_key(Suffix.TXN_INDEX) is not None,
    }


def segments(table: MetadataTable, req: Mapping[str, Any]) -> dict[str, Any]:
    snap = table.partition_snapshot(req["topic"], req["partition"])
    live = {s.segment_id for s in snap.live_segments}
    return {"version": snap.version,
            "segments": [_segment_json(s, s.segment_id in live) for s in snap.segments]}


_OPS: dict[str, Callable[[MetadataTable, Mapping[str, Any]], Any]] = {
    "add": add, "update": update, "segments": segments,
}


def answer(table: MetadataTable, line: str) -> dict[str, Any]:
    """The answer to one request line. Any failure is an error answer, so the broker gets it as a
    RemoteStorageException and the process goes on serving: a kcompact error with its message, anything else (a bad
    request, a bug) with its type and message."""
    try:
        req = json.loads(line)
        return {"ok": True, "result": _OPS[req["op"]](table, req)}
    except KcompactError as e:
        return {"ok": False, "error": str(e).replace("\n", " "), "type": type(e).__name__,
                "version": _version(table)}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e} (request: {line.strip()[:200]})".replace("\n", " "),
                "type": "InternalError", "version": _version(table)}


def _version(table: MetadataTable) -> int | None:
    """The table's latest version, which an error answer names; None if the table cannot be read either."""
    try:
        return table.version()
    except KcompactError:
        return None


def serve(table: MetadataTable, requests: IO[str], answers: IO[str]) -> None:
    """Answer every request line of `requests` until it closes."""
    for line in requests:
        if line.strip():
            answers.write(json.dumps(answer(table, line)) + "\n")
            answers.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store holding _kcompact_metadata")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS's)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    table = table_in_store(open_store(args.store, endpoint_url=args.endpoint_url), create=True)
    sys.stdout.write(json.dumps({"ok": True, "result": {"ready": table.version()}}) + "\n")
    sys.stdout.flush()
    serve(table, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
