"""Hypothesis strategies for records and batches, shared by the format tests."""

from __future__ import annotations

from hypothesis import strategies as st

from compaction.format.batch import Header, Record, RecordBatch, TimestampType, build_batch
from compaction.format.codecs import Codec
from compaction.format.control import ControlType, end_txn_marker

maybe_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.lists(st.builds(Header, st.text(max_size=8), maybe_bytes), max_size=3).map(tuple)


@st.composite
def record_lists(draw: st.DrawFn, base_offset: int = 0) -> list[Record]:
    n = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    ts0 = draw(st.integers(0, 2**41))
    out = []
    off = base_offset
    for i in range(n):
        out.append(
            Record(
                off,
                ts0 + draw(st.integers(-10_000, 10_000)),
                draw(maybe_bytes),
                draw(maybe_bytes),
                draw(headers),
            )
        )
        off += gaps[i]
    return out


@st.composite
def data_batches(draw: st.DrawFn) -> RecordBatch:
    base = draw(st.integers(0, 2**40))
    records = draw(record_lists(base))
    extra = draw(st.integers(0, 3))
    pid = draw(st.sampled_from([-1, 7, 2**40]))
    return build_batch(
        records,
        last_offset=records[-1].offset + extra,
        codec=draw(st.sampled_from(list(Codec))),
        timestamp_type=draw(st.sampled_from(list(TimestampType))),
        transactional=pid >= 0 and draw(st.booleans()),
        producer_id=pid,
        producer_epoch=-1 if pid < 0 else draw(st.integers(0, 2**15 - 1)),
        base_sequence=-1 if pid < 0 else draw(st.integers(0, 2**31 - 1)),
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        delete_horizon_ms=draw(st.one_of(st.none(), st.integers(0, 2**42))),
    )


@st.composite
def control_batches(draw: st.DrawFn) -> RecordBatch:
    return end_txn_marker(
        draw(st.sampled_from([ControlType.ABORT, ControlType.COMMIT])),
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**41)),
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**15 - 1)),
        draw(st.integers(0, 2**31 - 1)),
    )


any_batches = st.one_of(data_batches(), control_batches())
