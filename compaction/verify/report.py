"""The verdict of `kcompact verify` for one partition, as text for people and as JSON."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from compaction.verify.compare import KeyProblem, key_text


@dataclass(frozen=True)
class VerifyReport:
    """The verdict for one partition between two table versions; `ok` when no problem was found.

    `problems` lists the first of `problem_count` problems (keys in order, then the uncleaned region's offsets)
    and `expired_tombstones` the first of `expired_tombstone_count` keys, so a report stays small whatever
    the partition's size.
    """

    topic: str
    partition: int
    before_version: int
    after_version: int
    strategy: str
    log_end_offset: int
    log_start_offset: int  # `after`'s: keys whose winner lay below it expired with retention (compact,delete)
    cleaner_offset_before: int
    cleaner_offset_after: int
    keys_before: int
    keys_after: int
    expired_tombstones: tuple[bytes, ...]
    problems: tuple[KeyProblem, ...]
    problem_count: int
    expired_tombstone_count: int

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: the listed problems, with keys as text (if printable UTF-8) and base64."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "ok": self.ok,
            "before_version": self.before_version,
            "after_version": self.after_version,
            "strategy": self.strategy,
            "compared_below_offset": self.log_end_offset,
            "log_start_offset": self.log_start_offset,
            "cleaner_offset_before": self.cleaner_offset_before,
            "cleaner_offset_after": self.cleaner_offset_after,
            "keys_before": self.keys_before,
            "keys_after": self.keys_after,
            "expired_tombstones": self.expired_tombstone_count,
            "problem_count": self.problem_count,
            "problems": [p.to_dict() for p in self.problems],
        }

    def render_text(self, max_keys: int = 20) -> Iterator[str]:
        """A summary line, then up to `max_keys` problems, one per line."""
        tp = f"{self.topic}-{self.partition}"
        span = (f"versions {self.before_version} -> {self.after_version}, offsets below {self.log_end_offset}, "
                f"cleaner offset {self.cleaner_offset_before} -> {self.cleaner_offset_after}, "
                f"strategy {self.strategy}")
        counts = (f"{self.keys_before} keys before, {self.keys_after} after, "
                  f"{self.expired_tombstone_count} tombstones dropped after their delete horizon")
        if self.ok:
            yield f"verify {tp}: OK ({span}; {counts})"
            return
        yield f"verify {tp}: FAILED, {self.problem_count} keys lost or changed ({span}; {counts})"
        for p in self.problems[:max_keys]:
            yield f"  {p.finding.value:<17} key {key_text(p.key)!r}: {p.detail}"
        if self.problem_count > max_keys:
            listed = "every key" if len(self.problems) == self.problem_count else f"the first {len(self.problems)}"
            yield f"  ... and {self.problem_count - max_keys} more (--json lists {listed})"
