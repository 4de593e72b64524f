"""BENCHMARKS.md from the figures `bench_measure` saved: a summary of targets against figures, then a section per
figure with its workload, machine and date, and the notes of scripts/bench_notes.md under its own heading.

Rendering reads only the saved results, so `python scripts/bench.py --only P4` refreshes one section and renders
the others as they were measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

NOTES_FILE = Path(__file__).resolve().parent / "bench_notes.md"


def notes(path: Path = NOTES_FILE) -> dict[str, str]:
    """The blocks of the notes file by their `## ` heading, each as its text between the heading and the next."""
    blocks: dict[str, str] = {}
    name = None
    for line in path.read_text().split("\n"):
        if line.startswith("## "):
            name = line[3:].strip()
            blocks[name] = ""
        elif name is not None:
            blocks[name] += line + "\n"
    return {k: v.strip("\n") for k, v in blocks.items()}


def note(name: str) -> str:
    """One block of the notes file (KeyError naming it if the file has no such heading)."""
    return notes()[name]


def _rows_handled(r: dict[str, Any], label: str) -> float:
    """What bounds a P8 run: the records a rebuild reads (every key once), the table rows an update writes."""
    return float(r["keys"]) if label == "rebuild" else float(r[label]["rows_written"])


def _table_rate(r: dict[str, Any]) -> float:
    return float(r["segment_bytes_read"]) / float(r["seconds"]["total"]) / 1e6


def _p8(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = ["Each shape: `kcompact table` rebuilds the table from a base where every key appears once, then 1% "
             "of the keys are rewritten (new segments, tiered) and a second run updates it. "
             "MB/s = segment bytes the run read / its wall time (plan + Spark + commit, session start-up excluded; "
             "the whole process in brackets; a rebuild and an update are each the median of three fresh processes, "
             "each run's walls below the table); rows/s = records read (rebuild) or table rows written (update) / "
             "wall time. " + note("P8 conditions"), "",
             "| shape | keys | run | segment bytes read | wall s (process) | MB/s | rows/s "
             "| table files written (bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        shape = f"{r['partitions']} partition(s): `{r['workload']}`"
        for label in ("rebuild", "update"):
            x = r[label]
            lines.append(f"| {shape if label == 'rebuild' else ''} | {r['keys']:,} | {label} | "
                         f"{_mb(x['segment_bytes_read'])} | {x['seconds']['total']:.1f} ({x['process_seconds']:.1f}) "
                         f"| {_table_rate(x):.2f} | {_rows_handled(r, label) / x['seconds']['total']:,.0f} "
                         f"| {x['files_added']} ({_mb(x['bytes_written'])}) |")
    lines += [""] + [_p8_update_share(r) for r in runs]
    lines += [""] + [f"- {label} walls, {r['partitions']} partition(s): " + " / ".join(
        f"{w:.1f} ({pw:.1f})" for w, pw in zip(r[label]["walls"], r[label]["process_walls"], strict=True))
        + " s" for label in ("rebuild", "update") for r in runs if "walls" in r[label]]
    lines += [f"- rebuild in a warm session (the first Python task's start already paid), {r['partitions']} "
              f"partition(s): {r['warm']['rebuild_seconds']:.1f} s = "
              f"{r['rebuild']['segment_bytes_read'] / r['warm']['rebuild_seconds'] / 1e6:.2f} MB/s"
              for r in runs if "warm" in r]
    lines += ["", "The input path alone against the compaction's scan of the same segments (goal 28 b: within 2×), "
              "over about 1/8 of each base (partition 0 of 8; the last eighth of the one partition), each in a fresh "
              "process (session start not counted): the first job, then the same job three times (median). "
              "`read_partition(..., isolation='read_committed').count()` (`compaction.spark.read`: the executors "
              "decode each segment columnar with the scan's numba kernels and hand every record, value and headers "
              "included, to Spark as Arrow; the driver walks the segments' batch headers for open transactions) "
              "against the compaction's scan (`compaction.spark.scan.scan_rows`: decoded, each task's best record per "
              "key handed to Spark, counted; its plan made before the clock):", "",
              "| shape | bytes | read: first | read: again | scan: first | scan: again | read ÷ scan: first / again |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        rp = r["read_partition"]
        if "read" not in rp:
            continue
        read, scan = _input_figures(rp["read"]), _input_figures(rp["scan"])
        lines.append(f"| {r['partitions']} partition(s) | {_mb(rp['bytes'])} | "
                     + " | ".join(f"{s:.2f} s = {rp['bytes'] / s / 1e6:.0f} MB/s" for s in (*read, *scan))
                     + f" | {read[0] / scan[0]:.2f}× / {read[1] / scan[1]:.2f}× |")
    lines += ["", note("P8 update"),
              "", "The rebuilds handle " + " and ".join(
                  f"{_rows_handled(r, 'rebuild') / r['rebuild']['seconds']['total']:,.0f} rows/s "
                  f"({r['partitions']} partition(s))" for r in runs) + ".", "", note("P8 analysis")]
    return lines


def _input_figures(x: dict[str, Any]) -> tuple[float, float]:
    """A fresh session's first job and the median of the same job again (`bench_run.input_path_seconds`)."""
    again = sorted(x["again"])
    return float(x["first"]), float(again[len(again) // 2])


def _p8_update_share(r: dict[str, Any]) -> str:
    """Goal 28a's two ratios: what the update wrote (data files and deletion vectors) of the table the rebuild
    wrote, and its wall time against the rebuild's median."""
    update, rebuild = r["update"], r["rebuild"]
    written = update["bytes_written"] + update.get("vector_bytes", 0)
    return (f"- update, {r['partitions']} partition(s): wrote {_mb(written)} ({_mb(update['bytes_written'])} of data "
            f"files, {update.get('vector_bytes', 0):,} bytes of deletion vectors marking "
            f"{update.get('rows_marked', 0):,} rows in {update.get('files_marked', 0)} files; "
            f"{update['files_removed']} files rewritten) = {100 * written / rebuild['bytes_written']:.2f}% of the "
            f"table's {_mb(rebuild['bytes_written'])}; wall {update['seconds']['total']:.1f} s = "
            f"{100 * update['seconds']['total'] / rebuild['seconds']['total']:.1f}% of the rebuild's "
            f"{rebuild['seconds']['total']:.1f} s" + (
                f"; in a warm session (Python workers started, kernels loaded, as a notebook's or a long-lived "
                f"job's): update {r['warm']['update_seconds']:.1f} s{_warm_walls(r['warm'])}, "
                f"rebuild {r['warm']['rebuild_seconds']:.1f} s "
                f"({100 * r['warm']['update_seconds'] / r['warm']['rebuild_seconds']:.1f}%)" if "warm" in r else ""))


def _warm_walls(warm: dict[str, Any]) -> str:
    walls = warm.get("update_walls")
    return f" (median of {len(walls)} in the order run: {' / '.join(f'{w:.1f}' for w in walls)} s)" if walls else ""


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _p1(r: dict[str, Any]) -> list[str]:
    return [
        f"Workload: `kcompact generate {r['workload']}` — {r['files']} uncompressed segments, "
        f"{_gib(r['bytes'])}, {int(r['records']):,} records (~100-byte values). Best of 3.",
        "",
        "| measurement | MB/s | records/s |",
        "|---|---|---|",
        f"| raw read + CRC-32C of the same bytes | {r['raw_mb_s']:,.0f} | — |",
        f"| columnar scan (numba) → Arrow | {r['scan_mb_s']:,.0f} | {r['scan_records_s']:,.0f} |",
        "",
        f"Scan / reference: **{100 * r['ratio']:.0f}%** (target ≥ 40%).",
    ]


def _walls(r: dict[str, Any]) -> str:
    walls = r.get("run_walls")
    return f"walls of its runs {' / '.join(f'{w:.1f}' for w in walls)} s; median run: " if walls else ""


def _split(r: dict[str, Any]) -> str:
    ph, t = r["phases"], r["task_seconds"]
    return (f"{_walls(r)}plan {ph['plan']:.1f} s · map (scan + winners) {r['map_seconds']:.1f} s · rewrite + upload "
            f"{r['rewrite_seconds']:.1f} s · commit {ph['commit']:.2f} s (session start-up {ph['session']:.1f} s, "
            f"not counted; whole process {r['process_seconds']:.1f} s) — executor task time: scan {t['scan']:.1f} s, "
            f"download {t['download']:.1f} s, rewrite {t['rewrite']:.1f} s, upload {t['upload']:.1f} s; "
            f"rewrite tasks {sum(p['rewrite_tasks'] for p in r['per_partition'])} for {r['partitions']} partitions")


def _cli(r: dict[str, Any]) -> tuple[str, str]:
    """The fresh `kcompact compact` processes' MB/s, median (first), and the median's share of raw read + CRC-32C."""
    c = r.get("cli")
    if not c:
        return "not measured", "—"
    return (f"**{c['mb_s']:.1f}** ({c['first_mb_s']:.1f})", f"**{100 * c['mb_s'] / r['raw_mb_s']:.1f}%**")


def _rate_table(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = ["| run | input (tiered) | records in → out | output | fresh `kcompact compact`: MB/s median (first) "
             "| its share of raw | in session: wall | MB/s | share of raw | raw read + CRC (1 core) | fetch ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in runs:
        cli_rate, cli_share = _cli(r)
        lines.append(f"| {label} | {_gib(r['bytes_read'])} | {r['records_read']:,} → {r['records_written']:,} | "
                     f"{_mb(r['bytes_written'])} | {cli_rate} | {cli_share} | {r['wall_seconds']:.1f} s | "
                     f"{r['mb_s']:.1f} | {100 * r['raw_share']:.1f}% | {r['raw_mb_s']:,.0f} MB/s | "
                     f"{_ratio(r.get('fetch_ratio'))} |")
    lines += ["", "Fresh `kcompact compact` processes: " + "; ".join(
        f"{label} {' / '.join(f'{x:.1f}' for x in r['cli']['seconds'])} s (in the order run)"
        for label, r in runs if r.get("cli"))] if any(r.get("cli") for _l, r in runs) else []
    return lines


def _time_limit(r: dict[str, Any], fixed: float | None) -> str:
    """Where a run's wall time (session start-up excluded) went: what limits its MB/s."""
    ph, t = r["phases"], r["task_seconds"]
    parts = {"plan": ph["plan"], "map (scan + winners)": r["map_seconds"], "rewrite + upload": r["rewrite_seconds"],
             "commit": ph["commit"]}
    top = max(parts, key=lambda k: parts[k])
    line = (f"{top} is {parts[top]:.1f} s of the {r['wall_seconds']:.1f} s; executor task time scan {t['scan']:.1f} s, "
            f"rewrite {t['rewrite']:.1f} s, upload {t['upload']:.1f} s, download {t['download']:.1f} s on 2 cores")
    if fixed is not None:
        line += f"; P5's fixed cost per run (a = {fixed:.1f} s) is {100 * fixed / r['wall_seconds']:.0f}% of it"
    return line + "."


def _fixed_cost(saved: dict[str, Any]) -> float | None:
    return fit(saved["P5"]["points"])[0] if "P5" in saved else None


WHOLE_PROCESS = ("The headline is what users run: `kcompact compact --store S --config C` as a fresh process "
                 "(interpreter, JVM, Python workers, kernels loaded, the run, exit), on a fresh hard-linked copy of "
                 "the store each time, page cache warm; three processes, their median MB/s with the first process's "
                 "in brackets (it is the first run of the workload in this `make bench`). ")


def _p2(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = [f"Workload: `kcompact generate --bulk {runs[0]['workload'].replace(' --codecs none', ' --codecs C')}`, "
             "tiered into a local store. " + WHOLE_PROCESS + "In session beside it: "
             "one run of `plan → stage → commit` in local[2] (`scripts/bench_run.py`, "
             "config: cleanup.policy compact, min.cleanable.dirty.ratio 0.01, nothing else); MB/s = segment bytes "
             "read by the run / its wall time (plan + stage + commit). Session start-up (JVM, Python workers, numba "
             "kernels loaded in them) is measured apart, as a long-lived executor has paid it already; the whole "
             "process figure counts it (interpreter, JVM, workers, a one-task-per-core warm-up job, the run). The "
             "raw reference reads the same .log files and computes their CRC-32C on one core, page cache warm, "
             "in the same `make bench` run. Each figure is the median of three runs (each a fresh process on a fresh "
             "copy of the store; every run's wall time below). A first compaction runs scan, winners and rewrite as "
             "one Spark job of two stages; its map / rewrite split is taken at the end of the last scan task.", ""]
    lines += _rate_table([(r["codec"], r) for r in runs])
    lines += ["", *[f"- {r['codec']}: {_split(r)}" for r in runs], "",
              "Target ≥ 100 MB/s and ≥ 6% of raw read + CRC-32C (goal c; Kafka's cleaner: 16.5 MB/s)."]
    missed = [r for r in runs if r["mb_s"] < 100 or r["raw_share"] < 0.06]
    lines += [f"- **What limits {r['codec']}**: {_time_limit(r, _fixed_cost(saved))}" for r in missed]
    lines.append(note("P2 analysis"))
    lines += ["", "Where the map phase goes (the same segments, each step a Spark job of its own, warm; "
              "`bench_run.py --profile-map`):", "",
              "| codec | segments | rows to the JVM (each scan task's best per partition and key) | distinct keys "
              "| scan + hand-over | + hash aggregate & shuffle | + persist (step-by-step path) "
              "| scan task time (summed) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.get("map_profile")
        if p:
            lines.append(f"| {r['codec']} | {p['segments']} | {p['rows_to_jvm']:,} | {p['keys']:,} | "
                         f"{p['scan']:.1f} s | {p['aggregate']:.1f} s | {p['persist']:.1f} s | "
                         f"{p['task_scan']:.1f} s |")
    return lines


def _p2k(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    lines = [f"Workload: `{r['command']}` — every batch built by kafka-python's `DefaultRecordBatchBuilder` "
             f"(an independent Kafka codec: its own varints and CRC-32C), uncompressed, laid out as a broker's log "
             f"dir; generated in {r['generation_seconds']:.0f} s (kafka-python directly, no replication of sampled "
             f"batches needed), {_gib(r['input_bytes'])} of rolled segments. `kcompact tier` rebuilt "
             f"{r.get('rebuilt_indexes')} offset/time indexes (the writer leaves them out, as Kafka rebuilds them on "
             "load); the writer puts an empty producer snapshot at every roll, as a broker does (without one, "
             "planning replays the whole tier to find the producer state). Runs with only cleanup.policy "
             "compact set (every other option at its default), as a new user would; the median of three. "
             + WHOLE_PROCESS, ""]
    lines += _rate_table([("kafka-python, 2 partitions", r)])
    lines += ["", f"- {_split(r)}", "", "Target ≥ 80 MB/s and ≥ 5% of raw read + CRC-32C in session (goal c); "
              "≥ 3.5% of raw as fresh `kcompact compact` processes (issue 27 c)."]
    if r["mb_s"] < 80 or r["raw_share"] < 0.05:
        lines.append(f"- **What limits it**: {_time_limit(r, _fixed_cost(saved))}")
    return lines


def _p3(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = ["Workload: `kcompact generate --bulk` with `--key-order sequential` (every key once, then 50% more "
             "updates), 16-byte values, 8 partitions, e.g. `" + runs[-1]["workload"] + "`. One run each, "
             "peak resident memory sampled every 0.2 s from /proc (the JVM is driver and executor in local mode; "
             "`spark.driver.memory` 6g).",
             "",
             "| distinct keys in the run | records read → written | wall | Python driver peak | JVM peak | "
             "Python workers peak (sum) |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        m = r["memory_peak_bytes"]
        lines.append(f"| {r['dirty_keys']:,} | {r['records_read']:,} → {r['records_written']:,} | "
                     f"{r['wall_seconds']:.0f} s | {_mb(m['driver_python'])} | {_mb(m['jvm'])} | "
                     f"{_mb(m['python_workers'])} |")
    lines += ["", "Target: 50 M keys in one run, driver memory not growing with the key count. The Python driver holds "
              "plans and per-partition results only. In local mode the JVM is also the executor: its growth is the "
              "executor's (the per-key rows, cached for the rewrite, and the shuffle), within its fixed heap "
              "(`spark.driver.memory`); on a cluster that part is spread over executors."]
    return lines


def _p4(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    s = r["second"]
    clean = r["clean_bytes"]
    share = r["read_bytes"] / clean
    other = max(0, r["fetched_bytes"] - r["dirty_bytes"] - r["read_bytes"])
    lines = [
        f"Workload: `kcompact generate --bulk {r['workload']}`: {r['keys']:,} keys, each once, compacted (round 1); "
        "then 1% of them updated (a contiguous range of ids per partition), tiered, and round 2 runs. Both rounds "
        "with the topic's own settings only (`segment.bytes`, `min.cleanable.dirty.ratio` 0.01 then 0.001): "
        f"**no bloom.filter.fpp**, so filters are sized from the data (round 1 wrote them at "
        f"{'n/a' if r['fpp'] is None else format(r['fpp'], '.2g')}).",
        "",
        "| round 2 | bytes | share of the clean region |",
        "|---|---|---|",
        f"| clean region: {r['clean_segments']} segments | {_mb(clean)} | 100% |",
        f"| dirty segments (the updates) | {_mb(r['dirty_bytes'])} | {100 * r['dirty_bytes'] / clean:.2f}% |",
        f"| clean segments that really hold an updated key (overlap) | {_mb(r['overlap_bytes'])} | "
        f"{100 * r['overlap_bytes'] / clean:.2f}% |",
        f"| **bound**: dirty + overlap + 2% of the clean region | {_mb(r['bound_bytes'])} | "
        f"{100 * r['bound_bytes'] / clean:.2f}% |",
        f"| **fetched by round 2** (all requests; fetch ratio {_ratio(s.get('fetch_ratio'))}) | "
        f"{_mb(r['fetched_bytes'])} | **{100 * r['fetched_bytes'] / clean:.2f}%** |",
        f"| of which clean segments rewritten + filters | {_mb(r['read_bytes'])} | {100 * share:.2f}% |",
        f"| of which filters | {_mb(s['filter_bytes_read'])} | {100 * s['filter_bytes_read'] / clean:.2f}% |",
        f"| not downloaded ({s['segments_skipped']} segments kept unread) | {_mb(s['bytes_not_downloaded'])} | "
        f"{100 * s['bytes_not_downloaded'] / clean:.2f}% |",
        "",
        f"Fetched {_mb(r['fetched_bytes'])} vs bound {_mb(r['bound_bytes'])} (target: fetched ≤ bound, goal b). "
        f"Segments read although they hold no updated key: {s.get('false_positive_segments', '?')} filter false "
        f"positive(s), {s.get('segments_merged', '?')} small segment(s) merged into a rewritten neighbour. Round 2 "
        f"took {s['phases']['stage']:.1f} s to stage (round 1: {r['first']['phases']['stage']:.1f} s).",
    ]
    if r["fetched_bytes"] > r["bound_bytes"]:
        lines += ["", f"- **What limits it**: round 2 fetched {_mb(r['dirty_bytes'])} of dirty segments, "
                  f"{_mb(s['clean_bytes_rewritten'])} of clean segments rewritten ({_mb(r['overlap_bytes'])} of them "
                  f"hold an updated key), {_mb(s['filter_bytes_read'])} of filters and {_mb(other)} besides "
                  "(companions, re-fetches): the excess over the bound is the clean segments read without an updated "
                  "key plus whatever was fetched twice."]
    lines += ["", "Secondary: filter rate sweep on the same clean segments (filters rebuilt in process at each rate; "
              "share of the cleaned region read = segments testing positive + all filters; the first row is the rate "
              "the defaults chose):", "",
              "| bloom.filter.fpp | clustered 1%: read (overlap) | filters alone | random 1%: read (overlap) |",
              "|---|---|---|---|"]
    for row in r["sweep"]:
        c, rnd = row["clustered"], row["random"]
        lines.append(f"| {row['fpp']:.2g} | {100 * c['read']:.1f}% ({100 * c['overlap']:.1f}%) | "
                     f"{100 * c['filters']:.2f}% | {100 * rnd['read']:.1f}% ({100 * rnd['overlap']:.1f}%) |")
    lines += ["", "With keys spread at random, 1% of them touch almost every segment: no filter can help there.", "",
              note("P4 filter implementation")]
    return lines


def _p5(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    points = sorted(r["points"], key=lambda p: p["scale"])
    base, top = points[0], points[-1]
    a, b = fit(points)  # a: what a run costs whatever its size (Spark jobs, commits); b: per MB
    xs = [p["bytes_read"] / 1e6 for p in points]
    lines = ["The P2 uncompressed workload at 1/16, 1/4 and 1 of its size (records, keys and segment.bytes "
             "scaled together, 8 partitions each; the 16× point is P2's run; each point the median of three runs).",
             "", "| input | wall | MB/s | time ratio vs 1× | input ratio | fit a + b·MB | vs fit | fetch ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for p, x in zip(points, xs, strict=True):
        predicted = a + b * x
        lines.append(f"| {_mb(p['bytes_read'])} ({16 * p['scale'] / top['scale']:g}×) | {p['wall_seconds']:.1f} s | "
                     f"{p['mb_s']:.1f} | {p['wall_seconds'] / base['wall_seconds']:.2f} | "
                     f"{p['bytes_read'] / base['bytes_read']:.2f} | {predicted:.1f} s | "
                     f"{100 * (p['wall_seconds'] / predicted - 1):+.0f}% | {_ratio(p.get('fetch_ratio'))} |")
    lines += ["", f"Fit: **a = {a:.1f} s per run** whatever its size (target ≤ 4 s, goal e), b = {1000 * b:.1f} ms "
              f"per MB ({1 / b:.0f} MB/s marginal). The per-byte part is linear when every point is within 15% of "
              "the fit."]
    small = base
    lines.append(f"- **{'What limits a' if a > 4 else 'The 1× run'}**: {_mb(small['bytes_read'])} in "
                 f"{small['wall_seconds']:.1f} s: plan {small['phases']['plan']:.1f} s, map "
                 f"{small['map_seconds']:.1f} s, rewrite + upload {small['rewrite_seconds']:.1f} s, commit "
                 f"{small['phases']['commit']:.1f} s for {small['partitions']} partitions (Spark jobs and stages "
                 "with Python tasks, per-partition fencing and commits).")
    lines.append(note("P5 analysis"))
    return lines


def _p6(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    hot, spread = r["hot"], r["spread"]
    ratio = hot["mb_s"] / spread["mb_s"]
    tasks = hot["per_partition"][0]
    lines = [f"Workload: `{hot['command']}` (one partition) vs `{spread['command']}` (the same records and keys "
             "over 8 partitions: P2's uncompressed run), each compacted at the defaults but "
             "min.cleanable.dirty.ratio 0.01.", ""]
    lines += _rate_table([("1 hot partition", hot), ("8 partitions", spread)])
    lines += ["", f"- 1 partition: {_split(hot)}", f"- 8 partitions: {_split(spread)}", "",
              f"Hot / spread = **{100 * ratio:.0f}%** (target ≥ 80%, goal d); the hot partition's report: "
              f"rewrite_tasks {tasks['rewrite_tasks']}, chunks {tasks['chunks']}, segments_scanned "
              f"{tasks['segments_scanned']}, cache_hits {tasks['cache_hits']}."]
    lines.append(note("P6 analysis"))
    if ratio < 0.8:
        lines.append(f"- **What limits it**: map {hot['map_seconds']:.1f} s vs {spread['map_seconds']:.1f} s, rewrite "
                     f"+ upload {hot['rewrite_seconds']:.1f} s vs {spread['rewrite_seconds']:.1f} s (rewrite task "
                     f"time {hot['task_seconds']['rewrite']:.1f} s vs {spread['task_seconds']['rewrite']:.1f} s over "
                     f"{tasks['rewrite_tasks']} vs {sum(p['rewrite_tasks'] for p in spread['per_partition'])} tasks).")
    return lines


def _p7(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    lines = ["<!-- goal f hook: scripts/bench_measure.py `bench_verify` measures this once "
             "`compaction.verify.verify_partition` accepts `spark=` -->",
             f"Workload: `{r['command']}` ({r['keys']:,} keys in one partition; the goal's scale is 50 M)."]
    if not r["measured"]:
        return [*lines, "", "**Not measured yet**: `compaction.verify.verify_partition` does not take `spark=` in this "
                "version (verify holds one partition's keys on the driver). `make bench BENCH_ARGS=\"--only P7\"` "
                "measures it once it does: verify on the session, driver peak RSS sampled from /proc every 0.2 s."]
    m = r["memory_peak_bytes"]
    return [*lines, "", "| keys | verify wall | verdict | Python driver peak | JVM peak | Python workers peak |",
            "|---|---|---|---|---|---|",
            f"| {r['keys']:,} | {r['verify_seconds']:.1f} s | {'ok' if r['verify_ok'] else 'PROBLEMS'} | "
            f"{_mb(m['driver_python'])} | {_mb(m['jvm'])} | {_mb(m['python_workers'])} |", "",
            "Target: a flat driver (the Python driver's peak not growing with the keys), output and exit codes kept.",
            "", note("P7 analysis")]


def _runs(saved: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every compaction run of the saved figures, labelled by shape."""
    out: list[tuple[str, dict[str, Any]]] = []
    for r in saved.get("P2", []):
        out.append((f"P2 {r['codec']}", r))
    if "P2K" in saved:
        out.append(("P2K kafka-python, 2 × 64 MiB segments", saved["P2K"]))
    for r in saved.get("P3", []):
        out.append((f"P3 {r['keys']:,} keys", r))
    if "P4" in saved:
        out += [("P4 round 1", saved["P4"]["first"]), ("P4 round 2 (1% updated)", saved["P4"]["second"])]
    for p in saved.get("P5", {}).get("points", [])[:-1]:
        out.append((f"P5 {_mb(p['bytes_read'])}", p))
    if "P6" in saved:
        out.append(("P6 one hot partition", saved["P6"]["hot"]))
    return out


def _fetch(saved: dict[str, Any]) -> list[str]:
    lines = ["The run report's `fetch_ratio`: bytes fetched from the store (every request) / bytes of the segments "
             "and filters the run had to read; 1.00 = every byte fetched once. Target ≤ 1.05 on every shape "
             "(goal a). Workloads and dates: the sections below.", "",
             "| run | fetched | needed | GETs | fetch ratio | worst partition | segments scanned / cache hits |",
             "|---|---|---|---|---|---|---|"]
    worse = []
    for label, r in _runs(saved):
        parts = r.get("per_partition", [])
        worst = max(parts, key=lambda p: p.get("fetch_ratio") or 0, default=None)
        lines.append(f"| {label} | {_mb(r['requests']['bytes_read'])} | {_mb(r.get('needed_bytes', 0))} | "
                     f"{r['requests']['gets']:,} | **{_ratio(r.get('fetch_ratio'))}** | "
                     f"{worst['tp'] + ' ' + _ratio(worst.get('fetch_ratio')) if worst else '—'} | "
                     f"{sum(p['segments_scanned'] for p in parts)} / {sum(p['cache_hits'] for p in parts)} |")
        if (r.get("fetch_ratio") or 0) > 1.05:
            worse.append(label)
    if worse:
        lines += ["", f"- **What limits it** ({', '.join(worse)}): the bytes fetched beyond those needed are "
                  "re-fetches (a segment scanned, then fetched again by the rewrite: cache hits below the segments "
                  "scanned) and the companions a rewrite copies; the columns above say which."]
    return lines


def _p0(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = ["A small scheduled run: ~10 MB of segments, all dirty, compacted by fresh `kcompact compact` processes "
             "(config: cleanup.policy compact, min.cleanable.dirty.ratio 0.01), alternated with Spark's own start: "
             f"`python -c \"{SPARK_ALONE}\"` (a session in local[2], one trivial job, stop), and with the driver "
             "JVM's class-data-sharing archive turned off (`KCOMPACT_CDS=0`; `make venv`'s `make cds` writes the "
             "archive, compaction/spark/cds.py). Three of each, page cache warm. Target: the run within Spark's own "
             "start + 3 s (issue 27 b).", "",
             "| workload | input | `kcompact compact` (each process) | without the archive | Spark alone (each) "
             "| medians: excess over Spark | without the archive |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| `{r['workload']}` | {_mb(r['bytes_read'])} | "
                     f"{' / '.join(f'{x:.1f}' for x in r['seconds'])} s | "
                     f"{' / '.join(f'{x:.1f}' for x in r['no_cds_seconds'])} s | "
                     f"{' / '.join(f'{x:.1f}' for x in r['spark_seconds'])} s | "
                     f"**{r['median_seconds'] - r['spark_median_seconds']:+.1f} s** | "
                     f"{r['no_cds_median_seconds'] - r['spark_median_seconds']:+.1f} s |")
    lines.append(note("P0 analysis"))
    return lines


def _p0c(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    lines = ["A new user's first run: a clone of the checkout's HEAD (committed code) into an empty directory, the "
             "documented setup in it (`make venv java cds`, with the class archive in a directory of its own and no "
             "NUMBA_CACHE_DIR or PYTHONPATH, as in a user's shell), then three fresh `kcompact compact` processes "
             "on fresh copies of a tiered ~10 MB store (P0's shapes, config: cleanup.policy compact, "
             "min.cleanable.dirty.ratio 0.01). One clone per shape, so each shape's first process is the clone's "
             "first run. Target: the first within 1.15× of the second (issue 27 a).", "",
             "| workload | commit | setup (`make venv java cds`) | processes: first / second / third | first ÷ second "
             "| load (1/5/15 min) |", "|---|---|---|---|---|---|"]
    for c in r["clones"]:
        lines.append(f"| `{c['workload']}` | {c['commit']} | {c['setup_seconds']:.0f} s | "
                     f"{' / '.join(f'{x:.1f}' for x in c['seconds'])} s | **{c['first_over_second']:.2f}×** | "
                     f"{' / '.join(f'{x:.1f}' for x in c['load'])} |")
    lines += ["", "The kernels' speed with the code `make venv` compiled for this CPU and with the generic CPU's (what "
              "an executor on another CPU of the architecture loads): the segment scan (`compaction.format.scan`) "
              "over every rolled segment of the workload, one core, page cache warm, best of three scans in each of "
              "two fresh processes per CPU, alternated, with `KCOMPACT_PREBUILT_KERNELS_ONLY=1` (nothing compiles).",
              "", "| workload | segments | host CPU | generic CPU | generic ÷ host |", "|---|---|---|---|---|"]
    for k in r["kernels"]:
        lines.append(f"| `{k['workload']}` | {_mb(k['bytes'])} | {k['host_mb_s']:.0f} MB/s | "
                     f"{k['generic_mb_s']:.0f} MB/s | {k['generic_mb_s'] / k['host_mb_s']:.2f} |")
    return lines


P9_PARTS = (("read_local", "consumer, local log (before tiering)"), ("tiering", "tiering through the plugin"),
            ("read", "consumer, the tier"), ("read_compacted", "consumer, the compacted tier"))


def _p9_runs(r: dict[str, Any], shape: int, manager: str) -> list[dict[str, Any]]:
    return [x for x in r["runs"] if x["shape"] == shape and x["manager"] == manager]


def _p9_rates(got: list[dict[str, Any]]) -> str:
    rates = sorted(g["mb_s"] for g in got)
    each = " / ".join(f"{g['mb_s']:.1f}" for g in got)
    return f"**{rates[len(rates) // 2]:.1f}** ({each})"


def _p9_cell(runs: list[dict[str, Any]], part: str) -> str:
    """The median MB/s in bold, then every run's (in the order run), the bytes and the median seconds; for a read,
    Kafka's Java consumer's figures after the Python one's."""
    got = [x[part] for x in runs if part in x]
    if not got:
        return "—"
    size = got[0]["bytes"] if part == "tiering" else got[0]["tier_bytes"]
    seconds = sorted(g["seconds"] for g in got)[len(got) // 2]
    java = [x[part + "_java"] for x in runs if part + "_java" in x]
    return (f"{_p9_rates(got)}; {_mb(size)} in {seconds:.1f} s"
            + (f"<br>Java: {_p9_rates(java)}" if java else ""))


def _p9_shape(r: dict[str, Any], s: int) -> str:
    shape, runs = r["shapes"][s], _p9_runs(r, s, "kcompact")
    produced = runs[0]["produced"] if runs else _p9_runs(r, s, "stock")[0]["produced"]
    return (f"{produced['records']:,} records, {shape['key_bytes']}-byte keys and {shape['value_bytes']:,}-byte values "
            f"over {shape['keys']:,} keys ({_mb(produced['payload_bytes'])} of keys and values)")


def _p9_loads(r: dict[str, Any]) -> str:
    loads = [x for run in r["runs"] for part, value in run.items()
             if isinstance(value, dict) and "load" in value for x in value["load"]]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def _p9(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    runs = len(_p9_runs(r, 0, "kcompact"))
    lines = [note("P9 conditions").format(volume=_mb(r["volume_bytes"]), segment=r["segment_bytes"] // 2**20,
                                          runs=runs, loads=_p9_loads(r), stock=r["stock_rlmm"]), "",
             "| shape | metadata manager | " + " | ".join(label for _p, label in P9_PARTS)
             + " | `kcompact compact` process |", "|---|---|---|---|---|---|---|"]
    for s in range(len(r["shapes"])):
        for manager in ("kcompact", "stock"):
            mine = _p9_runs(r, s, manager)
            compaction = sorted(x["compaction"]["seconds"] for x in mine if "compaction" in x)
            lines.append(f"| {_p9_shape(r, s) if manager == 'kcompact' else ''} | {manager} | "
                         + " | ".join(_p9_cell(mine, part) for part, _label in P9_PARTS)
                         + f" | {f'{compaction[len(compaction) // 2]:.0f} s' if compaction else '—'} |")
    lines += ["", "Compacted reads (first run of each shape): " + "; ".join(
        f"shape {s + 1}: {x['read_compacted']['records']:,} records read of {x['read']['records']:,} produced, "
        f"{_count(x['read_compacted'].get('listed_records'))} in the live segments' rows, "
        f"{x['read_compacted']['segments']} segment(s) in place of {x['read']['segments']}"
        for s in range(len(r["shapes"])) for x in _p9_runs(r, s, "kcompact")[:1]) + ".",
              "", "Waits before the first copy (after `remote.storage.enable` was switched on), seconds per run: "
              + "; ".join(f"shape {s + 1} {m} " + " / ".join(f"{x['tiering']['before_first_copy_seconds']:.1f}"
                                                            for x in _p9_runs(r, s, m))
                          for s in range(len(r["shapes"])) for m in ("kcompact", "stock")) + ".",
              "", _p9_tails(r), "", note("P9 analysis")]
    return lines


def _count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _p9_tails(r: dict[str, Any]) -> str:
    """How long after its last record a Python read got the end-of-partition event (not in its seconds)."""
    tails = sorted(x[p]["eof_seconds"] - x[p]["seconds"] for x in r["runs"] for p in ("read_local", "read",
                   "read_compacted") if p in x and "eof_seconds" in x[p])
    if not tails:
        return "The Python reads' time ran to the end-of-partition event (measured before it was kept apart)."
    return (f"The Python reads' end-of-partition event came {tails[len(tails) // 2]:.2f} s after the last record "
            f"(median; {tails[0]:.2f}-{tails[-1]:.2f} s over {len(tails)} reads), not counted in their time.")


def _p9_rows(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """Issue 29 item 4's row: both managers measured, the tiering and tier-read medians of the first shape."""
    if "P9" not in r:
        return []
    m = {x["manager"]: x for x in r["P9"]["medians"] if x["shape"] == 0}
    value = ", ".join(f"{k}: tiering {m[k]['tiering']['mb_s']:.0f} MB/s, tier read {m[k]['read']['mb_s']:.0f} MB/s"
                      for k in ("kcompact", "stock") if m.get(k, {}).get("tiering"))
    return [("P9 broker tiering and tier reads (shape 1)", "beside Kafka's stock metadata manager", value,
             all(m.get(k, {}).get("read") for k in ("kcompact", "stock")))]


def _p9s_runs(r: dict[str, Any], shape: int, variant: str) -> list[dict[str, Any]]:
    return [x for x in r["runs"] if x["shape"] == shape and x["variant"] == variant]


def _p9s_each(runs: list[dict[str, Any]], value: Callable[[dict[str, Any]], float], fmt: str) -> str:
    """The median of `value` over `runs` in bold, then every run's in the order run."""
    got = [value(x) for x in runs]
    return f"**{format(median(got), fmt)}** ({' / '.join(format(g, fmt) for g in got)})"


def _p9s(r: dict[str, Any], _saved: dict[str, Any]) -> list[str]:
    runs = len(_p9s_runs(r, 0, "cache"))
    loads = [x for run in r["runs"] for v in run.values() if isinstance(v, dict) and "load" in v for x in v["load"]]
    lines = [note("P9S conditions").format(volume=_mb(r["volume_bytes"]), segment=r["segment_bytes"] // 2**20,
                                           runs=runs, loads=f"{min(loads):.1f}-{max(loads):.1f}"), "",
             "| shape | plugin reads | Java consumer, local log (MB/s) | Java consumer, the tier (MB/s) "
             "| tier ÷ local | fetched from the store ÷ served | GETs | broker read ÷ served "
             "| Kafka's remote read per fetch, mean / median | cache at its fullest |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in range(len(r["shapes"])):
        for variant in r["variants"]:
            mine = _p9s_runs(r, s, variant)
            if not mine:
                continue
            size = mine[0]["read_java"]["tier_bytes"]
            lines.append(
                f"| {_p9_shape_s3(r, s) if variant == 'cache' else ''} | {variant} | "
                f"{_p9s_each(mine, lambda x: x['read_local_java']['mb_s'], '.1f')} | "
                f"{_p9s_each(mine, lambda x: x['read_java']['mb_s'], '.1f')} | "
                f"{_p9s_each(mine, lambda x: x['tier_over_local'], '.2f')} | "
                f"{_p9s_each(mine, lambda x: x['fetched_over_served'], '.3f')}; {_mb(size)} served | "
                f"{median(x['counters']['store-gets-total'] for x in mine):.0f} | "
                f"{median(x['counters']['fetch-bytes'] / size for x in mine):.2f} | "
                f"{_reader_ms(mine)} | {_mb(max(x['counters']['chunk-cache-peak-bytes'] for x in mine))} |")
    lines += ["", "Tiering into moto (from the first \"Copying\" to the last \"Copied\"), MB/s per run: " + "; ".join(
        f"shape {s + 1} {v} " + " / ".join(f"{x['tiering']['mb_s']:.1f}" for x in _p9s_runs(r, s, v))
        for s in range(len(r["shapes"])) for v in r["variants"]) + ".", "", note("P9S analysis")]
    return lines


def _reader_ms(runs: list[dict[str, Any]]) -> str:
    """Kafka's RemoteLogReaderFetchRateAndTimeMs over the tier read, medians of the runs' mean and median."""
    got = [x["counters"] for x in runs if "reader-ms-mean" in x["counters"]]
    if not got:
        return "—"
    return f"{median(c['reader-ms-mean'] for c in got):.1f} / {median(c['reader-ms-median'] for c in got):.1f} ms"


def _p9_shape_s3(r: dict[str, Any], s: int) -> str:
    shape, produced = r["shapes"][s], _p9s_runs(r, s, "cache")[0]["produced"]
    return (f"{produced['records']:,} records, {shape['key_bytes']}-byte keys and {shape['value_bytes']:,}-byte values "
            f"({_mb(produced['payload_bytes'])})")


def _p9s_rows(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """Issue 40 item 4's rows: with the chunk cache, the bytes fetched per byte served and the tier's rate against
    the local log's, medians per shape."""
    if "P9S" not in r:
        return []
    cached = [x for x in r["P9S"]["medians"] if x["variant"] == "cache"]
    ratios = " / ".join(f"{x['fetched_over_served']:.3f}" for x in cached)
    shares = " / ".join(f"{100 * x['tier_over_local']:.0f}%" for x in cached)
    return [("P9 on S3: bytes fetched ÷ served, sequential Java consumer (both shapes)", "≤ 1.2", ratios,
             all(x["fetched_over_served"] <= 1.2 for x in cached)),
            ("P9 on S3: tier read ÷ local-log read, Java consumer (both shapes)", "≥ 50%", shares,
             all(x["tier_over_local"] >= 0.5 for x in cached))]


def _p8_rows(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """Issue 28's rows: what an update writes and its wall against a rebuild's, the rebuild's rate. Met or not by the
    fresh process's figure (the headline); the warm session's beside it."""
    if "P8" not in r:
        return []
    runs = r["P8"]
    written = [(x["update"]["bytes_written"] + x["update"].get("vector_bytes", 0)) / x["rebuild"]["bytes_written"]
               for x in runs]
    fresh = [x["update"]["seconds"]["total"] / x["rebuild"]["seconds"]["total"] for x in runs]
    warm = [x["warm"]["update_seconds"] / x["warm"]["rebuild_seconds"] for x in runs if "warm" in x]
    rates = [_table_rate(x["rebuild"]) for x in runs]
    warm_rates = [x["rebuild"]["segment_bytes_read"] / x["warm"]["rebuild_seconds"] / 1e6 for x in runs if "warm" in x]
    shapes = " / ".join(f"{x['partitions']}p" for x in runs)
    return [(f"28a. P8 a 1% update writes ({shapes})", "≤ 5% of the table",
             " / ".join(f"{100 * w:.2f}%" for w in written), all(w <= 0.05 for w in written)),
            (f"28a. P8 update wall vs rebuild ({shapes})", "≤ 10%",
             "fresh process " + " / ".join(f"{100 * f:.0f}%" for f in fresh)
             + ("; warm session " + " / ".join(f"{100 * w:.1f}%" for w in warm) if warm else ""),
             all(f <= 0.10 for f in fresh)),
            (f"28b. P8 rebuild ({shapes})", "≥ 100 MB/s", "fresh process " + " / ".join(f"{x:.0f}" for x in rates)
             + (" MB/s; warm session " + " / ".join(f"{x:.0f}" for x in warm_rates) if warm_rates else "") + " MB/s",
             all(x >= 100 for x in rates)), *_p8_read_row(runs, shapes)]


def _p8_read_row(runs: list[dict[str, Any]], shapes: str) -> list[tuple[str, str, str, bool]]:
    """Goal 28b's read: `read_partition(...).count()` against the compaction's scan on the same bytes, in a fresh
    process's first job and again; met when both are within 2×."""
    pairs = [(_input_figures(x["read_partition"]["read"]), _input_figures(x["read_partition"]["scan"]))
             for x in runs if "read" in x["read_partition"]]
    if not pairs:
        return []
    first = [read[0] / scan[0] for read, scan in pairs]
    again = [read[1] / scan[1] for read, scan in pairs]
    return [(f"28b. P8 read_partition count ÷ the compaction's scan, same bytes ({shapes})", "≤ 2×",
             "first job " + " / ".join(f"{x:.2f}×" for x in first)
             + "; again " + " / ".join(f"{x:.2f}×" for x in again),
             all(x <= 2 for x in first + again))]


SPARK_ALONE = ("from pyspark.sql import SparkSession; s = SparkSession.builder.master('local[2]').getOrCreate(); "
               "s.range(1).count(); s.stop()")
"""As bench_measure.SPARK_ALONE (this module renders without importing the measuring one)."""


def _p11(r: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    runs = r["runs"]
    names = [s["command"] for s in runs[0]["steps"]]
    lines = [
        f"The same ~{_mb(runs[0]['log_bytes'])} of `kcompact generate --bulk` (100-byte values, "
        f"{r['segment_bytes'] // 1024} KiB segments, {r['total_records']:,} records) over N partitions of one topic; "
        "each command a fresh process on a fresh store (`scripts/bench_partitions.py`). Seconds, and in brackets the "
        "Delta commits it made to the metadata table. verify is one partition's (it takes one); gc deletes what the "
        "compaction replaced (grace 0).",
        "",
        "| partitions | " + " | ".join(names) + " | load (1/5/15 min) |",
        "|---" * (len(names) + 2) + "|",
    ]
    for run in runs:
        cells = [f"{s['seconds']:.1f} ({s['commits']})" for s in run["steps"]]
        lines.append(f"| {run['partitions']:,} | " + " | ".join(cells) + " | "
                     + " / ".join(f"{x:.1f}" for x in run["load"]) + " |")
    first, last = runs[0], runs[-1]
    lines.append("")
    for name in ("tier", "compact"):
        a = next(s for s in first["steps"] if s["command"] == name)["seconds"]
        b = next(s for s in last["steps"] if s["command"] == name)["seconds"]
        lines.append(f"- {name}: {last['partitions']:,} partitions at {b / a:.2f}x the wall of {first['partitions']} "
                     f"(goal <= 1.5x).")
    worst = max(next(s for s in run["steps"] if s["command"] == "compact")["commits"] for run in runs)
    lines.append(f"- commits per compaction: at most {worst} at any partition count (goal <= 3).")
    return [*lines, "", note("P11 analysis")]


def _or_dash(value: float | None, spec: str) -> str:
    """`value` formatted, or a dash where the saved figures predate it."""
    return "—" if value is None else format(value, spec)


def _p10(runs: list[dict[str, Any]], saved: dict[str, Any]) -> list[str]:
    lines = [
        "Each shape's log dir cleaned by Kafka 4.2.1's own `Cleaner` (one cleaner thread, the broker's defaults: "
        "128 MiB dedupe buffer, 512 KiB io buffer; its JVM as a broker's, after a warm-up clean of other data) and "
        "by kcompact (`local[2]`: in session, in a session that has compacted another copy of the same bytes before "
        "(its second run: as Kafka's clean follows a warm-up one), and as fresh `kcompact compact` processes) on the "
        "same bytes: every segment but each partition's active one (`scripts/bench_cleaner.py`). Kafka: seconds of "
        "its cleaning rounds "
        "inside the JVM (the whole process in brackets). kcompact per core = its MB/s / 2. Equal: each partition's "
        "records (offset, timestamp, key, value) after both, compared by digest.",
        "",
        "| shape | MB | Kafka MB/s per thread (process) | rounds | kcompact MB/s per core in session | "
        "session's second run | fresh process | ratio session (goal ≥ 2) | second run | ratio fresh (goal ≥ 1) | "
        "in session, share of one core's raw read + CRC (as P2; goal ≥ 15% on P2K) | peak RSS "
        "Kafka / kcompact driver + JVM + workers | equal |",
        "|---" * 13 + "|",
    ]
    for r in runs:
        k, c = r["kafka"], r["kcompact"]
        peak = c.get("memory_peak_bytes") or {}
        ours = " + ".join(_mb(peak.get(x, 0)) for x in ("driver_python", "jvm", "python_workers"))
        lines.append(
            f"| {r['what']} | {_mb(r['input_bytes'])} | {k['mb_s']:.1f} ({k['process_mb_s']:.1f}) | {k['rounds']} | "
            f"{c['mb_s_per_core']:.1f} | {_or_dash(c.get('again_mb_s_per_core'), '.1f')} | "
            f"{c['process_mb_s'] / 2:.1f} (first {c['process_first_mb_s'] / 2:.1f}) | "
            f"{r['ratio_session']:.2f} | {_or_dash(r.get('ratio_session_again'), '.2f')} | {r['ratio_fresh']:.2f} | "
            f"{c['mb_s'] / r['raw_mb_s']:.1%} | "
            f"{_mb(k['peak_rss_bytes'])} / {ours} | {'yes' if r['equal'] else '**no**'} |")
    lines.append("")
    lines.extend(f"- {r['shape']}: `{r['command']}`" for r in runs)
    return [*lines, "", note("P10 analysis")]


SECTIONS: dict[str, tuple[str, Callable[[Any, dict[str, Any]], list[str]]]] = {
    "P0": ("P0 — a small run vs Spark's own start (issue 27 b)", _p0),
    "P0C": ("P0c — a fresh clone's first run vs its second; the shipped kernels' speed (issue 27 a)", _p0c),
    "P1": ("P1 — segment scan vs raw read + CRC-32C (one core)", lambda r, _s: _p1(r)),
    "P2": ("P2 — end to end, ≥ 1 GiB, local[2] (goal c, first shape)", _p2),
    "P2K": ("P2K — end to end on a kafka-python workload: 2 partitions, 64 MiB segments, random keys (goal c)",
            _p2k),
    "P4": ("P4 — skipping at the defaults when 1% of keys change (goal b)", _p4),
    "P5": ("P5 — scaling 1× / 4× / 16×, fixed cost per run (goal e)", _p5),
    "P6": ("P6 — one hot partition vs 8 partitions (goal d)", _p6),
    "P3": ("P3 — key cardinality and memory", _p3),
    "P7": ("P7 — verify at scale (goal f)", _p7),
    "P8": ("P8 — the topic as a Delta table: full rebuild ≥ 1 GiB and a 1% update, two shapes (`kcompact table`)",
           _p8),
    "P9": ("P9 — a Kafka broker tiering through kcompact's plugin, and consumers reading the tier, beside Kafka's "
           "stock metadata manager (issue 29 item 4)", _p9),
    "P9S": ("P9 on S3 — the Java consumer reading the tier through the plugin's chunk cache on a loopback S3 server, "
            "beside the broker's local log (issue 40 item 4)", _p9s),
    "P10": ("P10 — Kafka's own cleaner and kcompact on the same partition directories (issue 44)", _p10),
    "P11": ("P11 — the same bytes over 8, 100 and 1,000 partitions (issue 41 item 7)", _p11),
}


PREVIOUS = "<!-- previous version: figures measured before the run refactor; replaced as sections are re-measured -->"


WAL_SECTION = "## W — "
"""The WAL's section, written by scripts/bench_wal.py (`make bench-wal`). Like every section this harness does not
write (the metadata table's and the broker's at scale, written by their own scripts), it is carried over as it is."""


def section_span(text: str, heading: str) -> tuple[int, int] | None:
    """Where the section of `text` starting with `heading` lies: up to the next section or PREVIOUS. None if
    `text` has no such section."""
    start = text.find(heading)
    if start < 0:
        return None
    ends = [i for i in (text.find("\n## ", start + 1), text.find(PREVIOUS, start)) if i >= 0]
    return start, min(ends, default=len(text))


def _headings(text: str) -> list[str]:
    """The `## ` section headings of `text`, in order."""
    return [line[3:] for line in text.split("\n") if line.startswith("## ")]


def kept_section(text: str, heading: str) -> list[str]:
    """The lines of the section of `text` starting with `heading`, up to the next section or PREVIOUS."""
    span = section_span(text, heading)
    if span is None:
        return []
    return [*text[span[0] : span[1]].rstrip("\n").split("\n"), ""]


def _table_rows(lines: list[str]) -> list[str]:
    """The figure rows of a section's table in `lines` (not its header, rule or placeholder). Pure."""
    return [line for line in lines if line.startswith("| ") and not line.startswith(("| figure |", "| run |", "| — |"))]


def merged_table(new: list[str], text: str, heading: str) -> list[str]:
    """The section `new` (as this run writes it, heading first) with the rows of its table merged into those of the
    section `heading` of `text`: a row of `text` whose figure this run measured (its first cell) is replaced by the
    run's, the others are kept in their place (figures measured by an earlier run, or written by another script),
    and the run's rows for figures `text` lacks come after. Pure."""
    span = section_span(text, heading)
    old = _table_rows(text[span[0] : span[1]].split("\n")) if span else []
    if not old:
        return new
    first = next((i for i, line in enumerate(new) if line.startswith("|---")), None)
    if first is None:  # the run wrote no table (its placeholder): the earlier section as it was
        return kept_section(text, heading)
    rows = _table_rows(new)
    label = {row: row.split(" | ", 1)[0] for row in [*old, *rows]}
    ours = {label[row]: row for row in rows}
    merged = [ours.pop(label[row], row) for row in old]
    merged += [row for row in rows if label[row] in ours]
    rest = [line for line in new[first + 1 :] if line not in rows and not line.startswith("| — |")]
    return [*new[: first + 1], *merged, *rest]


def write_report(path: Path, results: Path) -> None:
    """BENCHMARKS.md from the saved figures. A figure with no saved result keeps its section of the existing file
    and its rows of the Summary and fetch tables (`merged_table`), so that `--only P10` on a checkout without an
    earlier run's bench-data/results rewrites P10 alone; a figure never measured gets a placeholder. The previous
    version's text (below PREVIOUS in the existing file) is carried over until every figure is new."""
    saved_files = {f: json.loads((results / f"{f}.json").read_text()) for f in SECTIONS
                   if (results / f"{f}.json").exists()}
    saved = {f: d["result"] for f, d in saved_files.items()}
    existing = path.read_text() if path.exists() else ""
    head = existing.split(PREVIOUS, 1)[0]
    fetch = "## Fetch ratio on every shape (goal a)"
    lines = [
        "# kcompact benchmarks",
        "",
        "Written by `make bench` (`python scripts/bench.py`; `--only P2,P4` refreshes some sections and keeps the "
        "others). Each section names its workload, machine and date. Never part of `make test`.",
        "",
        *merged_table(summary(saved), head, "## Summary"),
        *(merged_table([fetch, "", *_fetch(saved), ""], head, fetch) if _runs(saved) else
          kept_section(head, fetch) or [fetch, "", "Not measured yet by this harness.", ""]),
    ]
    for figure, (title, render) in SECTIONS.items():
        if figure in saved_files:
            data = saved_files[figure]
            lines += [f"## {title}", "", f"Measured {data['measured']} on {data['machine']}.", "",
                      *render(data["result"], saved), ""]
        else:  # measured by an earlier run whose saved figures this checkout lacks (bench-data/ is not committed)
            lines += kept_section(head, f"## {title}") or [
                f"## {title}", "", f"Not measured yet by this harness (`make bench BENCH_ARGS=\"--only {figure}\"`).",
                ""]
    written = {"Summary", "Fetch ratio on every shape (goal a)", *(title for title, _ in SECTIONS.values())}
    for heading in _headings(head):
        if heading not in written:
            lines += kept_section(existing, f"## {heading}")
    previous = existing.split(PREVIOUS, 1) if existing else []
    if len(previous) == 2 and len(saved_files) < len(SECTIONS):
        lines += [PREVIOUS, previous[1].lstrip("\n")]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def fit(points: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares wall seconds = a + b * MB over P5's points."""
    xs, ys = [p["bytes_read"] / 1e6 for p in points], [p["wall_seconds"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def summary(r: dict[str, Any]) -> list[str]:
    """Targets vs figures (the goals a-f first); the sections say what limits the ones not met."""
    rows = []
    runs = _runs(r)
    if runs:
        worst_label, worst = max(runs, key=lambda x: x[1].get("fetch_ratio") or 0)
        top = worst.get("fetch_ratio") or 0
        rows.append(("a. fetch ratio, every shape", "≤ 1.05", f"max {top:.3f} ({worst_label})", top <= 1.05))
    if "P4" in r:
        p4 = r["P4"]
        rows.append(("b. P4 skipping at the defaults, 1% keys", "fetched ≤ dirty + overlap + 2% clean",
                     f"{_mb(p4['fetched_bytes'])} vs {_mb(p4['bound_bytes'])}",
                     p4["fetched_bytes"] <= p4["bound_bytes"]))
    for label, x in runs:
        if x.get("cli") and (label.startswith("P2") or label.startswith("P6")):
            share = x["cli"]["mb_s"] / x["raw_mb_s"]
            rows.append((f"whole process, {label}", "fresh `kcompact compact`" + (" ≥ 3.5% of raw" if label.startswith(
                "P2K") else ""), f"{x['cli']['mb_s']:.0f} MB/s = {100 * share:.1f}% (first process "
                f"{x['cli']['first_mb_s']:.0f})", share >= 0.035 if label.startswith("P2K") else True))
    if "P0C" in r:
        worst = max(c["first_over_second"] for c in r["P0C"]["clones"])
        rows.append(("P0c fresh clone: first run vs second", "≤ 1.15×", f"{worst:.2f}× (worse shape)", worst <= 1.15))
    if "P0" in r:
        excess = max(x["median_seconds"] - x["spark_median_seconds"] for x in r["P0"])
        rows.append(("P0 ~10 MB run vs Spark's own start", "≤ + 3 s", f"+{excess:.1f} s (worse shape)", excess <= 3))
    if "P2" in r:
        rates = ", ".join(f"{x['codec']} {x['mb_s']:.0f} MB/s = {100 * x['raw_share']:.1f}% (process "
                          f"{x['process_mb_s']:.0f})" for x in r["P2"])
        rows.append(("c. P2 end to end, local[2]", "≥ 100 MB/s and ≥ 6% of raw", rates,
                     all(x["mb_s"] >= 100 and x["raw_share"] >= 0.06 for x in r["P2"])))
    if "P2K" in r:
        k = r["P2K"]
        rows.append(("c. P2K kafka-python shape", "≥ 80 MB/s and ≥ 5% of raw",
                     f"{k['mb_s']:.0f} MB/s = {100 * k['raw_share']:.1f}% (process {k['process_mb_s']:.0f})",
                     k["mb_s"] >= 80 and k["raw_share"] >= 0.05))
    if "P6" in r:
        ratio = r["P6"]["hot"]["mb_s"] / r["P6"]["spread"]["mb_s"]
        tasks = r["P6"]["hot"]["per_partition"][0]["rewrite_tasks"]
        rows.append(("d. one hot partition vs 8", "≥ 80%", f"{100 * ratio:.0f}% ({tasks} rewrite tasks)", ratio >= 0.8))
    if "P5" in r:
        a, b = fit(r["P5"]["points"])
        worst_fit = max(abs(p["wall_seconds"] / (a + b * p["bytes_read"] / 1e6) - 1) for p in r["P5"]["points"])
        rows.append(("e. fixed cost per run (P5 intercept)", "≤ 4 s", f"{a:.1f} s", a <= 4))
        rows.append(("P5 scaling 1×/4×/16×", "within 15% of linear", f"a + b·MB within {100 * worst_fit:.0f}%",
                     worst_fit <= 0.15))
    if "P7" in r:
        v = r["P7"]
        rows.append(("f. verify at scale", "flat driver", f"{v['keys'] / 1e6:.0f} M keys: driver "
                     f"{_mb(v['memory_peak_bytes']['driver_python'])}" if v["measured"] else "not measured yet",
                     v["measured"] and v["verify_ok"]))
    if "P1" in r:
        rows.append(("P1 scan vs read + CRC", "≥ 40%", f"{100 * r['P1']['ratio']:.0f}%", r["P1"]["ratio"] >= 0.4))
    if "P3" in r:
        top3 = max(r["P3"], key=lambda x: x["keys"])
        drivers = " → ".join(f"{x['memory_peak_bytes']['driver_python'] / 1e6:.0f}" for x in r["P3"])
        flat = max(x["memory_peak_bytes"]["driver_python"] for x in r["P3"]) <= 1.25 * min(
            x["memory_peak_bytes"]["driver_python"] for x in r["P3"])
        rows.append(("P3 cardinality", "50 M keys in one run, flat driver memory",
                     f"{top3['dirty_keys'] / 1e6:.1f} M keys in {top3['wall_seconds']:.0f} s; driver MB {drivers}",
                     top3["dirty_keys"] >= 50_000_000 and flat))
    rows += _p8_rows(r) + _p9_rows(r) + _p9s_rows(r)
    lines = ["## Summary", "", "| figure | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {target} | {value} | {'yes' if ok else '**no**'} |" for name, target, value, ok in rows]
    if not rows:
        lines.append("| — | — | not measured yet by this harness | — |")
    return [*lines, ""]
