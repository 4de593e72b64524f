"""What changed between two views, and whether compaction was allowed to change it. Pure.

The one change compaction may make: a key whose winner was a tombstone below the cleaner offset vanished, dropped
at or after its delete horizon (KIP-534: `now >= deleteHorizonMs`, "now" being the clock of the run that dropped
it). Retention (`kcompact expire`, compact,delete topics) may make one more: a key whose winner lay below `after`'s
log start expired with its segment; what `after` holds of that key is not judged (under `timestamp` or `header` a
record above the log start may have become its winner). Everything else is a `KeyProblem`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from compaction.format.batch import Record
from compaction.verify.view import PartitionView, TombstoneEvidence


class Finding(StrEnum):
    VANISHED = "vanished"
    CHANGED = "changed"
    APPEARED = "appeared"
    UNCLEANED_CHANGED = "uncleaned_changed"


@dataclass(frozen=True)
class KeyProblem:
    """One change compaction may not make. `key` is None for a keyless record of the uncleaned region."""

    key: bytes | None
    finding: Finding
    before: Record | None
    after: Record | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": key_text(self.key), "key_b64": _b64(self.key), "finding": self.finding.value,
                "before": _record_summary(self.before), "after": _record_summary(self.after), "detail": self.detail}


def _same(a: Record, b: Record) -> bool:
    return (a.offset, a.timestamp, a.key, a.value, a.headers) == (b.offset, b.timestamp, b.key, b.value, b.headers)


def tombstone_drop_refusal(record: Record, cleaner_offset: int, evidence: TombstoneEvidence | None) -> str | None:
    """None if compaction was allowed to drop `record` (a key's winner at `before`), else why not."""
    if record.value is not None:
        return f"its latest record (offset {record.offset}, {len(record.value)} B) is gone"
    if record.offset >= cleaner_offset:
        return (f"tombstone at offset {record.offset} is gone, but it lies at or above the cleaner offset "
                f"{cleaner_offset}, where compaction changes nothing")
    if evidence is None or evidence.horizon_ms is None:
        return (f"tombstone at offset {record.offset} is gone, but no readable segment that carried it has a "
                "delete horizon (deleteHorizonMs): verify before gc deletes the replaced segments")
    if evidence.dropped_at_ms is None:
        return f"tombstone at offset {record.offset} is gone and no replaced segment records when"
    if evidence.dropped_at_ms < evidence.horizon_ms:
        return (f"tombstone at offset {record.offset} was dropped at {evidence.dropped_at_ms}, before its delete "
                f"horizon {evidence.horizon_ms}")
    return None


def judge_latest(
    key: bytes, before: Record | None, after: Record | None, *, cleaner_offset: int, log_end_offset: int,
    evidence: TombstoneEvidence | None, log_start_offset: int = 0,
) -> KeyProblem | None:
    """What is wrong with `key`'s winner going from `before` to `after` (None: nothing, or an allowed drop).

    `evidence` matters only for a tombstone winner that vanished. Pure; the Spark path judges the keys it
    collects with it too, so both paths word every problem the same way.
    """
    if before is not None and before.offset < log_start_offset:
        return None  # expired with retention
    if before is not None and after is not None:
        if _same(before, after):
            return None
        return KeyProblem(key, Finding.CHANGED, before, after,
                          f"latest record was {_describe(before)}, is {_describe(after)}")
    if before is not None:
        refusal = tombstone_drop_refusal(before, cleaner_offset, evidence)
        return None if refusal is None else KeyProblem(key, Finding.VANISHED, before, None, refusal)
    if after is not None:
        return KeyProblem(key, Finding.APPEARED, None, after,
                          f"no record before, now {_describe(after)} (below offset {log_end_offset})")
    return None


def judge_uncleaned(offset: int, before: Record | None, after: Record | None, cleaner_offset: int) -> KeyProblem | None:
    """What is wrong with the record at `offset`, at or above the cleaner offset (None: it is unchanged)."""
    if before is not None and after is not None and _same(before, after):
        return None
    key = before.key if before is not None else after.key if after is not None else None
    return KeyProblem(key, Finding.UNCLEANED_CHANGED, before, after,
                      f"record at offset {offset} (at or above the cleaner offset {cleaner_offset}) was "
                      f"{_describe(before)}, is {_describe(after)}")


def compare_views(
    before: PartitionView, after: PartitionView, evidence: Mapping[bytes, TombstoneEvidence], log_start_offset: int = 0
) -> tuple[list[KeyProblem], list[bytes]]:
    """Every change from `before` to `after` that compaction may not make, and the tombstones it rightly dropped.

    Pure. `after.cleaner_offset` bounds the cleaned range, `log_start_offset` (`after`'s, for a compact,delete
    topic) what retention left; `evidence` is needed only for keys whose winner at `before` was a tombstone and that
    have none at `after`. Problems come in key order, then the uncleaned
    region's in offset order (one per key: its first changed record, unless its winner is already listed).
    """
    problems: list[KeyProblem] = []
    expired: list[bytes] = []
    for key in sorted(before.latest.keys() | after.latest.keys()):
        b, a = before.latest.get(key), after.latest.get(key)
        problem = judge_latest(key, b, a, cleaner_offset=after.cleaner_offset, log_end_offset=before.log_end_offset,
                               evidence=evidence.get(key), log_start_offset=log_start_offset)
        if problem is not None:
            problems.append(problem)
        elif a is None and b is not None and b.offset >= log_start_offset:
            expired.append(key)
    reported: set[bytes | None] = {p.key for p in problems}
    b_tail = {r.offset: r for r in before.tail}
    a_tail = {r.offset: r for r in after.tail}
    for offset in sorted(b_tail.keys() | a_tail.keys()):
        problem = judge_uncleaned(offset, b_tail.get(offset), a_tail.get(offset), after.cleaner_offset)
        if problem is None or problem.key in reported:
            continue
        reported.add(problem.key)
        problems.append(problem)
    return problems, expired


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def key_text(key: bytes | None) -> str:
    """A key for people: its UTF-8 text if printable, else `base64:...`; `<no key>` for None."""
    if key is None:
        return "<no key>"
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return text if text is not None and text.isprintable() else f"base64:{_b64(key)}"


def _describe(record: Record | None) -> str:
    if record is None:
        return "absent"
    if record.value is None:
        return f"a tombstone at offset {record.offset}"
    return f"offset {record.offset} ({len(record.value)} B value, timestamp {record.timestamp})"


def _record_summary(record: Record | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"offset": record.offset, "timestamp": record.timestamp, "value_b64": _b64(record.value),
            "tombstone": record.value is None, "headers": [h.key for h in record.headers]}
