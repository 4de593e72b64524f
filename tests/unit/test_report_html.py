"""The HTML report: one self-contained page (nothing fetched), bars that measure what they claim, text escaped."""

from __future__ import annotations

from dataclasses import replace
from html.parser import HTMLParser

import pytest

from compaction.retention import Breach, ExpiredSegment, PartitionExpiry, PartitionRetention, RetentionReport
from compaction.run.report_html import CHART_WIDTH, LABEL_WIDTH, VALUE_WIDTH, render_html
from tests.unit.run_reports import nothing_to_do_run, sample_run

FETCHING_TAGS = {"script", "link", "img", "iframe", "object", "embed", "source", "audio", "video", "base"}


class Page(HTMLParser):
    """Every start tag with its attributes, and the rects of each <svg> in page order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.charts: list[list[dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "svg":
            self.charts.append([])
        elif tag == "rect":
            self.charts[-1].append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def bars(chart: list[dict[str, str | None]]) -> list[tuple[str, float, float]]:
    return [(str(r["data-series"]), float(r["data-value"] or 0), float(r["width"] or 0)) for r in chart]


def test_the_page_is_self_contained() -> None:
    html = render_html(sample_run())
    page = Page(html)
    assert not FETCHING_TAGS & {tag for tag, _ in page.tags}
    assert not [a for _, attrs in page.tags for a in attrs if a in ("src", "href", "xlink:href", "srcset")]
    assert "http" not in html.lower() and "url(" not in html and "@import" not in html
    assert html.startswith("<!DOCTYPE html>") and "<style>" in html
    assert len(page.charts) == 3, "bytes, records, time split"


def test_bars_are_as_long_as_their_values_say() -> None:
    report = sample_run()
    bytes_chart, records_chart, _time = Page(render_html(report)).charts
    area = CHART_WIDTH - LABEL_WIDTH - VALUE_WIDTH
    want = [("before", 400_000), ("after", 100_000), ("before", 200_000), ("after", 50_000)]
    assert [(s, v) for s, v, _w in bars(bytes_chart)] == want
    for _series, value, width in bars(bytes_chart):
        assert width == pytest.approx(area * value / 400_000, abs=0.01)
    assert [v for _s, v, _w in bars(records_chart)] == [4000, 300, 2000, 200]
    assert max(w for _s, _v, w in bars(records_chart)) == pytest.approx(area, abs=0.01)


def test_the_time_split_shows_every_phase_in_proportion() -> None:
    *_, time_chart = Page(render_html(sample_run())).charts
    # stage 5.0 s = scan + winners 3.0 + rewrite + upload 1.0 + 1.0 of other staging work
    assert [(s, v) for s, v, _w in bars(time_chart)] == [
        ("plan", 0.5), ("scan + winners", 3.0), ("rewrite + upload", 1.0), ("stage (other)", 1.0), ("commit", 0.25)]
    widths = {s: w for s, _v, w in bars(time_chart)}
    assert sum(widths.values()) == pytest.approx(CHART_WIDTH - 20, abs=0.05)
    assert widths["scan + winners"] == pytest.approx(3 * widths["rewrite + upload"], abs=0.01)


def test_failures_and_the_plan_are_listed() -> None:
    text = " ".join(Page(render_html(sample_run())).text)
    assert "users-1" in text and "CorruptBatchError" in text
    assert "expected commit_seq 3, found 4" in text
    assert "below_ratio because of reasons" in text
    assert "exit code 4" in text


def test_text_from_the_report_is_escaped() -> None:
    report = sample_run()
    failed = (replace(report.failed[0], error="<script>alert(1)</script>"), *report.failed[1:])
    planned = (replace(report.planned[0], topic='a"<u>'), *report.planned[1:])
    html = render_html(replace(report, failed=failed, planned=planned))
    assert "<script>" not in html and "<u>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_run_with_nothing_to_do_shows_the_plan() -> None:
    page = Page(render_html(nothing_to_do_run()))
    text = " ".join(page.text)
    assert "Nothing was compacted in this run." in text
    assert "orders-0" in text and "below_ratio" in text
    assert len(page.charts) == 1 and [s for s, _v, _w in bars(page.charts[0])] == ["plan"]


def test_what_retention_expired_is_listed() -> None:
    expired = ExpiredSegment("s0", 0, 99, 4096, 0, Breach.TIME)
    kept = PartitionRetention("logs", 5, (), 0, 10)
    done = PartitionRetention("orders", 2, (expired,), 100, 8192)
    retention = RetentionReport(0, 11, False, (PartitionExpiry(kept, None), PartitionExpiry(done, 12)))
    text = " ".join(Page(render_html(replace(sample_run(), retention=retention))).text)
    assert "Expired by retention" in text and "orders-2" in text and "logs-5" not in text
    assert "Expired by retention" not in " ".join(Page(render_html(sample_run())).text)
