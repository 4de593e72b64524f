"""`kcompact plan` and `kcompact compact`: a compaction run, plan -> stage -> commit, and its reports.

The one module of the CLI that calls the run itself (`compaction.run`: plan, stage, commit).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from compaction.cli import options
from compaction.errors import ExitCode, KcompactError, worst_exit_code

if TYPE_CHECKING:
    from compaction.metadata import TopicPartition
    from compaction.progress import Progress
    from compaction.retention import RetentionReport
    from compaction.run.commit import PartitionOutcome
    from compaction.run.plan import RunPlan
    from compaction.run.report import RunReport
    from compaction.run.stage import StagedRun
    from compaction.storage.base import ObjectStore

PLAN_HELP = "show what a compaction run would do, and why, without doing it"
PLAN_DESCRIPTION = """
Plan like Kafka's cleaner manager: per partition the cleaned, dirty and uncleanable regions (min.compaction.lag.ms,
open transactions), bytes, dirty ratio, KIP-354 compaction delay, the decision and why (including what would make an
ineligible partition eligible). Must-clean partitions first, then the filthiest. For compact,delete topics, also
what retention.ms / retention.bytes would expire first (`kcompact expire --help`); the partitions are planned on
the log that expiry leaves. Reads only.
"""
COMPACT_HELP = "compact the eligible partitions on Spark and commit the swap"
COMPACT_DESCRIPTION = """
plan -> stage -> commit. Eligible partitions (see `kcompact plan`) are scanned and compacted on Spark (local[2]
unless --master or spark-submit says otherwise); every output segment is uploaded under a fresh segment id.
The run takes the fencing epochs of its partitions in one metadata commit and makes every output live in one more,
each partition checked on its own there: a fenced or conflicting partition fails alone, the others land. Replaced
segments are marked DELETE_SEGMENT_STARTED; `kcompact gc` deletes them later. Before that, as Kafka's cleaner does
for a compact,delete log, the run applies retention.ms / retention.bytes to compact,delete topics (`kcompact
expire`, one commit first).
Rerunning is always safe. Exit codes: 0 done or nothing to do, 2 config error, 3 corrupt input in some partition
(the others are committed), 4 fenced or conflicting commit, or a store that kept failing, in some partition (the
others are committed; a rerun is safe).
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "plan", run_plan, PLAN_HELP, PLAN_DESCRIPTION)
    _add_plan_options(p)
    options.add_json_option(p, "print the plan as JSON")

    p = options.add_command(sub, "compact", run_compact, COMPACT_HELP, COMPACT_DESCRIPTION)
    _add_plan_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop (same as `kcompact plan`)")
    p.add_argument("--master", default=None, help="Spark master URL (default: local[2])")
    p.add_argument("--report-json", type=Path, default=None, help="also write the run report as JSON to this file")
    p.add_argument("--html-report", type=Path, default=None,
                   help="also write the run report as a self-contained HTML page (charts inline, works offline)")
    p.add_argument("--metrics-file", type=Path, default=None,
                   help="also write the run's metrics in Prometheus text format (for node_exporter's textfile "
                   "collector; replaced atomically). Written when there is nothing to do too")
    options.add_json_option(p, "print the run report as JSON instead of text")


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    options.add_store_options(p)
    p.add_argument("--config", required=True, type=Path,
                   help="YAML config with Kafka topic-level names (see conf/kcompact.yaml)")
    options.add_now_option(p, "the run's clock")
    options.add_topic_scope(p)
    p.add_argument("--force", action="store_true",
                   help="recompact every partition below its first uncleanable offset, whatever the dirty ratio "
                   "(e.g. to drop tombstones whose delete horizon has passed)")
    p.add_argument("--disk-budget-bytes", type=int, default=None,
                   help="temporary local disk one rewrite chunk may use; chunks are at most min(segment.bytes, "
                   "this) (default: a third of the free space of the temporary directory)")


def _build_plan(args: argparse.Namespace, store: ObjectStore) -> RunPlan:
    from compaction.config import load_config
    from compaction.run.plan import plan

    return plan(store, load_config(args.config), options.now_ms(args), **options.topic_scope(args),
                force=args.force, disk_budget_bytes=args.disk_budget_bytes)


