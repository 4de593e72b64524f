"""The run report: Kafka's cleaner summary per partition (`LogCleaner.recordStats`), and the same facts as JSON.

The report dict is the one value every output is rendered from: the text summary here, the JSON file, the
HTML page (`compaction.run.report_html`) and the Prometheus file (`compaction.run.metrics`). A run with nothing to do
has a report too (`plan_report`), with the plan's gauges and no partitions, so monitoring sees every run.
`phase_seconds` (plan, stage, commit) is measured by the caller, which owns the clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from compaction.errors import ExitCode
from compaction.planner import PartitionPlan
from compaction.run.commit import PartitionOutcome
from compaction.run.plan import RunPlan
from compaction.run.stage import StagedPartition, StagedRun


def _mb(n: float) -> float:
    return n / (1024 * 1024)


def partition_report(sp: StagedPartition, outcome: PartitionOutcome | None) -> dict[str, Any]:
    s = sp.stats
    regions = sp.plan.regions
    return {
        "topic": sp.plan.topic,
        "partition": sp.plan.partition,
        "dirty_section": None if regions is None else [regions.first_dirty_offset, regions.first_uncleanable_offset],
        "bytes_read": s.get("bytes_read", 0),
        "bytes_written": s.get("bytes_written", 0),
        "records_read": s.get("records_read", 0),
        "records_written": s.get("records_written", 0),
        "invalid_records": s.get("invalid_records", 0),
        "segments_replaced": len(sp.replaced),
        "segments_written": len(sp.new_segments),
        "map_seconds": round(sp.map_seconds, 3),
        "rewrite_seconds": round(sp.rewrite_seconds, 3),
        "total_seconds": round(sp.map_seconds + sp.rewrite_seconds, 3),
        "fencing_epoch": sp.fencing_epoch,
        "cleaner_offset": sp.cleaner_offset,
        "committed": outcome.committed if outcome else False,
        "metadata_version": outcome.version if outcome else None,
        "error": outcome.error if outcome else None,
        **_filter_figures(s),
        "fetch_ratio": fetch_ratio(s.get("store_bytes_read", 0), s.get("needed_bytes", 0)),
        "bloom_sizing": bloom_sizing(sp.filter_fpp, s.get("dirty_keys", 0),
                                     s.get("clean_segments", 0)),
        "stats": s,
    }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _filter_figures(s: Mapping[str, int]) -> dict[str, Any]:
    """Clean segments the filters kept unread, and every store request the partition made.

    Observed false-positive rates: `segments` over clean segments that held no dirty key (kept, or read for
    nothing), `keys` over (dirty key, filter) tests whose truth is known (see `compaction.run.stats.partition_stats`).
    """
    fp_segments = s.get("bloom_segment_false_positives", 0)
    return {
        "segments_skipped": s.get("segments_skipped", 0),
        "bytes_not_downloaded": s.get("bytes_not_downloaded", 0),
        "bloom_false_positive_rate": {
            "segments": _rate(fp_segments, fp_segments + s.get("bloom_segment_true_negatives", 0)),
            "keys": _rate(s.get("bloom_key_false_positives", 0), s.get("bloom_key_absent_tests", 0)),
        },
        "requests": {k: s.get(f"store_{k}", 0) for k in ("gets", "puts", "bytes_read", "bytes_written")},
    }


TARGET_FALSE_READ_RATE = 0.01
"""The share of clean segments without a dirty key that a run may read for nothing. The goal is to read at most
2% of the cleaned region beyond the segments that hold a dirty key; the filters themselves are read too
(~1.44 log2(1/fpp) bits per key: ~0.8% of 400-byte records at 1e-6, `make bench` P4), so half of it."""


def fetch_ratio(fetched: int, needed: int) -> float | None:
    """Bytes fetched from the store over the bytes of the segments and filters the run had to read: 1.0 when each
    was fetched once (the companions a rewrite copies, a producer snapshot and an epoch checkpoint per output,
    add a little). None when the run read nothing."""
    return round(fetched / needed, 4) if needed else None


def bloom_sizing(fpp: float, dirty_keys: int, clean_segments: int) -> dict[str, Any] | None:
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
    return {
        "filter_fpp": fpp,
        "dirty_keys": dirty_keys,
        "expected_false_read_rate": round(read, 6),
        "suggested_fpp": float(f"{suggested:.2g}"),
        "too_coarse": read > TARGET_FALSE_READ_RATE,
    }


def planned_partition(p: PartitionPlan) -> dict[str, Any]:
    """The plan's view of one partition, as the HTML page and the metrics show it for every partition."""
    r = p.regions
    return {
        "topic": p.topic,
        "partition": p.partition,
        "decision": p.decision.value,
        "eligible": p.eligible,
        "dirty_ratio": round(p.dirty_ratio, 6),
        "max_compaction_delay_secs": p.max_compaction_delay_ms // 1000,
        "clean_bytes": r.clean_bytes if r else 0,
        "cleanable_bytes": r.cleanable_bytes if r else 0,
        "uncleanable_bytes": r.uncleanable_bytes if r else 0,
        "reason": p.reason,
    }


