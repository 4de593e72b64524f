"""The text report's per-partition lines (Kafka's `recordStats` shape) show each partition's own work."""

from __future__ import annotations

from dataclasses import replace

from compaction.run.report_text import kafka_summary, render_text
from tests.unit.run_reports import sample_run


def test_a_partitions_rate_is_its_own_executor_time_not_the_runs_wall_clock() -> None:
    """The sample partition's scan took 1.25 s of task time and its chunks 1.25 s (0.25 + 0.75 + 0.25), while
    the run's map and rewrite wall clock, Spark's start included, is charged 3 + 1 s: the lines use the former."""
    part = replace(sample_run().partitions[0], map_seconds=30.0, rewrite_seconds=10.0, total_seconds=40.0)
    lines = list(kafka_summary(part))
    assert lines[1] == "\t0.4 MB of log processed in 2.5 seconds (0.2 MB/sec)."
    assert lines[2] == "\tIndexed 0.4 MB in 1.2 seconds (0.3 Mb/sec, 50.0% of total time)"
    assert lines[4] == "\tCleaned 0.4 MB in 1.2 seconds (0.3 Mb/sec, 50.0% of total time)"


def test_the_report_says_whose_seconds_the_partition_lines_count() -> None:
    text = list(render_text(sample_run()))
    note = text.index("(each partition's seconds above are its own executor time; the run's wall clock is below)")
    run_line = text[note + 1]
    assert run_line.startswith("run 0123456789ab: ") and "time: map 3.0 s, rewrite + upload 1.0 s" in run_line
