"""The run report as text: Kafka's cleaner summary per partition (`LogCleaner.recordStats`), then the run's totals
and failures, rendered from the typed `RunReport` (`compaction.run.report`)."""

from __future__ import annotations

from collections.abc import Iterator

from compaction.run.report import TARGET_FALSE_READ_RATE, PartitionReport, RunReport


def _mb(n: float) -> float:
    return n / (1024 * 1024)


def kafka_summary(part: PartitionReport) -> Iterator[str]:
    """The lines Kafka's `recordStats` prints, for one partition. Its times are the partition's own work, the
    executor time of its tasks: indexing is its scan (building the key map), cleaning its download, rewrite and
    upload. Kafka's cleaner thread does one partition at a time, so its elapsed time is that work; a run's wall
    clock also holds the Spark session's start and the other partitions' tasks, which were charged to every
    partition's rate before (a first run of 8 small partitions read "0.2 MB/sec"). The run's wall-clock split is
    the report's `time:` line and the JSON's `map_seconds` / `rewrite_seconds`."""
    read, written = part.bytes_read, part.bytes_written
    s = part.stats
    idx = max(s.scan_task_ms / 1000, 1e-9)
    clean = max((s.download_task_ms + s.rewrite_task_ms + s.upload_task_ms) / 1000, 1e-9)
    total = idx + clean
    msgs_read, msgs_written = part.records_read, part.records_written
    lo, hi = part.dirty_section or (0, 0)
    yield f"\tkcompact cleaned log {part.topic}-{part.partition} (dirty section = [{lo}, {hi}])"
    yield f"\t{_mb(read):,.1f} MB of log processed in {total:,.1f} seconds ({_mb(read) / total:,.1f} MB/sec)."
    yield (f"\tIndexed {_mb(read):,.1f} MB in {idx:.1f} seconds ({_mb(read) / max(idx, 1e-9):,.1f} Mb/sec, "
           f"{100 * idx / total:.1f}% of total time)")
    yield "\tBuffer utilization: 0.0% (no key buffer: every key is mapped in one pass)"
    yield (f"\tCleaned {_mb(read):,.1f} MB in {clean:.1f} seconds ({_mb(read) / clean:,.1f} Mb/sec, "
           f"{100 * clean / total:.1f}% of total time)")
    yield f"\tStart size: {_mb(read):,.1f} MB ({msgs_read:,d} messages)"
    yield f"\tEnd size: {_mb(written):,.1f} MB ({msgs_written:,d} messages)"
    yield (f"\t{100 * (1 - written / read) if read else 0.0:.1f}% size reduction "
           f"({100 * (1 - msgs_written / msgs_read) if msgs_read else 0.0:.1f}% fewer messages)")
    if part.stats.rewrite.invalid_records:
        yield f"\tFound {part.stats.rewrite.invalid_records} invalid messages during compaction."
    if part.error:
        yield f"\tNOT COMMITTED: {part.error}"
    sizing = part.bloom_sizing
    if sizing and sizing.too_coarse:
        yield (f"\tBloom filters at bloom.filter.fpp={sizing.filter_fpp:g} cannot skip much with "
               f"{sizing.dirty_keys:,d} dirty keys: a clean segment without any of them is read with probability "
               f"{100 * sizing.expected_false_read_rate:.0f}%. For <= {100 * TARGET_FALSE_READ_RATE:.0f}%, set "
               f"bloom.filter.fpp <= {sizing.suggested_fpp:g} (applies to filters written from then on).")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_text(report: RunReport) -> Iterator[str]:
    """The text report: Kafka's summary per partition, then the run's totals and failures."""
    for part in report.partitions:
        yield from kafka_summary(part)
        yield ""
    if report.partitions:
        yield "(each partition's seconds above are its own executor time; the run's wall clock is below)"
    split = report.time_split_seconds
    yield (f"run {report.run_id}: {report.committed} partitions compacted, {len(report.failed)} failed; "
           f"{_mb(report.bytes_read):,.1f} MB read, {_mb(report.bytes_written):,.1f} MB written; "
           f"max compaction delay {report.max_compaction_delay_secs} s; "
           f"time: map {split.map:.1f} s, rewrite + upload {split.rewrite:.1f} s")
    r = report.requests
    yield (f"filters kept {report.segments_skipped} clean segments unread "
           f"({_mb(report.bytes_not_downloaded):,.1f} MB not downloaded); store requests: {r.gets} GET "
           f"({_mb(r.bytes_read):,.1f} MB), {r.puts} PUT ({_mb(r.bytes_written):,.1f} MB); "
           f"fetch ratio {_ratio(report.fetch_ratio)} (fetched / needed; 1.00 = every byte fetched once)")
    if (d := report.plan_requests).gets:
        yield f"the plan's requests (in the driver): {d.gets} GET ({_mb(d.bytes_read):,.1f} MB)"
    m = report.metadata_requests
    if m.puts or m.gets:
        yield (f"metadata table requests: {m.puts} PUT ({_mb(m.bytes_written):,.1f} MB), {m.gets} GET "
               f"({_mb(m.bytes_read):,.1f} MB) (kcompact's commits and reads; delta-rs's reads of the log not counted)")
    tasks = report.task_seconds
    if any(tasks.values()):
        yield "executor task time: " + ", ".join(f"{k} {v:.1f} s" for k, v in tasks.items())
    if report.phase_seconds:
        yield "phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.phase_seconds.items())
    if report.retention is not None and report.retention.noteworthy:
        yield from report.retention.summary().splitlines()
    for f in report.failed:
        yield f"  {f.topic}-{f.partition}: {f.error_type}: {f.error}"


__all__ = ["kafka_summary", "render_text"]