def run_plan(args: argparse.Namespace) -> int:
    run = _build_plan(args, options.open_store(args))
    retention = _planned_retention(run)
    doc = {"run_id": run.run_id, **run.plan.to_dict(), "retention": retention and retention.to_dict()}
    options.print_result(args.json, doc, [run.plan.render_text(), *_retention_lines(retention)])
    return ExitCode.OK


def _planned_retention(run: RunPlan) -> RetentionReport | None:
    from compaction.retention import RetentionReport

    plan = run.retention
    return RetentionReport.planned(plan) if plan is not None and plan.in_scope else None


def _retention_lines(retention: RetentionReport | None) -> list[str]:
    """The retention summary, when it expires anything or holds a partition back (the plan above is of the log it
    leaves)."""
    return retention.summary().splitlines() if retention is not None and retention.noteworthy else []


def _write_outputs(args: argparse.Namespace, report: RunReport) -> None:
    from compaction.run.metrics import prometheus_text
    from compaction.run.report_html import render_html

    if args.report_json:
        options.write_atomically(args.report_json, json.dumps(report.to_dict(), indent=2))
    if args.html_report:
        options.write_atomically(args.html_report, render_html(report))
    if args.metrics_file:
        options.write_atomically(args.metrics_file, prometheus_text(report))


def _commit_each(staged: StagedRun, progress: Progress) -> list[PartitionOutcome]:
    """`commit`, reporting `commit i/n` for each partition once the metadata commit that decides it is known (a run's
    partitions are committed together, so there is no per-partition time to estimate what is left from)."""
    from compaction.run.commit import commit

    total, done = len(staged.partitions), [0]

    def step(outcome: PartitionOutcome) -> None:
        done[0] += 1
        verdict = (f"committed at version {outcome.version}" if outcome.committed
                   else f"NOT committed ({outcome.error_type})")
        progress.phase(f"commit {done[0]}/{total} {outcome.topic}-{outcome.partition}: {verdict}")

    return commit(staged, progress=step)


def run_compact(args: argparse.Namespace) -> int:
    from compaction.metadata import table_requests
    from compaction.progress import Progress
    from compaction.run.report import plan_report, requests_since, run_report
    from compaction.run.report_text import render_text
    from compaction.run.stage import expire_first, take

    progress = Progress(sys.stderr)
    store = options.open_store(args)
    table_before = table_requests(store)
    run = _build_plan(args, store)
    phases = {"plan": progress.elapsed()}
    progress.phase(f"plan: {len(run.plan.partitions)} partitions at metadata version {run.plan.metadata_version}, "
                   f"{len(run.plan.eligible)} to compact (run {run.run_id})")
    if args.dry_run or not run.plan.eligible:
        failed: dict[TopicPartition, KcompactError] = {}
        retention = _planned_retention(run) if args.dry_run else expire_first(run, failed)
        report = replace(plan_report(run, phases, retention, failed),
                         metadata_requests=requests_since(table_before, store))
        if args.json and not args.dry_run:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            print(run.plan.render_text())
            for line in _retention_lines(retention):
                print(line)
        if args.dry_run:
            return ExitCode.OK
        if not args.json:
            print("nothing to compact" if not report.failed else
                  f"nothing to compact; {len(report.failed)} partitions quarantined (see above)")
        _write_outputs(args, report)
        return report.exit_code  # a partition quarantined at planning is a failure an orchestrator sees
    # the JVM starts while the driver commits the run's retention and fencing epochs; it stops while the run commits
    with options.CommandSession(args.master, progress, background=True, quick_jit=True) as session:
        taken = take(run)
        staged = taken.stage(session.get()) if taken.taken else taken.staged  # every partition refused: no Spark
        session.stop(wait=False)
        phases["stage"] = progress.elapsed() - phases["plan"]
        progress.phase(f"stage: {len(staged.partitions)} partitions rewritten and uploaded, "
                       f"{len(staged.failed)} failed")
        outcomes = _commit_each(staged, progress)
        phases["commit"] = progress.elapsed() - phases["plan"] - phases["stage"]
    report = replace(run_report(staged, outcomes, phases),
                     metadata_requests=requests_since(table_before, store))
    _write_outputs(args, report)
    options.print_result(args.json, report.to_dict(), render_text(report))
    return worst_exit_code(outcomes)
