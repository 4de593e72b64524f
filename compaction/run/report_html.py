"""The run report as one self-contained HTML page: inline CSS and inline SVG charts, nothing fetched.

It shows what a person asks after a run: bytes and records per partition before and after (the input of the
rewritten groups vs the output), where the time went (plan, scan + winners, rewrite + upload, commit), which
partitions failed and why, and the plan's view of every partition (decision, dirty ratio, compaction delay),
which is the whole story for a run with nothing to do. Pure: `render_html(report)` returns the page; every
text from the report is escaped. The page opens from a file, offline, in any browser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from compaction.planner.explain import byte_size, duration, timestamp
from compaction.run.report import PartitionReport, PlannedPartition, RunReport

BEFORE, AFTER = "#9aa5b1", "#2f6fde"
PHASE_COLORS = {"plan": "#8e6cd1", "scan + winners": "#2f6fde", "rewrite + upload": "#27a567",
                "stage (other)": "#b7c4d4", "commit": "#e0892b"}
CHART_WIDTH, LABEL_WIDTH, VALUE_WIDTH, BAR_HEIGHT = 760, 150, 150, 14

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1000px;color:#1d2733}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea}
.sub{color:#5b6b7c;margin-bottom:16px}.ok{color:#1f8a4c}.bad{color:#c0392b}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 12px;
min-width:150px}.card b{display:block;font-size:18px}.card span{color:#5b6b7c;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #eef1f5;
text-align:left}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px;vertical-align:-1px}svg text{font-size:12px;fill:#1d2733}.empty{color:#5b6b7c}
"""


def _n(value: float) -> str:
    return f"{int(value):,d}" if float(value).is_integer() else f"{value:,.2f}"


def _seconds(value: float) -> str:
    return f"{value:,.1f} s"


def _legend(series: Mapping[str, str]) -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{escape(name)}</span>' for name, c in series.items())
    return f'<div class="legend">{items}</div>'


def bar_chart(rows: Sequence[tuple[str, Sequence[float]]], series: Mapping[str, str], fmt: Any = _n) -> str:
    """Grouped horizontal bars: one group per row label, one bar per series, lengths relative to the largest.

    Each bar is a `<rect>` with `data-series` and `data-value`, and a `<title>` for the tooltip.
    """
    names = list(series)
    top = max((v for _label, values in rows for v in values), default=0) or 1
    area = CHART_WIDTH - LABEL_WIDTH - VALUE_WIDTH
    group = BAR_HEIGHT * len(names) + 10
    parts = []
    for i, (label, values) in enumerate(rows):
        y0 = i * group + 4
        parts.append(f'<text x="{LABEL_WIDTH - 8}" y="{y0 + group / 2}" text-anchor="end">{escape(label)}</text>')
        for j, (name, value) in enumerate(zip(names, values, strict=True)):
            y, w = y0 + j * BAR_HEIGHT, area * value / top
            parts.append(
                f'<rect x="{LABEL_WIDTH}" y="{y}" width="{w:.2f}" height="{BAR_HEIGHT - 2}" fill="{series[name]}" '
                f'data-series="{escape(name)}" data-value="{value}"><title>{escape(label)} {escape(name)}: '
                f"{escape(fmt(value))}</title></rect>"
                f'<text x="{LABEL_WIDTH + w + 4:.2f}" y="{y + BAR_HEIGHT - 3}">{escape(fmt(value))}</text>'
            )
    height = len(rows) * group + 8
    return (f'{_legend(series)}<svg role="img" width="{CHART_WIDTH}" height="{height}" '
            f'viewBox="0 0 {CHART_WIDTH} {height}">{"".join(parts)}</svg>')


def stacked_bar(parts: Sequence[tuple[str, float]], colors: Mapping[str, str]) -> str:
    """One horizontal bar split into `parts` (name, seconds), widths proportional to the seconds."""
    total = sum(v for _n, v in parts) or 1
    area = CHART_WIDTH - 20
    x, rects = 0.0, []
    for name, value in parts:
        w = area * value / total
        rects.append(f'<rect x="{x:.2f}" y="4" width="{w:.2f}" height="26" fill="{colors.get(name, "#999")}" '
                     f'data-series="{escape(name)}" data-value="{value}"><title>{escape(name)}: '
                     f"{_seconds(value)}</title></rect>")
        x += w
    legend = {f"{name} {_seconds(value)}": colors.get(name, "#999") for name, value in parts}
    return (f'{_legend(legend)}<svg role="img" width="{CHART_WIDTH}" height="36" viewBox="0 0 {CHART_WIDTH} 36">'
            f'{"".join(rects)}</svg>')


