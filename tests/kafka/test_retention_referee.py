"""kcompact's retention of `cleanup.policy=compact,delete` topics against Kafka's own, on the same segments.

Each case is one partition (`ScenarioLog`): closed segments of single-record batches at chosen ages (now - record
timestamp) and value sizes, then a roll, so that Kafka's active segment is empty and Kafka's log size is the closed
segments' total, which is what kcompact counts (it never sees the active segment: `kcompact tier` copies every
segment but it). Every case is written once, tiered into one store, and judged twice at the same clock:

- Kafka: a copy of each dir goes through `UnifiedLog.deleteOldSegments()` (`dev.kcompact.cleaner.RetentionHarness`
  in kafka/cleaner-harness, all cases in one JVM): the log-start-offset, retention.bytes and retention.ms passes;
- kcompact: `compaction.retention.expire` over the store, with the topic `compact,delete` and the same retention.ms /
  retention.bytes (`compaction/retention/plan.py`).

kcompact must expire exactly the segments Kafka deleted, with one exception, its own rule: the partition's last
tiered segment never expires (it marks where the tier ends and the WAL begins). So where Kafka deleted every closed
segment (`LAST_KEPT`: time_all_expired, size_all, single_old), kcompact keeps the last one and its log start is
that segment's base, Kafka's the (empty) active segment's. kcompact's other difference, counting only tiered
bytes toward retention.bytes, cannot show here: Kafka's active segment is empty.

The explicit cases also pin Kafka's answer (`kafka_deletes`), so each shows what its name says: the time pass
stopping at a young segment followed by older ones, the strict `now - maxTimestamp > retention.ms` boundary, the
size pass's `diff - size >= 0` boundary, both passes in turn, nothing expired. Beside them, `RANDOM_CASES` drawn
from `Random(SEED)` (ages at and around the boundaries, either pass or both), in the same JVM.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from compaction.config import KcompactConfig, TopicConfig
from compaction.metadata import table_in_store
from compaction.retention import expire
from compaction.storage import open_store
from tests.kafka_runtime import run_tool
from tests.scenario_log import ScenarioLog, tier

HARNESS = "dev.kcompact.cleaner.RetentionHarness"
NOW = 1_800_000_000_000
R = 3_600_000  # retention.ms of the cases with a time pass
SEED = 0
RANDOM_CASES = 24

Segment = tuple[tuple[int, int], ...]
"""A closed segment: its records, each (age in ms before NOW, value bytes), one batch each."""
RetentionBytes = Callable[[Sequence[int]], int]
"""retention.bytes from the closed segments' sizes (the built .log files), so size cases can sit on a boundary."""


def seg(*ages: int, value: int = 20) -> Segment:
    return tuple((age, value) for age in ages)


def off(_: Sequence[int]) -> int:
    return -1


def tail(k: int, plus: int = 0) -> RetentionBytes:
    """The last `k` segments' bytes (+ `plus`): with diff = total - retention.bytes, the size pass removes the
    segments before them exactly when plus <= 0 (diff - size >= 0)."""
    return lambda sizes: sum(sizes[len(sizes) - k:]) + plus


@dataclass(frozen=True)
class Case:
    name: str
    segments: tuple[Segment, ...]
    retention_ms: int
    retention_bytes: RetentionBytes
    kafka_deletes: int | None = None  # how many closed segments Kafka deletes (None: not pinned, a random case)


