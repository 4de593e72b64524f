"""The Prometheus file: strictly the text exposition format, parsed back by prometheus_client, values = report's."""

from __future__ import annotations

import math

import pytest

from compaction.run.metrics import Metric, MetricType, Sample, format_value, prometheus_text, render
from tests.prometheus_text import SAMPLE, parse_strict
from tests.unit.run_reports import nothing_to_do_run, sample_run


def test_the_file_is_strictly_the_text_exposition_format_and_carries_the_report() -> None:
    report = sample_run()
    samples = parse_strict(prometheus_text(report))
    assert samples[("kcompact_max_compaction_delay_secs", "")] == 120
    assert samples[("kcompact_max_dirty_percent", "")] == 80
    assert samples[("kcompact_uncleanable_partitions_count", "")] == 1
    assert samples[("kcompact_bytes_read_total", "")] == 600_000
    assert samples[("kcompact_bytes_written_total", "")] == 150_000
    assert samples[("kcompact_records_read_total", "")] == 6000
    assert samples[("kcompact_duration_seconds", "")] == 5.75
    assert samples[("kcompact_exit_code", "")] == 4
    assert samples[("kcompact_last_run_timestamp_seconds", "")] == 1_800_000_000
    assert samples[("kcompact_store_requests_total", '{method="GET"}')] == 20
    assert samples[("kcompact_store_bytes_total", '{direction="written"}')] == 150_000
    assert samples[("kcompact_segments_skipped_total", "")] == 2
    assert samples[("kcompact_partitions", '{state="failed"}')] == 2
    assert samples[("kcompact_partitions", '{state="compacted"}')] == 1
    assert samples[("kcompact_phase_duration_seconds", '{phase="commit"}')] == 0.25
    assert samples[("kcompact_partition_bytes_written_total", '{topic="orders",partition="0"}')] == 100_000
    assert samples[("kcompact_partition_committed", '{topic="orders",partition="1"}')] == 0
    assert samples[("kcompact_partition_dirty_ratio", '{topic="users",partition="0"}')] == 0.1
    assert len([k for k in samples if k[0] == "kcompact_partition_dirty_ratio"]) == 4


def test_prometheus_client_parses_the_file_back() -> None:
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is not installed")
    report = sample_run()
    families = {f.name: f for f in parser.text_string_to_metric_families(prometheus_text(report))}
    assert families["kcompact_bytes_read"].type == "counter"  # the parser drops a counter's _total
    assert families["kcompact_bytes_read"].samples[0].value == 600_000
    assert families["kcompact_max_dirty_percent"].type == "gauge"
    records = families["kcompact_partition_records_read"].samples
    assert {(s.labels["topic"], s.labels["partition"]): s.value for s in records} == {
        ("orders", "0"): 4000, ("orders", "1"): 2000}


def test_a_run_with_nothing_to_do_still_reports_every_gauge() -> None:
    samples = parse_strict(prometheus_text(nothing_to_do_run()))
    names = {name for name, _labels in samples}
    assert {"kcompact_max_compaction_delay_secs", "kcompact_max_dirty_percent", "kcompact_uncleanable_partitions_count",
            "kcompact_bytes_read_total", "kcompact_bytes_written_total", "kcompact_duration_seconds",
            "kcompact_partition_dirty_ratio", "kcompact_last_run_timestamp_seconds"} <= names
    assert samples[("kcompact_bytes_read_total", "")] == 0
    assert not any(n.startswith("kcompact_partition_bytes") for n in names), "no per-partition counters to report"


def test_label_values_and_help_are_escaped() -> None:
    nasty = 'a"b\\c\nd'
    help_text = "help with \\ and\nnewline"
    text = render([Metric("kcompact_x", MetricType.GAUGE, help_text, (Sample((("topic", nasty),), 1),))])
    assert parse_strict(text) == {("kcompact_x", '{topic="a\\"b\\\\c\\nd"}'): 1}
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is not installed")
    (family,) = parser.text_string_to_metric_families(text)
    assert family.samples[0].labels == {"topic": nasty}
    assert family.documentation == help_text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (3.0, "3"), (-2.0, "-2"), (0.25, "0.25"), (1e20, "1e+20"), (2.0**60, "1.152921504606847e+18"),
     (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN")],
)
def test_values_are_written_as_the_format_expects(value: float, text: str) -> None:
    assert format_value(value) == text
    assert SAMPLE.match(f"kcompact_x {text}")