def time_split(report: RunReport) -> list[tuple[str, float]]:
    """(phase, seconds): plan, the stage's scan + winners and rewrite + upload (and its rest), commit."""
    phases, split = report.phase_seconds, report.time_split_seconds
    stage = phases.get("stage", split.map + split.rewrite)
    out = [("plan", phases.get("plan", 0.0)), ("scan + winners", split.map),
           ("rewrite + upload", split.rewrite), ("stage (other)", max(stage - split.map - split.rewrite, 0)),
           ("commit", phases.get("commit", 0.0))]
    return [(name, float(v)) for name, v in out if v > 0]


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool]) -> str:
    th = "".join(f'<th class="n">{escape(h)}</th>' if n else f"<th>{escape(h)}</th>"
                 for h, n in zip(header, numeric, strict=True))
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{escape(str(c))}</td>' if n else f"<td>{escape(str(c))}</td>"
                         for c, n in zip(row, numeric, strict=True)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _cards(report: RunReport) -> str:
    read, written = report.bytes_read, report.bytes_written
    requests = report.requests
    cards = [
        ("partitions compacted", f"{report.committed} of {len(report.planned)}"),
        ("failed", str(len(report.failed))),
        ("bytes before → after", f"{byte_size(read)} → {byte_size(written)}"),
        ("size reduction", f"{100 * (1 - written / read):.1f}%" if read else "–"),
        ("records before → after", f"{report.records_read:,d} → {report.records_written:,d}"),
        ("duration", _seconds(report.duration_seconds)),
        ("max compaction delay", duration(1000 * report.max_compaction_delay_secs)),
        ("max dirty", f"{report.max_dirty_percent}%"),
        ("uncleanable partitions", str(len(report.uncleanable_partitions))),
        ("store requests", f"{requests.gets:,d} GET · {requests.puts:,d} PUT"),
        ("clean segments left unread", f"{report.segments_skipped:,d}"),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for k, v in cards) + "</div>"


def _label(p: PartitionReport | PlannedPartition) -> str:
    return f"{p.topic}-{p.partition}"


def _charts(parts: Sequence[PartitionReport]) -> list[str]:
    if not parts:
        return ['<h2>Partitions</h2><p class="empty">Nothing was compacted in this run.</p>']
    return [
        "<h2>Bytes per partition</h2>",
        bar_chart([(_label(p), (p.bytes_read, p.bytes_written)) for p in parts],
                  {"before": BEFORE, "after": AFTER}, fmt=byte_size),
        "<h2>Records per partition</h2>",
        bar_chart([(_label(p), (p.records_read, p.records_written)) for p in parts],
                  {"before": BEFORE, "after": AFTER}),
    ]


def _tables(report: RunReport) -> list[str]:
    """The compacted partitions, the failed ones, what retention expired, and the plan's view of every partition."""
    body = []
    if report.partitions:
        body += ["<h2>Compacted partitions</h2>", _table(
            ["partition", "dirty section", "bytes before", "bytes after", "records before", "records after",
             "segments in → out", "committed"],
            [(_label(p), "[{}, {})".format(*(p.dirty_section or ("", ""))), _n(p.bytes_read), _n(p.bytes_written),
              _n(p.records_read), _n(p.records_written), f"{p.segments_replaced} → {p.segments_written}",
              f"version {p.metadata_version}" if p.committed else f"no: {p.error}")
             for p in report.partitions],
            [False, False, True, True, True, True, True, False])]
    if report.failed:
        body += ["<h2>Failed partitions</h2>", _table(
            ["partition", "exit code", "error"],
            [(f"{f.topic}-{f.partition}", f.exit_code, f"{f.error_type}: {f.error}") for f in report.failed],
            [False, True, False])]
    expired = [p for p in report.retention.partitions if p.retention.expired] if report.retention else []
    if expired:
        body += ["<h2>Expired by retention (compact,delete)</h2>", _table(
            ["partition", "segments", "bytes", "log start offset now", "metadata version"],
            [(f"{e.retention.topic}-{e.retention.partition}", len(e.retention.expired),
              _n(e.retention.expired_bytes), e.retention.log_start_offset, e.version) for e in expired],
            [False, True, True, True, True])]
    body += ["<h2>Plan</h2>", _table(
        ["partition", "decision", "dirty ratio", "compaction delay", "cleanable", "why"],
        [(_label(p), p.decision, f"{p.dirty_ratio:.2f}", duration(1000 * p.max_compaction_delay_secs),
          byte_size(p.cleanable_bytes), p.reason) for p in report.planned],
        [False, False, True, True, True, False])]
    return body


def render_html(report: RunReport) -> str:
    """The self-contained HTML page of a run report."""
    status = ('<span class="ok">OK</span>' if report.exit_code == 0
              else f'<span class="bad">exit code {report.exit_code}</span>')
    split = time_split(report)
    body = [
        f"<h1>kcompact run {escape(str(report.run_id))}</h1>",
        f'<div class="sub">{status} · clock {escape(timestamp(report.now_ms))} · planned at metadata table '
        f"version {report.metadata_version_planned}</div>",
        _cards(report),
        *_charts(report.partitions),
        "<h2>Where the time went</h2>",
        stacked_bar(split, PHASE_COLORS) if split else '<p class="empty">No time measured.</p>',
        *_tables(report),
    ]
    title = escape(f"kcompact run {report.run_id}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
