"""The run report: per partition what was read, written and committed, the run's totals and failures, as JSON too.

`RunReport` is the one value every output is rendered from: the text summary (`compaction.run.report_text`, Kafka's
`LogCleaner.recordStats` per partition), the HTML page (`compaction.run.report_html`) and the Prometheus file
(`compaction.run.metrics`) read it typed; `to_dict()` is the JSON report (`--json`, `--report-json`, what
`compaction.compact` callers serialize). A run with nothing to do has a report too (`plan_report`), with the plan's
gauges and no partitions, so monitoring sees every run. `phase_seconds` (plan, stage, commit) is measured by the
caller, which owns the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from compaction.counters import Counters
from compaction.errors import ExitCode, KcompactError, worst_exit_code
from compaction.metadata import TopicPartition
from compaction.planner import PartitionPlan
from compaction.retention import RetentionReport
from compaction.run.commit import PartitionOutcome
from compaction.run.plan import RunPlan
from compaction.run.stage import StagedPartition, StagedRun
from compaction.run.stats import PartitionStats

if TYPE_CHECKING:
    from compaction.metadata.table import ObjectStoreLike
    from compaction.storage.base import StoreStats


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


TARGET_FALSE_READ_RATE = 0.01
"""The share of clean segments without a dirty key that a run may read for nothing: half of the goal of reading
at most 2% of the cleaned region beyond the segments that hold a dirty key, since the filters themselves are read
too (~1.44 log2(1/fpp) bits per key)."""


def fetch_ratio(fetched: int, needed: int) -> float | None:
    """Bytes fetched from the store over the bytes of the segments and filters the run had to read: 1.0 when each
    was fetched once (the companions a rewrite copies, a producer snapshot and an epoch checkpoint per output,
    add a little). None when the run read nothing."""
    return round(fetched / needed, 4) if needed else None


@dataclass(frozen=True)
class RequestCounts(Counters):
    """Store requests and the bytes they moved."""

    gets: int = 0
    puts: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @classmethod
    def of(cls, stats: StoreStats) -> RequestCounts:
        """What a report counts of a store's `stats` (a copy, or the difference of two)."""
        return cls(stats.gets, stats.puts, stats.bytes_read, stats.bytes_written)


@dataclass(frozen=True)
class FalsePositiveRates:
    """Observed false-positive rates of the filters: `segments` over clean segments that held no dirty key (kept,
    or read for nothing), `keys` over (dirty key, filter) tests whose truth is known (see `PartitionStats`)."""

    segments: float | None
    keys: float | None


@dataclass(frozen=True)
class BloomSizing:
    """Whether `bloom.filter.fpp` is small enough for a partition's dirty keys (`bloom_sizing`)."""

    filter_fpp: float
    dirty_keys: int
    expected_false_read_rate: float
    suggested_fpp: float
    too_coarse: bool


def bloom_sizing(fpp: float, dirty_keys: int, clean_segments: int) -> BloomSizing | None:
    """Is `bloom.filter.fpp` small enough for this many dirty keys? None when no clean segment was tested.

    A clean segment that holds none of D dirty keys still tests positive with probability 1 - (1 - p)^D for
    filters of false-positive rate p (each key is tested on its own): about D·p. At Kafka-sized changes the
    1% default reads almost every clean segment (D = 100 already gives 63%). The fpp that keeps this at
    TARGET_FALSE_READ_RATE is 1 - (1 - target)^(1/D) ≈ target / D; it applies to filters written from then
    on (a segment's filter keeps the rate it was built with until the segment is rewritten).
    """
    if clean_segments == 0 or dirty_keys == 0:
        return None
    read = 1 - (1 - fpp) ** dirty_keys
    suggested = 1 - (1 - TARGET_FALSE_READ_RATE) ** (1 / dirty_keys)
    return BloomSizing(fpp, dirty_keys, round(read, 6), float(f"{suggested:.2g}"), read > TARGET_FALSE_READ_RATE)


