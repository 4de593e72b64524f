"""KIP-280's rule written once (`compaction.strategies.ranking`) and the executor's vectorized form of it
(`strategies.winner.ranks` over a scan, `segment_best` folding a segment's keys) give the same ranks and the same
winners, record by record, under every strategy: ties go to the higher offset, a missing, null or non-8-byte
header (or one with another name) is no version, and the last occurrence of the header counts."""

from __future__ import annotations

import struct

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.config import CompactionStrategy
from compaction.format.batch import Header, Record, build_batch, encode_batch
from compaction.format.scan import scan_segment
from compaction.strategies.ranking import Rank, Ranking, best_per_key, header_version
from compaction.strategies.winner import ranks, segment_best

HEADER = "version"
RANKINGS = [Ranking(), Ranking(CompactionStrategy.TIMESTAMP), Ranking(CompactionStrategy.HEADER, HEADER)]


def long(v: int) -> bytes:
    return struct.pack(">q", v)


# Few keys, versions and timestamps, so that ties and every kind of missing version are common.
HEADER_VALUES = st.one_of(st.integers(-2, 2).map(long), st.sampled_from([None, b"", b"\x00\x07", long(2**63 - 1)]))
HEADERS = st.lists(st.tuples(st.sampled_from([HEADER, "Version", "other"]), HEADER_VALUES), max_size=3)
RECORD = st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.integers(0, 3), HEADERS, st.booleans())


def records_of(raw: list[tuple[bytes, int, list[tuple[str, bytes | None]], bool]]) -> list[Record]:
    return [Record(offset, ts, key, None if tombstone else b"v", tuple(Header(k, v) for k, v in headers))
            for offset, (key, ts, headers, tombstone) in enumerate(raw)]


def scanned(records: list[Record]) -> pa.Table:
    return scan_segment(encode_batch(build_batch(records, max_timestamp=None)), header_key=HEADER).records


@settings(max_examples=150, deadline=None)
@given(st.lists(RECORD, min_size=1, max_size=30))
def test_the_vectorized_ranks_and_winners_are_the_reference(raw: list) -> None:
    records = records_of(raw)
    table = scanned(records)
    for ranking in RANKINGS:
        want = [ranking.rank(r) for r in records]
        got = ranks(table, ranking.strategy)
        assert list(zip(got.has_version.tolist(), got.version.tolist(), table["offset"].to_pylist(),
                        strict=True)) == want, ranking
        assert got.invalid_versions == (sum(1 - r.has_version for r in want)
                                        if ranking.strategy is CompactionStrategy.HEADER else 0)
        best = segment_best(table, (), ranking.strategy)
        folded = {k: Rank(h, v, o) for k, h, v, o in zip(best.keys.to_pylist(), best.has_version.to_pylist(),
                                                         best.version.to_pylist(), best.offset.to_pylist(),
                                                         strict=True)}
        assert folded == best_per_key((r.key, ranking.rank(r), ranking.rank(r)) for r in records), ranking


def test_the_rule_on_examples() -> None:
    a, b = [Record(0, 5, b"k", b"v", ()), Record(1, 5, b"k", b"v", ())]
    assert max(Ranking(CompactionStrategy.TIMESTAMP).rank(r) for r in (a, b)).offset == 1, "a tie: higher offset"
    header = Ranking(CompactionStrategy.HEADER, HEADER)
    present = Record(0, 0, b"k", b"v", (Header(HEADER, long(-5)),))
    last_counts = Record(1, 0, b"k", b"v", (Header(HEADER, long(9)), Header(HEADER, b"\x01")))
    assert header.rank(present) > header.rank(last_counts), "an invalid last occurrence is no version"
    assert header_version(None) == header_version(b"xx") == (0, 0) and header_version(long(-1)) == (1, -1)
    rows = [(b"a", Rank(1, 5, 1), "a1"), (b"b", Rank(0, 0, 2), "b2"), (b"a", Rank(1, 5, 3), "a3"),
            (b"a", Rank(0, 9, 4), "a4"), (b"b", Rank(0, 0, 5), "b5")]
    assert best_per_key(rows) == {b"a": "a3", b"b": "b5"}
