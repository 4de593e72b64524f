"""One partition's counters for the report: the rewrite's, the filter test's, disk, requests and fetch ratio.

`PartitionStats` is a frozen value; `to_dict()` is its JSON form (the report's per-partition `stats`), with the
rewrite's counters first, flat, as the report has always shown them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from compaction.bloom.skipping import Verdict
from compaction.rewrite.stats import RewriteStats
from compaction.tasks import PartitionWork

if TYPE_CHECKING:
    from compaction.spark.pipeline import PartitionStage


_PER_SEGMENT = ("max_timestamp", "first_batch_max_timestamp")  # go to each output's metadata; they do not add up
_COUNTERS = tuple(f.name for f in fields(RewriteStats) if f.name not in _PER_SEGMENT)


def summed_rewrites(chunks: Iterable[Mapping[str, int]]) -> RewriteStats:
    """The counters of chunks' rewrites (`ChunkResult.stats`) added up; the per-segment timestamps stay unset."""
    stats = list(chunks)
    return RewriteStats(**{name: sum(int(s[name]) for s in stats) for name in _COUNTERS})


@dataclass(frozen=True)
class PartitionStats:
    """A staged partition's counters.

    Filter accounting: a kept segment is a true negative (its filter proved no dirty key); a rewritten clean
    one was scanned, which tells how many dirty keys it really held, so a positive segment that held none is a
    false positive. `bloom_key_*` count (dirty key, filter) tests whose truth is known, for the per-key rate.

    `needed_bytes` is what the run had to read: every segment it scanned, plus the filters it tested;
    `store_bytes_read` what it fetched (all requests). Their ratio is the report's `fetch_ratio`: 1.0 when every
    byte was fetched once.
    """

    rewrite: RewriteStats = field(default_factory=RewriteStats)  # summed over the chunks (`summed_rewrites`)
    download_task_ms: int = 0  # executor time of the chunks' steps, summed
    rewrite_task_ms: int = 0
    upload_task_ms: int = 0
    invalid_versions: int = 0  # header strategy: records whose version header is missing or not 8 bytes
    dirty_keys: int = 0
    clean_segments: int = 0
    segments_skipped: int = 0
    bytes_not_downloaded: int = 0
    filters_read: int = 0
    filter_bytes_read: int = 0
    filters_built: int = 0
    clean_bytes_rewritten: int = 0
    segments_merged: int = 0
    bloom_segment_true_negatives: int = 0
    bloom_segment_false_positives: int = 0
    bloom_key_false_positives: int = 0
    bloom_key_absent_tests: int = 0
    chunks: int = 0
    rewrite_tasks: int = 0
    segments_scanned: int = 0
    segments_cached: int = 0
    cache_hits: int = 0
    peak_temp_bytes: int = 0
    disk_budget_bytes: int = 0
    scan_task_ms: int = 0
    needed_bytes: int = 0
    store_gets: int = 0
    store_puts: int = 0
    store_bytes_read: int = 0
    store_bytes_written: int = 0

    def to_dict(self) -> dict[str, int]:
        """The JSON form: the rewrite's counters, then the partition's, one flat dict of ints."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rewrite"}
        return {**{name: getattr(self.rewrite, name) for name in _COUNTERS}, **own}


def partition_stats(work: PartitionWork, done: PartitionStage) -> PartitionStats:
    """The partition's counters: the rewrite's (summed over chunks), the filter test's, disk and requests."""
    known = {i: n for i, n in done.true_dirty.items() if i in done.probes and done.probes[i].readable}
    sizes = {s.segment_id: s.segment_size_bytes for s in work.segments}
    kept = {s.segment_id for s in done.kept}
    filter_bytes = sum(p.filter_bytes for p in done.probes.values())
    return PartitionStats(
        rewrite=summed_rewrites(chunk.stats for chunk in done.chunks),
        download_task_ms=sum(int(chunk.stats["download_task_ms"]) for chunk in done.chunks),
        rewrite_task_ms=sum(int(chunk.stats["rewrite_task_ms"]) for chunk in done.chunks),
        upload_task_ms=sum(int(chunk.stats["upload_task_ms"]) for chunk in done.chunks),
        invalid_versions=done.scan.invalid_versions,
        dirty_keys=done.dirty_keys,
        clean_segments=len(work.clean),
        segments_skipped=len(kept),
        bytes_not_downloaded=sum(s.segment_size_bytes for s in done.kept),
        filters_read=sum(1 for p in done.probes.values() if p.readable),
        filter_bytes_read=filter_bytes,
        filters_built=len(done.scan.filters_built),
        clean_bytes_rewritten=sum(sizes[i] for i in done.verdicts if i not in kept),
        segments_merged=sum(1 for v in done.verdicts.values() if v is Verdict.MERGED),
        bloom_segment_true_negatives=len(kept),
        bloom_segment_false_positives=sum(1 for i, n in known.items() if done.verdicts[i] is Verdict.HIT and n == 0),
        bloom_key_false_positives=sum(done.probes[i].positives - n for i, n in known.items()),
        bloom_key_absent_tests=sum(done.dirty_keys - n for n in known.values()) + done.dirty_keys * len(kept),
        chunks=done.chunk_count,
        rewrite_tasks=done.rewrite_tasks,
        segments_scanned=len(done.scan.scanned),
        segments_cached=len(done.scan.cached),
        cache_hits=done.cache_hits,
        peak_temp_bytes=done.peak_temp_bytes,
        disk_budget_bytes=int(work.task.disk_budget_bytes or 0),
        scan_task_ms=done.scan.scan_task_ms,
        needed_bytes=sum(done.scan.scanned.values()) + filter_bytes,
        store_gets=done.requests.gets,
        store_puts=done.requests.puts,
        store_bytes_read=done.requests.bytes_read,
        store_bytes_written=done.requests.bytes_written,
    )


__all__ = ["PartitionStats", "partition_stats", "summed_rewrites"]
