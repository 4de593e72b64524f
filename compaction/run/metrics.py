"""A run's metrics in Prometheus' text exposition format (version 0.0.4), for node_exporter's textfile collector.

Names follow Kafka's cleaner metrics where one exists (`max-compaction-delay-secs`, `max-dirty-percent`,
`uncleanable-partitions-count`), with a `kcompact_` prefix and underscores. One file describes one run: the
`_total` counters count what that run read and wrote (a new run resets them, as a restarted process would,
which `rate()` and `increase()` handle), the gauges are the plan's view at the run's clock. A run with nothing
to do still writes every gauge, so a stalled cleaner shows in `kcompact_max_compaction_delay_secs` and
`kcompact_last_run_timestamp_seconds`.

Rendering is pure: `prometheus_text(report)` turns a run report (`compaction.run.report`) into the file's text;
the CLI writes it (atomically, by rename, as the textfile collector requires).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from compaction.run.report import PartitionReport, PlannedPartition, RunReport

PREFIX = "kcompact_"


class MetricType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True)
class Sample:
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Metric:
    """One metric family: a name, its type and help, and one sample per label set."""

    name: str
    type: MetricType
    help: str
    samples: tuple[Sample, ...]


_P = TypeVar("_P", bound="_Partition")


def _one(name: str, type_: MetricType, help_: str, value: float) -> Metric:
    return Metric(PREFIX + name, type_, help_, (Sample((), float(value)),))


class _Partition(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


def _per_partition(name: str, type_: MetricType, help_: str, rows: Sequence[_P], value: Callable[[_P], float]
                   ) -> Metric:
    samples = tuple(Sample((("topic", str(r.topic)), ("partition", str(r.partition))), float(value(r)))
                    for r in rows)
    return Metric(PREFIX + name, type_, help_, samples)


def _gauges(report: RunReport) -> list[Metric]:
    """The plan's and the run's gauges: clock, compaction delay, dirtiness, partitions by state, durations."""
    G = MetricType.GAUGE
    planned = report.planned
    states = {"planned": len(planned), "eligible": sum(1 for p in planned if p.eligible),
              "compacted": report.committed, "failed": len(report.failed)}
    return [
        _one("last_run_timestamp_seconds", G, "The run's clock (now), in seconds since the epoch.",
             report.now_ms / 1000),
        _one("max_compaction_delay_secs", G, "KIP-354: how far the most overdue partition is past "
             "max.compaction.lag.ms, in seconds (Kafka's max-compaction-delay-secs).",
             report.max_compaction_delay_secs),
        _one("max_dirty_percent", G, "100 x the highest dirty ratio among planned partitions "
             "(Kafka's max-dirty-percent).", report.max_dirty_percent),
        _one("uncleanable_partitions_count", G, "Partitions quarantined by this run because of corrupt input "
             "(Kafka's uncleanable-partitions-count).", len(report.uncleanable_partitions)),
        Metric(PREFIX + "partitions", G, "Partitions by state in this run.",
               tuple(Sample((("state", k),), float(v)) for k, v in states.items())),
    ]


def _counters(report: RunReport) -> list[Metric]:
    """What the run read, wrote, skipped and requested."""
    C = MetricType.COUNTER
    requests = report.requests
    return [
        _one("bytes_read_total", C, "Bytes of segments read by this run.", report.bytes_read),
        _one("bytes_written_total", C, "Bytes of segments written by this run.", report.bytes_written),
        _one("records_read_total", C, "Records read by this run.", report.records_read),
        _one("records_written_total", C, "Records written by this run.", report.records_written),
        _one("segments_skipped_total", C, "Clean segments this run's filters kept unread.", report.segments_skipped),
        _one("bytes_not_downloaded_total", C, "Bytes of the clean segments this run kept unread.",
             report.bytes_not_downloaded),
        _one("segments_expired_total", C, "Segments of compact,delete topics this run expired by retention.ms / "
             "retention.bytes.", report.retention.segments_expired if report.retention else 0),
        _one("bytes_expired_total", C, "Bytes of the segments this run expired by retention.",
             report.retention.bytes_expired if report.retention else 0),
        Metric(PREFIX + "store_requests_total", C, "Object store requests made by this run.",
               (Sample((("method", "GET"),), float(requests.gets)),
                Sample((("method", "PUT"),), float(requests.puts)))),
        Metric(PREFIX + "store_bytes_total", C, "Object store bytes transferred by this run.",
               (Sample((("direction", "read"),), float(requests.bytes_read)),
                Sample((("direction", "written"),), float(requests.bytes_written)))),
        _one("plan_requests_total", C, "Store requests (GETs) the run's plan made in the driver.",
             report.plan_requests.gets),
        Metric(PREFIX + "metadata_requests_total", C, "Metadata table requests kcompact made in this run (its commits "
               "and its reads of data and rows files; delta-rs's reads of the log are not counted).",
               (Sample((("method", "GET"),), float(report.metadata_requests.gets)),
                Sample((("method", "PUT"),), float(report.metadata_requests.puts)))),
    ]


def _per_partition_metrics(report: RunReport) -> list[Metric]:
    """The plan's view of every partition, and what the run did to each staged one."""
    G, C = MetricType.GAUGE, MetricType.COUNTER
    planned: list[tuple[str, str, Callable[[PlannedPartition], float]]] = [
        ("partition_dirty_ratio", "Dirty ratio of the partition at plan time.", lambda p: p.dirty_ratio),
        ("partition_compaction_delay_secs", "KIP-354 compaction delay of the partition, seconds.",
         lambda p: p.max_compaction_delay_secs),
        ("partition_cleanable_bytes", "Cleanable (dirty) bytes of the partition at plan time.",
         lambda p: p.cleanable_bytes),
    ]
    staged: list[tuple[str, MetricType, str, Callable[[PartitionReport], float]]] = [
        ("partition_bytes_read_total", C, "Bytes read from the partition by this run.", lambda p: p.bytes_read),
        ("partition_bytes_written_total", C, "Bytes written for the partition by this run.",
         lambda p: p.bytes_written),
        ("partition_records_read_total", C, "Records read from the partition by this run.",
         lambda p: p.records_read),
        ("partition_records_written_total", C, "Records written for the partition by this run.",
         lambda p: p.records_written),
        ("partition_committed", G, "1 if the partition's swap was committed by this run, else 0.",
         lambda p: 1.0 if p.committed else 0.0),
    ]
    return [*(_per_partition(name, G, help_, report.planned, value) for name, help_, value in planned),
            *(_per_partition(name, type_, help_, report.partitions, value) for name, type_, help_, value in staged)]