def run_report(staged: StagedRun, outcomes: Sequence[PartitionOutcome],
               phase_seconds: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The report of a run that staged (and tried to commit) its eligible partitions."""
    by_tp = {(o.topic, o.partition): o for o in outcomes}
    parts = [partition_report(sp, by_tp.get((sp.plan.topic, sp.plan.partition))) for sp in staged.partitions]
    failed = [vars(o) for o in outcomes if not o.committed]
    split = {"map": round(staged.map_seconds, 3), "rewrite": round(staged.rewrite_seconds, 3)}
    return _report(staged.run, parts, failed, split, phase_seconds)


def plan_report(run: RunPlan, phase_seconds: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The report of a run with nothing to compact: the plan's gauges, no partitions, nothing read or written;
    partitions quarantined at planning (unreadable input) are its failures, with their exit codes."""
    failed = [{"topic": t, "partition": p, "committed": False, "version": None, "error": str(exc),
               "error_type": type(exc).__name__, "exit_code": int(exc.exit_code)} for t, p, exc in run.quarantined]
    return _report(run, [], failed, {"map": 0.0, "rewrite": 0.0}, phase_seconds)


def _report(run: RunPlan, parts: list[dict[str, Any]], failed: list[dict[str, Any]], split: dict[str, float],
            phase_seconds: Mapping[str, float] | None) -> dict[str, Any]:
    plan = run.plan
    phases = {k: round(v, 3) for k, v in (phase_seconds or {}).items()}
    return {
        "run_id": run.run_id,
        "now_ms": plan.now_ms,
        "metadata_version_planned": plan.metadata_version,
        "max_compaction_delay_secs": plan.max_compaction_delay_ms // 1000,
        "max_dirty_percent": plan.max_dirty_percent,
        "partitions": parts,
        "failed": failed,
        "uncleanable_partitions": [f"{f['topic']}-{f['partition']}" for f in failed
                                   if f["exit_code"] == ExitCode.CORRUPT_INPUT],
        "bytes_read": sum(p["bytes_read"] for p in parts),
        "bytes_written": sum(p["bytes_written"] for p in parts),
        "segments_skipped": sum(p["segments_skipped"] for p in parts),
        "bytes_not_downloaded": sum(p["bytes_not_downloaded"] for p in parts),
        "requests": {k: sum(p["requests"][k] for p in parts) for k in ("gets", "puts", "bytes_read", "bytes_written")},
        "fetch_ratio": fetch_ratio(sum(p["requests"]["bytes_read"] for p in parts),
                                   sum(p["stats"].get("needed_bytes", 0) for p in parts)),
        "time_split_seconds": split,
        "task_seconds": {  # executor time summed over tasks (not wall clock): where the map and rewrite went
            t: round(sum(p["stats"].get(f"{t}_task_ms", 0) for p in parts) / 1000, 3)
            for t in ("scan", "download", "rewrite", "upload")
        },
        "phase_seconds": phases,
        "duration_seconds": round(sum(phases.values()), 3),
        "planned": [planned_partition(p) for p in plan.partitions],
        "exit_code": max((int(f["exit_code"]) for f in failed), default=0),
    }


def kafka_summary(part: dict[str, Any]) -> Iterator[str]:
    """The lines Kafka's `recordStats` prints, for one partition."""
    read, written = part["bytes_read"], part["bytes_written"]
    total = max(part["total_seconds"], 1e-9)
    idx = min(part["map_seconds"], total)
    clean = max(total - idx, 1e-9)
    msgs_read, msgs_written = part["records_read"], part["records_written"]
    lo, hi = part["dirty_section"] or (0, 0)
    yield f"\tkcompact cleaned log {part['topic']}-{part['partition']} (dirty section = [{lo}, {hi}])"
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
    if part["invalid_records"]:
        yield f"\tFound {part['invalid_records']} invalid messages during compaction."
    if part["error"]:
        yield f"\tNOT COMMITTED: {part['error']}"
    sizing = part.get("bloom_sizing")
    if sizing and sizing["too_coarse"]:
        yield (f"\tBloom filters at bloom.filter.fpp={sizing['filter_fpp']:g} cannot skip much with "
               f"{sizing['dirty_keys']:,d} dirty keys: a clean segment without any of them is read with probability "
               f"{100 * sizing['expected_false_read_rate']:.0f}%. For <= {100 * TARGET_FALSE_READ_RATE:.0f}%, set "
               f"bloom.filter.fpp <= {sizing['suggested_fpp']:g} (applies to filters written from then on).")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_text(report: dict[str, Any]) -> Iterator[str]:
    for part in report["partitions"]:
        yield from kafka_summary(part)
        yield ""
    committed = sum(1 for p in report["partitions"] if p["committed"])
    split = report["time_split_seconds"]
    yield (f"run {report['run_id']}: {committed} partitions compacted, {len(report['failed'])} failed; "
           f"{_mb(report['bytes_read']):,.1f} MB read, {_mb(report['bytes_written']):,.1f} MB written; "
           f"max compaction delay {report['max_compaction_delay_secs']} s; "
           f"time: map {split['map']:.1f} s, rewrite + upload {split['rewrite']:.1f} s")
    r = report["requests"]
    yield (f"filters kept {report['segments_skipped']} clean segments unread "
           f"({_mb(report['bytes_not_downloaded']):,.1f} MB not downloaded); store requests: {r['gets']} GET "
           f"({_mb(r['bytes_read']):,.1f} MB), {r['puts']} PUT ({_mb(r['bytes_written']):,.1f} MB); "
           f"fetch ratio {_ratio(report.get('fetch_ratio'))} (fetched / needed; 1.00 = every byte fetched once)")
    tasks = report.get("task_seconds") or {}
    if any(tasks.values()):
        yield "executor task time: " + ", ".join(f"{k} {v:.1f} s" for k, v in tasks.items())
    if report.get("phase_seconds"):
        yield "phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["phase_seconds"].items())
    for f in report["failed"]:
        yield f"  {f['topic']}-{f['partition']}: {f['error_type']}: {f['error']}"
