"""A run report as `compaction.run.report` builds it, written out: two partitions staged (one committed, one that
lost a commit race), one quarantined for corrupt input, and one below its dirty ratio. `sample_run` is the typed
value, `sample_report` its JSON form; `tests/integration/test_compact_outputs.py` checks that real reports have
exactly these keys."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from compaction.rewrite.stats import RewriteStats
from compaction.run.commit import PartitionOutcome
from compaction.run.report import PartitionReport, PlannedPartition, RunReport, TimeSplit
from compaction.run.stats import PartitionStats


def planned(topic: str, partition: int, decision: str, ratio: float, delay_secs: int, cleanable: int
            ) -> PlannedPartition:
    return PlannedPartition(topic, partition, decision, decision in ("must_clean", "dirty_ratio", "forced"), ratio,
                            delay_secs, 1000, cleanable, 0, f"{decision} because of reasons")


def staged(topic: str, partition: int, bytes_: tuple[int, int], records: tuple[int, int], version: int | None,
           error: str | None = None) -> PartitionReport:
    rewrite = RewriteStats(bytes_read=bytes_[0], bytes_written=bytes_[1], records_read=records[0],
                           records_written=records[1])
    stats = PartitionStats(rewrite, download_task_ms=250, rewrite_task_ms=750, upload_task_ms=250, dirty_keys=300,
                           clean_segments=2, segments_skipped=1, bytes_not_downloaded=1000,
                           bloom_segment_true_negatives=1, bloom_key_false_positives=3, bloom_key_absent_tests=300,
                           scan_task_ms=1250, needed_bytes=bytes_[0], store_gets=10, store_puts=3,
                           store_bytes_read=bytes_[0], store_bytes_written=bytes_[1])
    return PartitionReport(topic, partition, (0, records[0]), 4, 1, 3.0, 1.0, 4.0, 2, records[0], version is not None,
                           version, error, 0.01, stats)


def failed(topic: str, partition: int, error_type: str, exit_code: int) -> PartitionOutcome:
    return PartitionOutcome(topic, partition, False, None, f"{topic}-{partition}: it went wrong", error_type,
                            exit_code)


def sample_run() -> RunReport:
    parts = (staged("orders", 0, (400_000, 100_000), (4000, 300), 12),
             staged("orders", 1, (200_000, 50_000), (2000, 200), None, "expected commit_seq 3, found 4"))
    fails = (failed("orders", 1, "CommitConflictError", 4), failed("users", 1, "CorruptBatchError", 3))
    return RunReport(
        run_id="0123456789ab",
        now_ms=1_800_000_000_000,
        metadata_version_planned=11,
        max_compaction_delay_secs=120,
        max_dirty_percent=80,
        partitions=parts,
        failed=fails,
        time_split_seconds=TimeSplit(3.0, 1.0),
        planned=(planned("orders", 0, "must_clean", 0.8, 120, 400_000),
                 planned("orders", 1, "dirty_ratio", 0.6, 0, 200_000),
                 planned("users", 0, "below_ratio", 0.1, 0, 100),
                 planned("users", 1, "dirty_ratio", 0.7, 0, 300_000)),
        phase_seconds={"plan": 0.5, "stage": 5.0, "commit": 0.25},
    )


def nothing_to_do_run() -> RunReport:
    return replace(sample_run(), partitions=(), failed=(), time_split_seconds=TimeSplit(), phase_seconds={"plan": 0.4},
                   planned=(planned("orders", 0, "below_ratio", 0.2, 0, 500),))


def sample_report() -> dict[str, Any]:
    return sample_run().to_dict()