def run_metrics(report: RunReport) -> list[Metric]:
    """The metric families of one run report (see the module docstring for their meaning)."""
    G = MetricType.GAUGE
    return [
        *_gauges(report),
        *_counters(report),
        _one("duration_seconds", G, "Wall-clock duration of the run (plan + stage + commit).",
             report.duration_seconds),
        Metric(PREFIX + "phase_duration_seconds", G, "Wall-clock duration of each phase of the run.",
               tuple(Sample((("phase", k),), float(v)) for k, v in report.phase_seconds.items())),
        _one("exit_code", G, "The run's exit code (0 success or nothing to do, 3 corrupt input, 4 retryable).",
             report.exit_code),
        *_per_partition_metrics(report),
    ]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as the exposition format writes it: integers without a fraction, `NaN`, `+Inf`."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def render(metrics: Iterable[Metric]) -> str:
    """The exposition text: `# HELP`, `# TYPE`, then the samples of each family; ends with a newline.

    Families without samples (per-partition counters of a run that compacted nothing) are left out.
    """
    lines: list[str] = []
    for m in metrics:
        if not m.samples:
            continue
        lines += [f"# HELP {m.name} {_escape_help(m.help)}", f"# TYPE {m.name} {m.type.value}"]
        for s in m.samples:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels)
            lines.append(f"{m.name}{{{labels}}} {format_value(s.value)}" if labels
                         else f"{m.name} {format_value(s.value)}")
    return "\n".join(lines) + "\n"


def prometheus_text(report: RunReport) -> str:
    """The Prometheus text file of one run report."""
    return render(run_metrics(report))
