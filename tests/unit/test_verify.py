"""`compare_views` as small tables: what compaction may change (an expired tombstone) and what it may not."""

from __future__ import annotations

import pytest

from compaction.config import CompactionStrategy
from compaction.format.batch import Header, Record
from compaction.verify import (
    Finding,
    KeyProblem,
    PartitionView,
    Ranking,
    TombstoneEvidence,
    VerifyReport,
    compare_views,
)
from tests.factories import record as rec

HORIZON = 1_000


def view(*records: Record, cleaner_offset: int = 50, end: int = 100, tail_from: int = 50) -> PartitionView:
    latest = {r.key: r for r in sorted(records, key=lambda r: r.offset) if r.key is not None}
    return PartitionView(0, end, cleaner_offset, latest, tuple(r for r in records if r.offset >= tail_from))


def findings(before: PartitionView, after: PartitionView,
             evidence: dict[bytes, TombstoneEvidence] | None = None) -> list[tuple[bytes | None, Finding]]:
    problems, _expired = compare_views(before, after, evidence or {})
    return [(p.key, p.finding) for p in problems]


def test_the_same_view_verifies() -> None:
    v = view(rec(1, b"a", b"1"), rec(60, b"b", b"2"), rec(61, None, b"keyless"))
    assert findings(v, v) == []


def test_superseded_records_may_go_but_a_latest_value_may_not_change() -> None:
    before = view(rec(1, b"a", b"old"), rec(5, b"a", b"new"), rec(7, b"b", b"x"))
    assert findings(before, view(rec(5, b"a", b"new"), rec(7, b"b", b"x"))) == []
    assert findings(before, view(rec(1, b"a", b"old"), rec(7, b"b", b"x"))) == [(b"a", Finding.CHANGED)]
    assert findings(before, view(rec(5, b"a", b"NEW"), rec(7, b"b", b"x"))) == [(b"a", Finding.CHANGED)]
    assert findings(before, view(rec(5, b"a", b"new", ts=9), rec(7, b"b", b"x"))) == [(b"a", Finding.CHANGED)]
    assert findings(before, view(rec(5, b"a", b"new"))) == [(b"b", Finding.VANISHED)]
    assert findings(before, view(rec(5, b"a", b"new"), rec(7, b"b", b"x"), rec(9, b"c", b"y"))) == [
        (b"c", Finding.APPEARED)]


@pytest.mark.parametrize(
    ("tombstone_offset", "evidence", "allowed"),
    [
        (10, TombstoneEvidence(HORIZON, HORIZON), True),  # now >= horizon: Kafka drops it
        (10, TombstoneEvidence(HORIZON, HORIZON + 5), True),
        (10, TombstoneEvidence(HORIZON, HORIZON - 1), False),  # dropped before its horizon
        (10, TombstoneEvidence(None, HORIZON), False),  # no batch ever gave it a horizon
        (10, TombstoneEvidence(HORIZON, None), False),
        (10, None, False),  # no carrying segment left to prove anything
        (60, TombstoneEvidence(HORIZON, HORIZON), False),  # above the cleaner offset 50
    ],
)
def test_a_tombstone_may_vanish_only_after_its_delete_horizon(
        tombstone_offset: int, evidence: TombstoneEvidence | None, allowed: bool) -> None:
    before = view(rec(3, b"k", b"v"), rec(tombstone_offset, b"k", None), rec(70, b"z", b"z"))
    after = view(rec(70, b"z", b"z"))
    problems, expired = compare_views(before, after, {b"k": evidence} if evidence else {})
    assert (expired == [b"k"]) is allowed
    assert [(p.key, p.finding) for p in problems] == ([] if allowed else [(b"k", Finding.VANISHED)])


def test_a_tombstone_replaced_by_an_older_value_is_a_change() -> None:
    before = view(rec(3, b"k", b"v"), rec(10, b"k", None))
    assert findings(before, view(rec(3, b"k", b"v")), {b"k": TombstoneEvidence(HORIZON, HORIZON)}) == [
        (b"k", Finding.CHANGED)]


def test_nothing_at_or_above_the_cleaner_offset_may_change() -> None:
    before = view(rec(1, b"a", b"1"), rec(55, b"a", b"2"), rec(56, None, b"keyless"), rec(57, b"a", b"3"))
    # offset 55 is superseded by 57, which compaction could drop below the cleaner offset, but not here
    assert findings(before, view(rec(1, b"a", b"1"), rec(56, None, b"keyless"), rec(57, b"a", b"3"))) == [
        (b"a", Finding.UNCLEANED_CHANGED)]
    assert findings(before, view(rec(1, b"a", b"1"), rec(55, b"a", b"2"), rec(57, b"a", b"3"))) == [
        (None, Finding.UNCLEANED_CHANGED)]


def test_strategies_rank_like_kip_280() -> None:
    def version(v: int | bytes) -> tuple[Header, ...]:
        return (Header("version", v if isinstance(v, bytes) else v.to_bytes(8, "big", signed=True)),)

    timestamp = Ranking(CompactionStrategy.TIMESTAMP)
    assert timestamp.rank(rec(5, b"k", b"", ts=9)) > timestamp.rank(rec(6, b"k", b"", ts=8))
    assert timestamp.rank(rec(6, b"k", b"", ts=9)) > timestamp.rank(rec(5, b"k", b"", ts=9))
    header = Ranking(CompactionStrategy.HEADER, "version")
    assert header.rank(rec(5, b"k", b"", headers=version(-1))) > header.rank(rec(6, b"k", b"", headers=version(b"x")))
    assert header.rank(rec(5, b"k", b"", headers=version(7))) > header.rank(rec(6, b"k", b"", headers=version(3)))
    last_wins = (*version(1), *version(9))
    assert header.rank(rec(1, b"k", b"", headers=last_wins)) > header.rank(rec(2, b"k", b"", headers=version(5)))
    assert Ranking().rank(rec(6, b"k", b"", ts=0)) > Ranking().rank(rec(5, b"k", b"", ts=9))


def test_a_report_counts_every_problem_and_says_how_many_it_lists() -> None:
    problems = tuple(KeyProblem(bytes([97 + i]), Finding.VANISHED, rec(i, bytes([97 + i]), b"v"), None, "gone")
                     for i in range(3))
    report = VerifyReport(topic="t", partition=0, before_version=1, after_version=2, strategy="offset",
                          log_end_offset=100, log_start_offset=0, cleaner_offset_before=0, cleaner_offset_after=50,
                          keys_before=10,
                          keys_after=2, expired_tombstones=(), problems=problems, problem_count=8,
                          expired_tombstone_count=0)
    lines = list(report.render_text(max_keys=2))
    assert not report.ok and lines[0].startswith("verify t-0: FAILED, 8 keys lost or changed")
    assert lines[1:3] == ["  vanished          key 'a': gone", "  vanished          key 'b': gone"]
    assert lines[3] == "  ... and 6 more (--json lists the first 3)"
    assert report.to_dict()["problem_count"] == 8 and len(report.to_dict()["problems"]) == 3
