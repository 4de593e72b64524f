"""Pure parts of compaction.metadata: state transitions, row conversion, cleaner-offset lineage, row sets."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.errors import (
    CommitConflictError,
    ConfigError,
    CorruptMetadataError,
    FencedError,
    InvalidStateTransitionError,
    MetadataInvariantError,
    TopicIdMismatchError,
)
from compaction.metadata.change_set import (
    ChangeSet,
    NewSegment,
    StateChange,
    acquire_rows,
    apply_change_set,
    merge_leader_epochs,
)
from compaction.metadata.lineage import bound, valid_cleaner_offsets, with_entry
from compaction.metadata.model import (
    LEGACY_METADATA_SCHEMA,
    METADATA_SCHEMA,
    CleanerOffset,
    EpochEntry,
    ObjectKey,
    ObjectSuffix,
    PartitionState,
    SegmentMetadata,
    SegmentState,
    check_topic,
    check_transition,
    is_kafka_uuid,
    is_valid_transition,
    new_kafka_uuid,
    partition_from_row,
    partition_rows,
    rows_to_arrow,
    segment_from_row,
)
from compaction.metadata.snapshot import PartitionSnapshot, build_snapshot, referenced_object_keys
from tests.factories import TOPIC_ID, new_segment, segment

S0, S1, S2, S3 = SegmentState

# Kafka's RemoteLogSegmentState.isValidTransition, written out as a table (source, target) -> allowed.
KAFKA_TRANSITIONS = {
    (None, S0): True, (None, S1): False, (None, S2): False, (None, S3): False,
    (S0, S0): True, (S0, S1): True, (S0, S2): True, (S0, S3): False,
    (S1, S0): False, (S1, S1): True, (S1, S2): True, (S1, S3): False,
    (S2, S0): False, (S2, S1): False, (S2, S2): True, (S2, S3): True,
    (S3, S0): False, (S3, S1): False, (S3, S2): False, (S3, S3): True,
}  # fmt: skip


def co(*pairs: tuple[int, int]) -> tuple[CleanerOffset, ...]:
    return tuple(CleanerOffset(e, o) for e, o in pairs)


def seg(start: int, end: int, *, vector: tuple[CleanerOffset, ...] = (), state: SegmentState = S1,
        segment_id: str | None = None) -> SegmentMetadata:
    return segment(start, end, segment_id=segment_id, max_ts=1_000 + end, event_ts=5, state=state,
                   cleaner_offsets=vector)


def new(start: int, end: int, state: SegmentState = S1) -> NewSegment:
    return new_segment(start, end, max_ts=end, leader_epoch=3, size=10, state=state,
                       suffixes=(ObjectSuffix.LOG, ObjectSuffix.OFFSET_INDEX))


def state(epoch: int = 1, commit_seq: int = 1, vector: tuple[CleanerOffset, ...] = ()) -> PartitionState:
    return PartitionState("t", TOPIC_ID, 0, epoch, commit_seq, vector, (), 0, "w")


def snap(st_: PartitionState | None, *segments: SegmentMetadata) -> PartitionSnapshot:
    return PartitionSnapshot("t", 0, 7, st_, tuple(sorted(segments, key=lambda s: s.start_offset)))


def plan(current: PartitionSnapshot, **kw: Any) -> ChangeSet:
    kw.setdefault("fencing_epoch", current.fencing_epoch)
    return ChangeSet.planned_from(current, writer="run-a", topic_id=TOPIC_ID, **kw)


# --- state transitions -------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new_state"), list(KAFKA_TRANSITIONS))
def test_transitions_match_kafka(old: SegmentState | None, new_state: SegmentState) -> None:
    assert is_valid_transition(old, new_state) is KAFKA_TRANSITIONS[(old, new_state)]
    if KAFKA_TRANSITIONS[(old, new_state)]:
        check_transition("x", old, new_state)
    else:
        with pytest.raises(InvalidStateTransitionError, match=f"-> {new_state.name}"):
            check_transition("x", old, new_state)


# --- identifiers -------------------------------------------------------------------------------------


def test_new_kafka_uuid_is_16_bytes_and_never_starts_with_dash() -> None:
    for _ in range(2_000):
        text = new_kafka_uuid()
        assert len(text) == 22 and not text.startswith("-") and is_kafka_uuid(text)
        assert len(base64.urlsafe_b64decode(text + "==")) == 16


@pytest.mark.parametrize("text", ["", "AAAAAAAAAAAAAAAAAAAAAB", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAA+Q"])
def test_malformed_uuids_are_rejected(text: str) -> None:
    assert not is_kafka_uuid(text)


@pytest.mark.parametrize("topic", ["", ".", "..", "a'b", "a b", "x" * 250])
def test_illegal_topic_names_are_refused(topic: str) -> None:
    with pytest.raises(ConfigError):
        check_topic(topic)


# --- rows --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transactional", [True, False, None])
def test_rows_round_trip_through_arrow(transactional: bool | None) -> None:
    s = seg(0, 99, vector=co((1, 50)))
    s = SegmentMetadata(**{**s.__dict__, "record_count": 7, "first_batch_max_timestamp_ms": 3, "run_id": "r",
                           "transactional": transactional})
    p = PartitionState("t", TOPIC_ID, 0, 2, 9, co((1, 50), (2, 60)), (EpochEntry(0, 0),), 11, "w", None)
    table = rows_to_arrow([p], [s])
    assert table.schema.equals(METADATA_SCHEMA)
    part_row, seg_row = table.to_pylist()
    assert partition_from_row(part_row) == p
    assert segment_from_row(seg_row) == s
    assert seg_row["commit_seq"] is None and part_row["segment_id"] is None and part_row["transactional"] is None
    legacy = rows_to_arrow([p], [s], LEGACY_METADATA_SCHEMA)  # a table created before the column
    assert legacy.schema.equals(LEGACY_METADATA_SCHEMA) and "transactional" not in legacy.schema.names
    assert segment_from_row(legacy.to_pylist()[1]) == replace(s, transactional=None)


@pytest.mark.parametrize("schema", [METADATA_SCHEMA, LEGACY_METADATA_SCHEMA])
def test_partition_rows_are_each_partitions_own_rows(schema: Any) -> None:
    """A commit's files are built from each partition's rows as dicts: exactly the rows of the table built for its
    partition alone, a partition without segments included."""
    parts = [(PartitionState("t", TOPIC_ID, n, 2, 9, (), (EpochEntry(0, 0),), 11, "w", None),
              [replace(seg(100 * i, 100 * i + 99, segment_id=f"s-{n}-{i}"), partition=n) for i in range(n)])
             for n in range(4)]
    rows = partition_rows(parts)
    assert [len(r) for r in rows] == [1, 2, 3, 4]
    for (state, segments), part in zip(parts, rows, strict=True):
        assert pa.Table.from_pylist(part, schema=schema).to_pylist() == rows_to_arrow([state], segments,
                                                                                       schema).to_pylist()


# --- cleaner-offset lineage (docs/fencing.md) ----------------------------------------------------------

SEED_ROWS = {
    "seg-0": seg(0, 99, vector=co((0, 100)), segment_id="seg-0"),
    "seg-2": seg(200, 299, vector=co((0, 100), (1, 155)), segment_id="seg-2"),
    "seg-1": seg(100, 199, vector=co((0, 123)), segment_id="seg-1"),
}


@pytest.mark.parametrize("order", list(itertools.permutations(SEED_ROWS)))
def test_the_zombie_row_is_rejected_in_any_arrival_order(order: tuple[str, ...]) -> None:
    lineage = valid_cleaner_offsets(SEED_ROWS[k] for k in order)
    assert lineage.rejected == {"seg-1"}
    assert lineage.offsets == co((0, 100), (1, 155))
    assert lineage.current == 155


def test_acquired_epoch_pins_older_epochs_before_any_new_segment() -> None:
    after_acquire = state(epoch=2, vector=co((1, 100), (2, 100)))
    zombie = seg(100, 199, vector=co((1, 123)))
    honest = seg(0, 99, vector=co((1, 100)))
    lineage = valid_cleaner_offsets([after_acquire, zombie, honest])
    assert lineage.rejected == {zombie.segment_id}
    assert lineage.offsets == co((1, 100), (2, 100))


def test_vector_naming_an_ungranted_epoch_is_rejected() -> None:
    forged = seg(0, 9, vector=co((1, 5), (9, 5)))
    assert valid_cleaner_offsets([state(epoch=1, vector=co((1, 5))), forged]).rejected == {forged.segment_id}


def test_a_zombie_vector_does_not_pin_honest_rows() -> None:
    """Found by the property test below: {1: 2} lacks epoch 0's entry, so taken as evidence it would pin
    epoch 0 at 0 and reject honest rows; it must be rejected before it may pin anything."""
    honest = seg(0, 9, vector=co((0, 1)))
    later = seg(10, 19, vector=co((0, 1), (1, 1), (2, 1)))
    zombie = seg(20, 29, vector=co((1, 2)))
    assert valid_cleaner_offsets([honest, later, zombie]).rejected == {zombie.segment_id}


def test_epoch_without_entry_is_bounded_by_the_previous_one() -> None:
    assert bound(co((1, 10), (4, 40)), 3) == 10
    assert bound(co((1, 10), (4, 40)), 0) == 0
    zombie_of_epoch_3 = seg(0, 9, vector=co((1, 10), (3, 30)))
    assert valid_cleaner_offsets([seg(0, 1, vector=co((1, 10), (4, 40))), zombie_of_epoch_3]).rejected == {
        zombie_of_epoch_3.segment_id
    }


def test_with_entry_refuses_going_back() -> None:
    assert with_entry(co((1, 10)), 2, 10) == co((1, 10), (2, 10))
    assert with_entry(co((1, 10), (2, 10)), 2, 30) == co((1, 10), (2, 30))
    with pytest.raises(MetadataInvariantError, match="expected >= 10, found 9"):
        with_entry(co((1, 10)), 1, 9)
    with pytest.raises(MetadataInvariantError, match="expected an epoch >= 2"):
        with_entry(co((2, 10)), 1, 50)


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 50)), min_size=1, max_size=8), st.data())
def test_lawful_histories_are_never_rejected_and_zombies_always_are(
    steps: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Replay acquires and commits; every vector ever published is valid, in any order, and any claim
    above what an epoch had published when the next epoch was acquired is rejected."""
    vector: tuple[CleanerOffset, ...] = ()
    published: list[SegmentMetadata | PartitionState] = []
    finals: dict[int, int] = {}
    epoch = 0
    for acquires, advance in steps:
        for _ in range(acquires - 1):
            finals[epoch] = vector[-1].offset if vector else 0
            epoch += 1
            vector = with_entry(vector, epoch, vector[-1].offset if vector else 0)
        vector = with_entry(vector, epoch, (vector[-1].offset if vector else 0) + advance)
        published.append(seg(0, 1, vector=vector))
    rows: list[SegmentMetadata | PartitionState] = data.draw(
        st.permutations([*published, state(epoch=epoch, vector=vector)])
    )
    assert valid_cleaner_offsets(rows).rejected == frozenset()
    if finals:
        old_epoch = data.draw(st.sampled_from(sorted(finals)))
        zombie = seg(0, 1, vector=co((old_epoch, finals[old_epoch] + 1)))
        assert valid_cleaner_offsets([*rows, zombie]).rejected == {zombie.segment_id}


