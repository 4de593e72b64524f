"""What "nothing lost" means in the reliability tests, written once: the latest-per-key view and the orphan check.

`latest_view` is what a read_committed consumer of a partition's live segments ends up with per key, under
the topic's compaction strategy (KIP-280: the record of greatest rank wins, not necessarily the last one).
A key whose winner is a tombstone maps to an entry with value None. A compaction, a crash, a rerun or a gc
must never change the view, with one exception: a tombstone past its delete horizon may go, and its key with
it (`view_differences(..., expired=...)` says which ones may).

`store_problems` is what a gc with every grace passed must leave: no object outside the metadata table that
no row accounts for, and no live segment whose object is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from compaction.config import CompactionStrategy, KcompactConfig
from compaction.format.batch import Header, Record
from compaction.metadata import METADATA_TABLE_NAME, SegmentState, referenced_object_keys, table_in_store
from compaction.reader import Isolation, consumer_records, log_refs
from compaction.storage import ObjectStore
from compaction.wal.model import WAL_TABLE_NAME
from compaction.wal.table import WalTable

Entry = tuple[int, int, bytes | None, tuple[Header, ...]]  # offset, timestamp, value, headers
View = dict[bytes, Entry]


@dataclass(frozen=True)
class Strategy:
    """A topic's compaction.strategy and compaction.strategy.header, as the view ranks records."""

    kind: CompactionStrategy = CompactionStrategy.OFFSET
    header: str | None = None

    @classmethod
    def of(cls, config: KcompactConfig, topic: str) -> Strategy:
        c = config.for_topic(topic)
        return cls(c.compaction_strategy, c.compaction_strategy_header)

    def rank(self, r: Record) -> tuple[int, int, int]:
        """KIP-280's (has_version, version, offset), computed plainly from the decoded record."""
        if self.kind is CompactionStrategy.TIMESTAMP:
            return (1, r.timestamp, r.offset)
        if self.kind is CompactionStrategy.HEADER:
            values = [h.value for h in r.headers if h.key == self.header]
            last = values[-1] if values else None
            if last is not None and len(last) == 8:
                return (1, int.from_bytes(last, "big", signed=True), r.offset)
        return (0, 0, r.offset)


OFFSET = Strategy()


def latest_view(store: ObjectStore, topic: str, partition: int, strategy: Strategy = OFFSET) -> View:
    """Per key, the winning record a read_committed consumer of the whole log sees (tombstones included)."""
    refs = log_refs(store, topic, partition)  # the live segments, then the WAL tail if any
    best: dict[bytes, tuple[tuple[int, int, int], Record]] = {}
    for r in consumer_records(store, refs, isolation=Isolation.READ_COMMITTED):
        if r.key is None:
            continue
        rank = strategy.rank(r)
        if r.key not in best or rank > best[r.key][0]:
            best[r.key] = (rank, r)
    return {k: (r.offset, r.timestamp, r.value, r.headers) for k, (_rank, r) in best.items()}


def views(
    store: ObjectStore, partitions: Iterable[tuple[str, int]], strategies: Mapping[str, Strategy] | None = None
) -> dict[tuple[str, int], View]:
    """`latest_view` of every partition in `partitions`."""
    return {(t, p): latest_view(store, t, p, (strategies or {}).get(t, OFFSET)) for t, p in partitions}


def view_differences(
    before: Mapping[tuple[str, int], View],
    after: Mapping[tuple[str, int], View],
    expired: Callable[[tuple[str, int], Entry], bool] | None = None,
    log_starts: Mapping[tuple[str, int], int] | None = None,
) -> list[str]:
    """One line per key whose entry differs (missing, extra or changed), for readable assertion messages.

    `expired(tp, entry)` says whether a tombstone `entry` of `before` was past its delete horizon, so that
    its key may be missing from `after`; `log_starts` where retention (compact,delete, offset strategy) moved a
    partition's log start: a key whose entry lay below it may be missing too.
    """
    out = []
    for tp in sorted(before.keys() | after.keys()):
        b, a = before.get(tp, {}), after.get(tp, {})
        for key in sorted(b.keys() | a.keys()):
            gone = b.get(key)
            if key not in a and gone is not None and gone[2] is None and expired is not None and expired(tp, gone):
                continue
            if key not in a and gone is not None and gone[0] < (log_starts or {}).get(tp, 0):
                continue
            if b.get(key) != a.get(key):
                was, now = b.get(key), a.get(key)
                out.append(f"{tp[0]}-{tp[1]} key {key!r}: before {was and was[:2]}, after {now and now[:2]}")
    return out


def store_problems(store: ObjectStore) -> list[str]:
    """Orphans (objects no row in any state but DELETE_SEGMENT_FINISHED references, outside the metadata
    table) and live segments with a missing object. Empty after a gc with every grace passed."""
    snapshot = table_in_store(store).snapshot()
    wal = [o for o in WalTable.in_store(store).objects() if o.state is not SegmentState.DELETE_SEGMENT_FINISHED]
    referenced = referenced_object_keys(snapshot) | {o.key for o in wal}
    tables = (METADATA_TABLE_NAME + "/", WAL_TABLE_NAME + "/")
    listed = {o.key for o in store.list("") if not o.key.startswith(tables)}
    problems = [f"orphan: {key}" for key in sorted(listed - referenced)]
    for tp, part in sorted(snapshot.partitions.items()):
        for seg in part.live_segments:
            problems.extend(f"{tp.topic}-{tp.partition}: live segment {seg.segment_id} lost {o.key}"
                            for o in seg.object_keys if o.key not in listed)
    return problems
