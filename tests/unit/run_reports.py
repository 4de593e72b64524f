"""A run report as `compaction.run.report` builds it, written out: two partitions staged (one committed, one that
lost a commit race), one quarantined for corrupt input, and one below its dirty ratio.
`tests/integration/test_compact_outputs.py` checks that real reports have exactly these keys."""

from __future__ import annotations

from typing import Any


def planned(topic: str, partition: int, decision: str, ratio: float, delay_secs: int, cleanable: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "decision": decision,
            "eligible": decision in ("must_clean", "dirty_ratio", "forced"), "dirty_ratio": ratio,
            "max_compaction_delay_secs": delay_secs, "clean_bytes": 1000, "cleanable_bytes": cleanable,
            "uncleanable_bytes": 0, "reason": f"{decision} because of reasons"}


def staged(topic: str, partition: int, bytes_: tuple[int, int], records: tuple[int, int], version: int | None,
           error: str | None = None) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "dirty_section": [0, records[0]], "bytes_read": bytes_[0],
            "bytes_written": bytes_[1], "records_read": records[0], "records_written": records[1],
            "invalid_records": 0, "segments_replaced": 4, "segments_written": 1, "map_seconds": 3.0,
            "rewrite_seconds": 1.0, "total_seconds": 4.0, "fencing_epoch": 2, "cleaner_offset": records[0],
            "committed": version is not None, "metadata_version": version, "error": error,
            "segments_skipped": 1, "bytes_not_downloaded": 1000,
            "bloom_false_positive_rate": {"segments": 0.0, "keys": 0.01},
            "requests": {"gets": 10, "puts": 3, "bytes_read": bytes_[0], "bytes_written": bytes_[1]},
            "fetch_ratio": 1.0,
            "bloom_sizing": {"filter_fpp": 0.01, "dirty_keys": 300, "expected_false_read_rate": 0.95,
                             "suggested_fpp": 3.4e-05, "too_coarse": True}, "stats": {}}


def failed(topic: str, partition: int, error_type: str, exit_code: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "committed": False, "version": None,
            "error": f"{topic}-{partition}: it went wrong", "error_type": error_type, "exit_code": exit_code}


def sample_report() -> dict[str, Any]:
    parts = [staged("orders", 0, (400_000, 100_000), (4000, 300), 12),
             staged("orders", 1, (200_000, 50_000), (2000, 200), None, "expected commit_seq 3, found 4")]
    fails = [failed("orders", 1, "CommitConflictError", 4), failed("users", 1, "CorruptBatchError", 3)]
    return {
        "run_id": "0123456789ab",
        "now_ms": 1_800_000_000_000,
        "metadata_version_planned": 11,
        "max_compaction_delay_secs": 120,
        "max_dirty_percent": 80,
        "partitions": parts,
        "failed": fails,
        "uncleanable_partitions": ["users-1"],
        "bytes_read": 600_000,
        "bytes_written": 150_000,
        "segments_skipped": 2,
        "bytes_not_downloaded": 2000,
        "requests": {"gets": 20, "puts": 6, "bytes_read": 600_000, "bytes_written": 150_000},
        "fetch_ratio": 1.0,
        "time_split_seconds": {"map": 3.0, "rewrite": 1.0},
        "task_seconds": {"scan": 2.5, "download": 0.5, "rewrite": 1.5, "upload": 0.5},
        "phase_seconds": {"plan": 0.5, "stage": 5.0, "commit": 0.25},
        "duration_seconds": 5.75,
        "planned": [planned("orders", 0, "must_clean", 0.8, 120, 400_000),
                    planned("orders", 1, "dirty_ratio", 0.6, 0, 200_000),
                    planned("users", 0, "below_ratio", 0.1, 0, 100),
                    planned("users", 1, "dirty_ratio", 0.7, 0, 300_000)],
        "exit_code": 4,
    }


def nothing_to_do_report() -> dict[str, Any]:
    report = sample_report()
    report.update(partitions=[], failed=[], uncleanable_partitions=[], bytes_read=0, bytes_written=0,
                  segments_skipped=0, bytes_not_downloaded=0,
                  requests={"gets": 0, "puts": 0, "bytes_read": 0, "bytes_written": 0},
                  time_split_seconds={"map": 0.0, "rewrite": 0.0}, phase_seconds={"plan": 0.4},
                  task_seconds={"scan": 0.0, "download": 0.0, "rewrite": 0.0, "upload": 0.0},
                  duration_seconds=0.4, exit_code=0,
                  planned=[planned("orders", 0, "below_ratio", 0.2, 0, 500)])
    return report