# --- row-set computation -----------------------------------------------------------------------------


def test_first_commit_to_a_new_partition() -> None:
    n = new(0, 99)
    rows = apply_change_set(snap(None), plan(snap(None), new_segments=[n], cleaner_offset=0), now_ms=42)
    assert rows.state.commit_seq == 1 and rows.state.fencing_epoch == 0 and rows.state.updated_ms == 42
    (s,) = rows.segments
    assert (s.segment_id, s.state, s.event_timestamp_ms, s.writer) == (n.segment_id, S1, 42, "run-a")
    assert s.cleaner_offsets == co((0, 0)) == rows.state.cleaner_offsets
    assert rows.state.leader_epochs == (EpochEntry(3, 0),)


def test_compaction_swaps_segments_in_one_row_set() -> None:
    a, b, c = seg(0, 99), seg(100, 199), seg(200, 299)
    current = snap(state(epoch=1, commit_seq=4, vector=co((1, 0))), a, b, c)
    merged = new(0, 199)
    cs = plan(
        current,
        new_segments=[merged],
        state_changes=[StateChange(a.segment_id, S2), StateChange(b.segment_id, S2)],
        cleaner_offset=200,
    )
    rows = apply_change_set(current, cs, now_ms=9)
    got = {s.segment_id: s.state for s in rows.segments}
    assert got == {a.segment_id: S2, b.segment_id: S2, c.segment_id: S1, merged.segment_id: S1}
    assert rows.state.commit_seq == 5 and rows.state.cleaner_offsets == co((1, 200))
    assert [s.start_offset for s in rows.segments] == sorted(s.start_offset for s in rows.segments)