CASES = (
    # time only: two old segments go; the third holds a young record among old ones, and the walk stops there
    # though the two after it are older than retention.ms
    Case("time_stops_at_young", (seg(3 * R, 2 * R + 7, 4 * R), seg(R + 1), seg(5 * R, R // 2, 6 * R), seg(5 * R),
                                 seg(4 * R)), R, off, kafka_deletes=2),
    Case("time_boundary_first", (seg(R), seg(3 * R), seg(3 * R)), R, off, kafka_deletes=0),  # now - max == R: kept
    Case("time_boundary_second", (seg(R + 1), seg(R), seg(2 * R)), R, off, kafka_deletes=1),
    Case("time_future_first", (seg(-R), seg(3 * R), seg(3 * R)), R, off, kafka_deletes=0),
    Case("time_all_expired", (seg(3 * R), seg(2 * R), seg(R + 1)), R, off, kafka_deletes=3),
    Case("single_old", (seg(5 * R, 6 * R),), R, off, kafka_deletes=1),
    # size only (every segment far older than any retention.ms: the time pass is off)
    Case("size_exact", (seg(9 * R, value=10), seg(9 * R, value=200), seg(9 * R, value=50), seg(9 * R, value=120)),
         -1, tail(2), kafka_deletes=2),  # the second goes with diff - size == 0
    Case("size_one_short", (seg(9 * R, value=10), seg(9 * R, value=200), seg(9 * R, value=50),
                            seg(9 * R, value=120)), -1, tail(2, 1), kafka_deletes=1),
    Case("size_at_total", (seg(9 * R, value=30), seg(9 * R, value=90), seg(9 * R)), -1, tail(3), kafka_deletes=0),
    Case("size_all", (seg(9 * R, value=30), seg(9 * R, value=90), seg(9 * R), seg(9 * R, value=5)), -1,
         lambda sizes: 0, kafka_deletes=4),
    # both: the size pass takes a young first segment, the time pass the two old ones after it, up to a young one
    Case("both_size_then_time", (seg(10, value=60), seg(2 * R), seg(3 * R, R + 1), seg(R // 2), seg(5 * R)), R,
         tail(4), kafka_deletes=3),
    Case("both_time_only_breached", (seg(2 * R, value=60), seg(3 * R), seg(R // 2), seg(5 * R)), R, tail(4, 1),
         kafka_deletes=2),
    # nothing past either limit
    Case("nothing_expired", (seg(R - 1), seg(10, 2 * R), seg(R // 2)), R, lambda sizes: sum(sizes) + 1000,
         kafka_deletes=0),
)
LAST_KEPT = frozenset({"time_all_expired", "size_all", "single_old"})
"""The cases where Kafka deletes every closed segment and kcompact keeps the last tiered one (its own rule)."""


def random_cases(rnd: random.Random, n: int) -> list[Case]:
    ages = [R - 1, R, R + 1, 0, -1000, 2 * R, 3 * R]

    def age() -> int:
        return rnd.choice(ages) if rnd.random() < 0.5 else rnd.randrange(0, 3 * R)

    out = []
    for i in range(n):
        segments = tuple(tuple((age(), rnd.randrange(1, 300)) for _ in range(rnd.randint(1, 3)))
                         for _ in range(rnd.randint(1, 6)))
        retention_ms = rnd.choice([-1, R, R])
        k, plus = rnd.randint(0, len(segments)), rnd.choice([-1, 0, 0, 1])
        retention_bytes = off if retention_ms >= 0 and rnd.random() < 0.4 else tail(k, plus)
        out.append(Case(f"random{i}", segments, retention_ms, retention_bytes))
    return out


@dataclass(frozen=True)
class Built:
    case: Case
    log: ScenarioLog
    retention_bytes: int


def build(case: Case) -> ScenarioLog:
    log = ScenarioLog(f"rr-{case.name}", NOW)
    for segment in case.segments:
        for age, value in segment:
            log.record(log.next_offset, b"v" * value, timestamp=NOW - age)
        log.roll()
    return log


def sizes_of(log: ScenarioLog, directory: Path) -> list[int]:
    return [(directory / f"{base:020d}.log").stat().st_size for base in log.segment_bases[:-1]]


@dataclass(frozen=True)
class KafkaAnswer:
    """A line of the harness: every segment before (base, bytes, largestTimestamp; the active one last), the bases
    left and the log start offset after."""

    before: list[tuple[int, int, int]]
    segments: list[int]
    log_start_offset: int

    @classmethod
    def parse(cls, line: str) -> tuple[str, KafkaAnswer]:
        d = json.loads(line)
        name = Path(d["dir"]).name.removeprefix("rr-").removesuffix("-0")
        return name, cls([(b, n, t) for b, n, t in d["before"]], d["segments"], d["log_start_offset"])


def judge(built: Sequence[Built], kafka: dict[str, KafkaAnswer], tiered: dict[str, list[tuple[int, int, int]]],
          ours: dict[str, tuple[list[int], int]], after: dict[str, list[int]]) -> tuple[list[str], set[str]]:
    """Every difference between Kafka's and kcompact's answers but the allowed one, and the cases that used it."""
    found: list[str] = []
    last_kept: set[str] = set()
    for b in built:
        name = b.case.name
        k = kafka[name]
        before, remaining = k.before, k.segments
        inputs = (f"{name}: now={NOW} retention.ms={b.case.retention_ms} retention.bytes={b.retention_bytes} "
                  f"segments (base, bytes, max timestamp)={before[:-1]}")
        if before[-1][1] != 0 or before[:-1] != tiered[b.log.name]:
            found.append(f"{inputs}: the sides judge different inputs: Kafka's segments {before}, kcompact's "
                         f"tiered {tiered[b.log.name]}")
            continue
        closed = [base for base, _, _ in before[:-1]]
        deleted = [base for base in closed if base not in remaining]
        expected, log_start = list(deleted), k.log_start_offset
        if deleted and deleted[-1] == closed[-1]:
            expected.pop()
            log_start = closed[-1]
            last_kept.add(name)
        expired, our_start = ours[b.log.name]
        answers = (f"Kafka deleted {deleted} (log start {k.log_start_offset}), kcompact expired {expired} "
                   f"(log start {our_start})")
        if b.case.kafka_deletes is not None and len(deleted) != b.case.kafka_deletes:
            found.append(f"{inputs}: the case expects Kafka to delete {b.case.kafka_deletes} segments; {answers}")
        if expired != expected or our_start != log_start:
            found.append(f"{inputs}: {answers}")
        elif after[b.log.name] != [base for base in closed if base not in expected]:
            found.append(f"{inputs}: {answers}, but the store's live segments after expire are {after[b.log.name]}")
    return found, last_kept


def test_retention_as_kafkas(kafka_runtime: str, tmp_path: Path) -> None:
    cases = [*CASES, *random_cases(random.Random(SEED), RANDOM_CASES)]
    store = open_store(str(tmp_path / "store"))
    logs = [build(c) for c in cases]
    tier(logs, tmp_path / "logs", store, NOW)
    built = []
    for case, log in zip(cases, logs, strict=True):
        shutil.copytree(tmp_path / "logs" / log.name, tmp_path / "kafka" / log.name)
        built.append(Built(case, log, case.retention_bytes(sizes_of(log, tmp_path / "logs" / log.name))))

    done = run_tool(HARNESS, [f"{tmp_path / 'kafka' / b.log.name}={NOW}:{b.case.retention_ms}:{b.retention_bytes}"
                              for b in built], jars=["cleaner-harness"], logs_dir=tmp_path)
    kafka = dict(map(KafkaAnswer.parse, done.stdout.splitlines()))
    assert sorted(kafka) == sorted(c.name for c in cases), done.stdout + done.stderr

    table = table_in_store(store)
    snapshot = table.snapshot()
    tiered = {b.log.name: [(s.start_offset, s.segment_size_bytes, s.max_timestamp_ms)
                           for s in snapshot.live_segments(b.log.topic, 0)] for b in built}
    config = KcompactConfig(topics={b.log.topic: TopicConfig.from_kafka({
        "cleanup.policy": "compact,delete", "retention.ms": b.case.retention_ms,
        "retention.bytes": b.retention_bytes}) for b in built})
    report = expire(table, config, NOW)
    ours = {f"{p.retention.topic}-{p.retention.partition}": ([s.start_offset for s in p.retention.expired],
                                                             p.retention.log_start_offset)
            for p in report.partitions}
    assert sorted(ours) == sorted(b.log.name for b in built), report.to_dict()
    snapshot = table.snapshot()
    after = {b.log.name: [s.start_offset for s in snapshot.live_segments(b.log.topic, 0)] for b in built}

    found, last_kept = judge(built, kafka, tiered, ours, after)
    print(f"{len(cases)} cases ({len(CASES)} explicit, {RANDOM_CASES} from Random({SEED})): Kafka deleted "
          f"{sum(len(k.before) - len(k.segments) for k in kafka.values())} segments in "
          f"{sum(len(k.before) > len(k.segments) for k in kafka.values())} "
          f"partitions, kcompact expired {report.segments_expired}; last tiered segment kept in {sorted(last_kept)}")
    assert not found, "kcompact's retention differs from Kafka's deleteOldSegments:\n" + "\n".join(found)
    assert last_kept & {c.name for c in CASES} == LAST_KEPT, sorted(last_kept)
    assert expire(table, config, NOW).segments_expired == 0  # idempotent: nothing more at the same clock
