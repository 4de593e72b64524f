"""One partition's counters for the report: the rewrite's, the filter test's, disk, requests and fetch ratio."""

from __future__ import annotations

from typing import TYPE_CHECKING

from compaction.bloom.skipping import Verdict
from compaction.run.tasks import PartitionWork

if TYPE_CHECKING:
    from compaction.spark.pipeline import PartitionStage


def partition_stats(work: PartitionWork, done: PartitionStage) -> dict[str, int]:
    """The partition's counters: the rewrite's (summed over chunks), the filter test's, disk and requests.

    Filter accounting: a kept segment is a true negative (its filter proved no dirty key); a rewritten clean
    one was scanned, which tells how many dirty keys it really held, so a positive segment that held none is a
    false positive. `bloom_key_*` count (dirty key, filter) tests whose truth is known, for the per-key rate.

    `needed_bytes` is what the run had to read: every segment it scanned, plus the filters it tested;
    `store_bytes_read` what it fetched (all requests). Their ratio is the report's `fetch_ratio`: 1.0 when every
    byte was fetched once.
    """
    stats: dict[str, int] = {}
    for chunk in done.chunks:
        for k, v in chunk.stats.items():
            if not k.endswith("timestamp"):  # counters add up, timestamps don't
                stats[k] = stats.get(k, 0) + int(v)
    known = {i: n for i, n in done.true_dirty.items() if i in done.probes and done.probes[i].readable}
    sizes = {s.segment_id: s.segment_size_bytes for s in work.segments}
    kept = {s.segment_id for s in done.kept}
    filter_bytes = sum(p.filter_bytes for p in done.probes.values())
    stats |= {
        "invalid_versions": done.scan.invalid_versions,
        "dirty_keys": done.dirty_keys,
        "clean_segments": len(work.clean),
        "segments_skipped": len(kept),
        "bytes_not_downloaded": sum(s.segment_size_bytes for s in done.kept),
        "filters_read": sum(1 for p in done.probes.values() if p.readable),
        "filter_bytes_read": filter_bytes,
        "filters_built": len(done.scan.filters_built),
        "clean_bytes_rewritten": sum(sizes[i] for i in done.verdicts if i not in kept),
        "segments_merged": sum(1 for v in done.verdicts.values() if v is Verdict.MERGED),
        "bloom_segment_true_negatives": len(kept),
        "bloom_segment_false_positives": sum(1 for i, n in known.items() if done.verdicts[i] is Verdict.HIT and n == 0),
        "bloom_key_false_positives": sum(done.probes[i].positives - n for i, n in known.items()),
        "bloom_key_absent_tests": sum(done.dirty_keys - n for n in known.values()) + done.dirty_keys * len(kept),
        "chunks": done.chunk_count,
        "rewrite_tasks": done.rewrite_tasks,
        "segments_scanned": len(done.scan.scanned),
        "segments_cached": len(done.scan.cached),
        "cache_hits": done.cache_hits,
        "peak_temp_bytes": done.peak_temp_bytes,
        "disk_budget_bytes": int(work.task.disk_budget_bytes or 0),
        "scan_task_ms": done.scan.scan_task_ms,
        "needed_bytes": sum(done.scan.scanned.values()) + filter_bytes,
        "store_gets": done.requests.gets,
        "store_puts": done.requests.puts,
        "store_bytes_read": done.requests.bytes_read,
        "store_bytes_written": done.requests.bytes_written,
    }
    return stats


__all__ = ["partition_stats"]