def test_preconditions_say_expected_and_found() -> None:
    current = snap(state(epoch=4, commit_seq=8))
    stale_epoch = ChangeSet("t", TOPIC_ID, 0, 3, 8, 3, "zombie")
    with pytest.raises(FencedError, match="expected fencing epoch 3, found 4"):
        apply_change_set(current, stale_epoch, 0)
    stale_seq = ChangeSet("t", TOPIC_ID, 0, 3, 7, 4, "late")
    with pytest.raises(CommitConflictError, match="expected commit_seq 7, found 8") as info:
        apply_change_set(current, stale_seq, 0)
    assert not isinstance(info.value, FencedError)
    with pytest.raises(TopicIdMismatchError):
        apply_change_set(current, ChangeSet("t", "BBBBBBBBBBBBBBBBBBBBBA", 0, 3, 8, 4, "w"), 0)


@pytest.mark.parametrize(
    ("make_changes", "error", "message"),
    [
        (
            lambda s: {"state_changes": [StateChange(s.segment_id, S0)]},
            InvalidStateTransitionError,
            "-> COPY",
        ),
        (
            lambda s: {"state_changes": [StateChange(s.segment_id, S3)]},
            InvalidStateTransitionError,
            "FINISHED",
        ),
        (lambda s: {"state_changes": [StateChange("nope", S2)]}, MetadataInvariantError, "unknown segment"),
        (lambda s: {"new_segments": [new(50, 150)]}, MetadataInvariantError, "overlap"),
        (lambda s: {"new_segments": [new(200, 300, state=S2)]}, InvalidStateTransitionError, "DELETE"),
        (lambda s: {"cleaner_offset": 5}, MetadataInvariantError, "must not go back"),
        (
            lambda s: {"state_changes": [StateChange(s.segment_id, S2), StateChange(s.segment_id, S2)]},
            MetadataInvariantError,
            "twice",
        ),
    ],
)
def test_wrong_change_sets_are_refused(
    make_changes: Callable[[SegmentMetadata], dict[str, Any]], error: type[Exception], message: str
) -> None:
    live = seg(0, 99)
    current = snap(state(epoch=1, commit_seq=2, vector=co((1, 10))), live)
    with pytest.raises(error, match=message):
        apply_change_set(current, plan(current, **make_changes(live)), 0)


