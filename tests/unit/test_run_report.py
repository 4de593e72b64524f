"""The JSON run report's shape is pinned: its keys, in order, at every level (users parse it), and the figures
derived from the typed report (`compaction.run.report.RunReport`) are the ones the JSON shows."""

from __future__ import annotations

import json
from dataclasses import replace

from compaction.run.report import RunReport
from tests.unit.run_reports import nothing_to_do_run, sample_run

RUN_KEYS = ["run_id", "now_ms", "metadata_version_planned", "max_compaction_delay_secs", "max_dirty_percent",
            "partitions", "failed", "uncleanable_partitions", "bytes_read", "bytes_written", "segments_skipped",
            "bytes_not_downloaded", "requests", "plan_requests", "metadata_requests", "fetch_ratio",
            "time_split_seconds", "task_seconds", "phase_seconds", "duration_seconds", "planned", "retention",
            "exit_code"]
PARTITION_KEYS = ["topic", "partition", "dirty_section", "bytes_read", "bytes_written", "records_read",
                  "records_written", "invalid_records", "segments_replaced", "segments_written", "map_seconds",
                  "rewrite_seconds", "total_seconds", "fencing_epoch", "cleaner_offset", "committed",
                  "metadata_version", "error", "segments_skipped", "bytes_not_downloaded", "bloom_false_positive_rate",
                  "requests", "fetch_ratio", "bloom_sizing", "stats"]
STATS_KEYS = ["bytes_read", "bytes_written", "records_read", "records_written", "invalid_records", "batches_read",
              "batches_copied_verbatim", "batches_rebuilt", "batches_emptied", "batches_dropped", "tombstones_retained",
              "tombstones_removed", "aborted_records_removed", "markers_removed", "empty_outputs", "download_task_ms",
              "rewrite_task_ms", "upload_task_ms", "invalid_versions", "dirty_keys", "clean_segments",
              "segments_skipped", "bytes_not_downloaded", "filters_read", "filter_bytes_read", "filters_built",
              "clean_bytes_rewritten", "segments_merged", "bloom_segment_true_negatives",
              "bloom_segment_false_positives", "bloom_key_false_positives", "bloom_key_absent_tests", "chunks",
              "rewrite_tasks", "segments_scanned", "segments_cached", "cache_hits", "peak_temp_bytes",
              "disk_budget_bytes", "scan_task_ms", "needed_bytes", "store_gets", "store_puts", "store_bytes_read",
              "store_bytes_written"]
FAILED_KEYS = ["topic", "partition", "committed", "version", "error", "error_type", "exit_code"]
PLANNED_KEYS = ["topic", "partition", "decision", "eligible", "dirty_ratio", "max_compaction_delay_secs",
                "clean_bytes", "cleanable_bytes", "uncleanable_bytes", "reason"]
REQUEST_KEYS = ["gets", "puts", "bytes_read", "bytes_written"]


def test_the_json_report_has_its_keys_in_order_at_every_level() -> None:
    doc = sample_run().to_dict()
    assert list(doc) == RUN_KEYS
    part = doc["partitions"][0]
    assert list(part) == PARTITION_KEYS and list(part["stats"]) == STATS_KEYS
    assert list(part["requests"]) == list(doc["requests"]) == list(doc["metadata_requests"]) == REQUEST_KEYS
    assert list(doc["plan_requests"]) == REQUEST_KEYS
    assert list(part["bloom_false_positive_rate"]) == ["segments", "keys"]
    assert list(part["bloom_sizing"]) == ["filter_fpp", "dirty_keys", "expected_false_read_rate", "suggested_fpp",
                                          "too_coarse"]
    assert list(doc["failed"][0]) == FAILED_KEYS and list(doc["planned"][0]) == PLANNED_KEYS
    assert list(doc["time_split_seconds"]) == ["map", "rewrite"]
    assert list(doc["task_seconds"]) == ["scan", "download", "rewrite", "upload"]
    assert list(nothing_to_do_run().to_dict()) == RUN_KEYS


def test_the_json_report_is_plain_json() -> None:
    doc = sample_run().to_dict()
    assert json.loads(json.dumps(doc)) == doc, "lists, not tuples; no dataclass left"


def test_the_totals_are_the_partitions_summed() -> None:
    doc = sample_run().to_dict()
    assert doc["bytes_read"] == 600_000 and doc["bytes_written"] == 150_000
    assert doc["requests"] == {"gets": 20, "puts": 6, "bytes_read": 600_000, "bytes_written": 150_000}
    assert doc["segments_skipped"] == 2 and doc["bytes_not_downloaded"] == 2000
    assert doc["fetch_ratio"] == 1.0 and doc["partitions"][0]["fetch_ratio"] == 1.0
    assert doc["task_seconds"] == {"scan": 2.5, "download": 0.5, "rewrite": 1.5, "upload": 0.5}
    assert doc["duration_seconds"] == 5.75
    assert doc["uncleanable_partitions"] == ["users-1"] and doc["exit_code"] == 4
    assert doc["partitions"][0]["dirty_section"] == [0, 4000]


def test_the_partition_figures_come_from_its_stats() -> None:
    part = sample_run().partitions[0]
    doc = part.to_dict()
    assert doc["bloom_false_positive_rate"] == {"segments": 0.0, "keys": 0.01}
    assert doc["stats"]["bytes_read"] == doc["bytes_read"] == part.stats.rewrite.bytes_read
    sizing = doc["bloom_sizing"]
    assert sizing["too_coarse"] and sizing["dirty_keys"] == 300 and sizing["filter_fpp"] == 0.01
    unread = replace(part, stats=replace(part.stats, needed_bytes=0, clean_segments=0))
    assert unread.to_dict()["fetch_ratio"] is None and unread.to_dict()["bloom_sizing"] is None


def test_a_run_with_nothing_to_do_reports_zeros() -> None:
    report: RunReport = nothing_to_do_run()
    doc = report.to_dict()
    assert doc["partitions"] == [] and doc["failed"] == [] and doc["exit_code"] == 0
    assert doc["fetch_ratio"] is None and doc["bytes_read"] == 0
    assert doc["task_seconds"] == {"scan": 0.0, "download": 0.0, "rewrite": 0.0, "upload": 0.0}
