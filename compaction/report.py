"""The run report: Kafka's cleaner summary per partition (spec §3.12), and the same facts as JSON."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from compaction.cleaner import PartitionOutcome, StagedPartition, StagedRun


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
        "stats": s,
    }


def run_report(staged: StagedRun, outcomes: Sequence[PartitionOutcome]) -> dict[str, Any]:
    by_tp = {(o.topic, o.partition): o for o in outcomes}
    parts = [partition_report(sp, by_tp.get((sp.plan.topic, sp.plan.partition))) for sp in staged.partitions]
    plan = staged.run.plan
    return {
        "run_id": staged.run.run_id,
        "now_ms": plan.now_ms,
        "metadata_version_planned": plan.metadata_version,
        "max_compaction_delay_secs": plan.max_compaction_delay_ms // 1000,
        "max_dirty_percent": plan.max_dirty_percent,
        "partitions": parts,
        "failed": [vars(o) for o in outcomes if not o.committed],
        "bytes_read": sum(p["bytes_read"] for p in parts),
        "bytes_written": sum(p["bytes_written"] for p in parts),
        "time_split_seconds": {"map": round(staged.map_seconds, 3), "rewrite": round(staged.rewrite_seconds, 3)},
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
    for f in report["failed"]:
        yield f"  {f['topic']}-{f['partition']}: {f['error_type']}: {f['error']}"