def test_new_segment_may_overlap_a_retired_or_started_one() -> None:
    retired, started = seg(0, 99, state=S2), seg(100, 199, state=S0)
    current = snap(state(), retired, started)
    rows = apply_change_set(current, plan(current, new_segments=[new(0, 199)]), 0)
    assert len(rows.segments) == 3


def test_new_segment_needs_a_log_key_and_ordered_epochs() -> None:
    current = snap(state())
    no_log = NewSegment(new_kafka_uuid(), 0, 9, 0, (EpochEntry(0, 0),), 1, (ObjectKey(ObjectSuffix.BLOOM, "k"),))
    with pytest.raises(MetadataInvariantError, match=r"\.log key"):
        apply_change_set(current, plan(current, new_segments=[no_log]), 0)
    epochs = (EpochEntry(2, 5), EpochEntry(1, 6))
    unordered = NewSegment(new_kafka_uuid(), 0, 9, 0, epochs, 1, (ObjectKey(ObjectSuffix.LOG, "k"),))
    with pytest.raises(MetadataInvariantError, match="leader epochs"):
        apply_change_set(current, plan(current, new_segments=[unordered]), 0)


def test_merge_leader_epochs_keeps_first_offsets() -> None:
    merged = merge_leader_epochs([EpochEntry(0, 0), EpochEntry(2, 50)], [EpochEntry(2, 40), EpochEntry(3, 90)])
    assert merged == (EpochEntry(0, 0), EpochEntry(2, 40), EpochEntry(3, 90))


def test_acquire_bumps_epoch_and_pins_the_vector() -> None:
    rows = acquire_rows(snap(state(epoch=1, commit_seq=3, vector=co((1, 100)))), None, "b", 5)
    assert rows.state.fencing_epoch == 2 and rows.state.commit_seq == 4
    assert rows.state.cleaner_offsets == co((1, 100), (2, 100))
    first = acquire_rows(snap(None), TOPIC_ID, "a", 5)
    assert first.state.fencing_epoch == 1 and first.state.cleaner_offsets == co((1, 0))
    with pytest.raises(MetadataInvariantError, match="topic_id"):
        acquire_rows(snap(None), None, "a", 5)
    with pytest.raises(TopicIdMismatchError):
        acquire_rows(snap(state()), "BBBBBBBBBBBBBBBBBBBBBA", "a", 5)


# --- snapshots ---------------------------------------------------------------------------------------


def test_live_segments_are_finished_and_not_zombie() -> None:
    part = state(epoch=2, vector=co((1, 100), (2, 100)))
    live, started, deleted = seg(0, 99, vector=co((1, 100))), seg(300, 399, state=S0), seg(0, 49, state=S2)
    zombie = seg(100, 199, vector=co((1, 123)))
    p = snap(part, live, started, deleted, zombie)
    assert p.live_segments == (live,)
    assert p.zombie_segments == (zombie,)


def test_two_partition_rows_or_repeated_ids_are_corrupt() -> None:
    with pytest.raises(CorruptMetadataError, match="two partition rows"):
        build_snapshot(3, [state(), state()], [])
    s = seg(0, 9)
    with pytest.raises(CorruptMetadataError, match="repeat"):
        build_snapshot(3, [state()], [s, s])


def test_referenced_keys_skip_finished_deletions() -> None:
    kept = [seg(0, 9, state=S0), seg(10, 19, state=S1), seg(20, 29, state=S2)]
    gone = seg(30, 39, state=S3)
    snapshot = build_snapshot(1, [state()], [*kept, gone])
    assert referenced_object_keys(snapshot) == {s.object_keys[0].key for s in kept}
