"""What changed between two views, and whether compaction was allowed to change it. Pure.

The one change allowed: a key whose winner was a tombstone below the cleaner offset vanished, dropped at or
after its delete horizon (KIP-534: `now >= deleteHorizonMs`, "now" being the clock of the run that dropped it).
Everything else is a `KeyProblem`.
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


def compare_views(
    before: PartitionView, after: PartitionView, evidence: Mapping[bytes, TombstoneEvidence]
) -> tuple[list[KeyProblem], list[bytes]]:
    """Every change from `before` to `after` that compaction may not make, and the tombstones it rightly dropped.

    Pure. `after.cleaner_offset` bounds the cleaned range; `evidence` is needed only for keys whose winner at
    `before` was a tombstone and that have none at `after`.
    """
    problems: list[KeyProblem] = []
    expired: list[bytes] = []
    for key in sorted(before.latest.keys() | after.latest.keys()):
        b, a = before.latest.get(key), after.latest.get(key)
        if b is not None and a is not None:
            if not _same(b, a):
                problems.append(KeyProblem(key, Finding.CHANGED, b, a,
                                           f"latest record was {_describe(b)}, is {_describe(a)}"))
        elif b is not None:
            refusal = tombstone_drop_refusal(b, after.cleaner_offset, evidence.get(key))
            if refusal is None:
                expired.append(key)
            else:
                problems.append(KeyProblem(key, Finding.VANISHED, b, None, refusal))
        elif a is not None:
            problems.append(KeyProblem(key, Finding.APPEARED, None, a,
                                       f"no record before, now {_describe(a)} (below offset {before.log_end_offset})"))
    reported: set[bytes | None] = {p.key for p in problems}
    b_tail = {r.offset: r for r in before.tail}
    a_tail = {r.offset: r for r in after.tail}
    for offset in sorted(b_tail.keys() | a_tail.keys()):
        b, a = b_tail.get(offset), a_tail.get(offset)
        if b is not None and a is not None and _same(b, a):
            continue
        tail_key = b.key if b is not None else a.key if a is not None else None
        if tail_key in reported:
            continue
        reported.add(tail_key)
        problems.append(KeyProblem(tail_key, Finding.UNCLEANED_CHANGED, b, a,
                                   f"record at offset {offset} (at or above the cleaner offset "
                                   f"{after.cleaner_offset}) was {_describe(b)}, is {_describe(a)}"))
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