@dataclass(frozen=True)
class PartitionReport:
    """One staged partition: what it read and wrote, its swap's outcome, and its counters (`stats`).

    Times are rounded to the millisecond; `total_seconds` is the rounded sum of the unrounded two."""

    topic: str
    partition: int
    dirty_section: tuple[int, int] | None  # [first dirty offset, first uncleanable offset)
    segments_replaced: int
    segments_written: int
    map_seconds: float
    rewrite_seconds: float
    total_seconds: float
    fencing_epoch: int
    cleaner_offset: int
    committed: bool
    metadata_version: int | None
    error: str | None
    filter_fpp: float
    stats: PartitionStats

    @property
    def bytes_read(self) -> int:
        return self.stats.rewrite.bytes_read

    @property
    def bytes_written(self) -> int:
        return self.stats.rewrite.bytes_written

    @property
    def records_read(self) -> int:
        return self.stats.rewrite.records_read

    @property
    def records_written(self) -> int:
        return self.stats.rewrite.records_written

    @property
    def requests(self) -> RequestCounts:
        """Every store request the partition made."""
        s = self.stats
        return RequestCounts(s.store_gets, s.store_puts, s.store_bytes_read, s.store_bytes_written)

    @property
    def bloom_false_positive_rate(self) -> FalsePositiveRates:
        s = self.stats
        fp_segments = s.bloom_segment_false_positives
        return FalsePositiveRates(_rate(fp_segments, fp_segments + s.bloom_segment_true_negatives),
                                  _rate(s.bloom_key_false_positives, s.bloom_key_absent_tests))

    @property
    def fetch_ratio(self) -> float | None:
        return fetch_ratio(self.stats.store_bytes_read, self.stats.needed_bytes)

    @property
    def bloom_sizing(self) -> BloomSizing | None:
        return bloom_sizing(self.filter_fpp, self.stats.dirty_keys, self.stats.clean_segments)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (an entry of the report's `partitions`)."""
        sizing = self.bloom_sizing
        return {
            "topic": self.topic,
            "partition": self.partition,
            "dirty_section": None if self.dirty_section is None else list(self.dirty_section),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "records_read": self.records_read,
            "records_written": self.records_written,
            "invalid_records": self.stats.rewrite.invalid_records,
            "segments_replaced": self.segments_replaced,
            "segments_written": self.segments_written,
            "map_seconds": self.map_seconds,
            "rewrite_seconds": self.rewrite_seconds,
            "total_seconds": self.total_seconds,
            "fencing_epoch": self.fencing_epoch,
            "cleaner_offset": self.cleaner_offset,
            "committed": self.committed,
            "metadata_version": self.metadata_version,
            "error": self.error,
            "segments_skipped": self.stats.segments_skipped,
            "bytes_not_downloaded": self.stats.bytes_not_downloaded,
            "bloom_false_positive_rate": asdict(self.bloom_false_positive_rate),
            "requests": asdict(self.requests),
            "fetch_ratio": self.fetch_ratio,
            "bloom_sizing": None if sizing is None else asdict(sizing),
            "stats": self.stats.to_dict(),
        }


def partition_report(sp: StagedPartition, outcome: PartitionOutcome | None) -> PartitionReport:
    regions = sp.plan.regions
    return PartitionReport(
        topic=sp.plan.topic,
        partition=sp.plan.partition,
        dirty_section=None if regions is None else (regions.first_dirty_offset, regions.first_uncleanable_offset),
        segments_replaced=len(sp.replaced),
        segments_written=len(sp.new_segments),
        map_seconds=round(sp.map_seconds, 3),
        rewrite_seconds=round(sp.rewrite_seconds, 3),
        total_seconds=round(sp.map_seconds + sp.rewrite_seconds, 3),
        fencing_epoch=sp.fencing_epoch,
        cleaner_offset=sp.cleaner_offset,
        committed=outcome.committed if outcome else False,
        metadata_version=outcome.version if outcome else None,
        error=outcome.error if outcome else None,
        filter_fpp=sp.filter_fpp,
        stats=sp.stats,
    )


@dataclass(frozen=True)
class PlannedPartition:
    """The plan's view of one partition, as the HTML page and the metrics show it for every partition."""

    topic: str
    partition: int
    decision: str
    eligible: bool
    dirty_ratio: float
    max_compaction_delay_secs: int
    clean_bytes: int
    cleanable_bytes: int
    uncleanable_bytes: int
    reason: str

    @classmethod
    def of(cls, p: PartitionPlan) -> PlannedPartition:
        r = p.regions
        return cls(p.topic, p.partition, p.decision.value, p.eligible, round(p.dirty_ratio, 6),
                   p.max_compaction_delay_ms // 1000, r.clean_bytes if r else 0, r.cleanable_bytes if r else 0,
                   r.uncleanable_bytes if r else 0, p.reason)


@dataclass(frozen=True)
class TimeSplit:
    """The stage's wall clock: scan + winners (`map`), rewrite + upload (`rewrite`), rounded to the ms."""

    map: float = 0.0
    rewrite: float = 0.0


TASK_STEPS = ("scan", "download", "rewrite", "upload")


@dataclass(frozen=True)
class RunReport:
    """One run: the plan's gauges, each staged partition, the failures, and where the time went.

    `to_dict()` is the JSON report; everything else reads the fields and properties."""

    run_id: str
    now_ms: int
    metadata_version_planned: int
    max_compaction_delay_secs: int
    max_dirty_percent: int
    partitions: tuple[PartitionReport, ...]
    failed: tuple[PartitionOutcome, ...]  # every partition that did not commit, staged or not
    time_split_seconds: TimeSplit
    planned: tuple[PlannedPartition, ...]
    phase_seconds: Mapping[str, float] = field(default_factory=dict)  # rounded to the ms
    retention: RetentionReport | None = None  # compact,delete partitions: what retention expired before compacting
    plan_requests: RequestCounts = field(default_factory=RequestCounts)
    """The plan's requests to the segments' store, in the driver (`RunPlan.requests`); `requests` are the
    executors'."""
    metadata_requests: RequestCounts = field(default_factory=RequestCounts)
    """The driver's requests to the metadata table (`metadata.table_requests`: kcompact's commits and its reads of
    data and rows files; delta-rs's reads of the log are not counted); `requests` are the segments' store's."""

    @property
    def uncleanable_partitions(self) -> list[str]:
        """Partitions quarantined for corrupt input, as `topic-partition`."""
        return [f"{f.topic}-{f.partition}" for f in self.failed if f.exit_code == ExitCode.CORRUPT_INPUT]

    @property
    def bytes_read(self) -> int:
        return sum(p.bytes_read for p in self.partitions)

    @property
    def bytes_written(self) -> int:
        return sum(p.bytes_written for p in self.partitions)

    @property
    def records_read(self) -> int:
        return sum(p.records_read for p in self.partitions)

    @property
    def records_written(self) -> int:
        return sum(p.records_written for p in self.partitions)

    @property
    def segments_skipped(self) -> int:
        return sum(p.stats.segments_skipped for p in self.partitions)

    @property
    def bytes_not_downloaded(self) -> int:
        return sum(p.stats.bytes_not_downloaded for p in self.partitions)

    @property
    def requests(self) -> RequestCounts:
        return sum((p.requests for p in self.partitions), RequestCounts())

    @property
    def fetch_ratio(self) -> float | None:
        return fetch_ratio(self.requests.bytes_read, sum(p.stats.needed_bytes for p in self.partitions))

    @property
    def task_seconds(self) -> dict[str, float]:
        """Executor time summed over tasks (not wall clock) per step: where the map and the rewrite went."""
        return {step: round(sum(getattr(p.stats, f"{step}_task_ms") for p in self.partitions) / 1000, 3)
                for step in TASK_STEPS}

    @property
    def duration_seconds(self) -> float:
        return round(sum(self.phase_seconds.values()), 3)

    @property
    def committed(self) -> int:
        """Partitions whose swap this run committed."""
        return sum(1 for p in self.partitions if p.committed)

    @property
    def exit_code(self) -> int:
        """The worst failure's exit code, 0 when none failed."""
        return worst_exit_code(self.failed)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report."""
        return {
            "run_id": self.run_id,
            "now_ms": self.now_ms,
            "metadata_version_planned": self.metadata_version_planned,
            "max_compaction_delay_secs": self.max_compaction_delay_secs,
            "max_dirty_percent": self.max_dirty_percent,
            "partitions": [p.to_dict() for p in self.partitions],
            "failed": [f.to_dict() for f in self.failed],
            "uncleanable_partitions": self.uncleanable_partitions,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "segments_skipped": self.segments_skipped,
            "bytes_not_downloaded": self.bytes_not_downloaded,
            "requests": asdict(self.requests),
            "plan_requests": asdict(self.plan_requests),
            "metadata_requests": asdict(self.metadata_requests),
            "fetch_ratio": self.fetch_ratio,
            "time_split_seconds": asdict(self.time_split_seconds),
            "task_seconds": self.task_seconds,
            "phase_seconds": dict(self.phase_seconds),
            "duration_seconds": self.duration_seconds,
            "planned": [asdict(p) for p in self.planned],
            "retention": None if self.retention is None else self.retention.to_dict(),
            "exit_code": self.exit_code,
        }


def requests_since(before: StoreStats, store: ObjectStoreLike) -> RequestCounts:
    """The requests made to the metadata table in `store` since `before` (`metadata.table_requests`), as a run
    report counts them (`RunReport.metadata_requests`)."""
    from compaction.metadata import table_requests

    return RequestCounts.of(table_requests(store) - before)


def run_report(staged: StagedRun, outcomes: Sequence[PartitionOutcome],
               phase_seconds: Mapping[str, float] | None = None) -> RunReport:
    """The report of a run that staged (and tried to commit) its eligible partitions."""
    by_tp = {(o.topic, o.partition): o for o in outcomes}
    parts = tuple(partition_report(sp, by_tp.get((sp.plan.topic, sp.plan.partition))) for sp in staged.partitions)
    failed = tuple(o for o in outcomes if not o.committed)
    split = TimeSplit(round(staged.map_seconds, 3), round(staged.rewrite_seconds, 3))
    return _report(staged.run, parts, failed, split, phase_seconds, staged.retention)


def plan_report(run: RunPlan, phase_seconds: Mapping[str, float] | None = None,
                retention: RetentionReport | None = None,
                failed: Mapping[TopicPartition, KcompactError] | None = None) -> RunReport:
    """The report of a run with nothing to compact: the plan's gauges, no partitions, nothing read or written,
    and the `retention` it applied (or, in a dry run, would apply); partitions quarantined at planning (unreadable
    input) or whose expiry failed are its failures, with their exit codes."""
    quarantined = {TopicPartition(t, p): exc for t, p, exc in run.quarantined} | dict(failed or {})
    outcomes = tuple(PartitionOutcome.failed(tp.topic, tp.partition, exc) for tp, exc in quarantined.items())
    return _report(run, (), outcomes, TimeSplit(), phase_seconds, retention)


def _report(run: RunPlan, parts: tuple[PartitionReport, ...], failed: tuple[PartitionOutcome, ...],
            split: TimeSplit, phase_seconds: Mapping[str, float] | None,
            retention: RetentionReport | None = None) -> RunReport:
    plan = run.plan
    return RunReport(
        run_id=run.run_id,
        now_ms=plan.now_ms,
        metadata_version_planned=plan.metadata_version,
        max_compaction_delay_secs=plan.max_compaction_delay_ms // 1000,
        max_dirty_percent=plan.max_dirty_percent,
        partitions=parts,
        failed=failed,
        time_split_seconds=split,
        planned=tuple(PlannedPartition.of(p) for p in plan.partitions),
        phase_seconds={k: round(v, 3) for k, v in (phase_seconds or {}).items()},
        retention=retention,
        plan_requests=RequestCounts.of(run.requests),
    )


__all__ = [
    "TARGET_FALSE_READ_RATE",
    "BloomSizing",
    "FalsePositiveRates",
    "PartitionReport",
    "PlannedPartition",
    "RequestCounts",
    "RunReport",
    "TimeSplit",
    "bloom_sizing",
    "fetch_ratio",
    "partition_report",
    "plan_report",
    "requests_since",
    "run_report",
]
