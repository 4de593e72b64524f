"""The `kcompact` command line. It parses arguments, reads the clock and the environment, and calls one function.

Exit codes (see `compaction.errors.ExitCode`): 0 success or nothing to do, 1 internal error, 2 configuration
or usage error, 3 corrupt input, 4 fenced or conflicting commit (a rerun is safe), 5 verification failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compaction.errors import ExitCode, KcompactError

if TYPE_CHECKING:
    from compaction.progress import Progress
    from compaction.run.commit import PartitionOutcome
    from compaction.run.plan import RunPlan
    from compaction.run.stage import StagedRun
    from compaction.storage import ObjectStore

EPILOG = """exit codes:
  0  success (or nothing to do)
  1  internal error (a bug: please report it with the traceback)
  2  configuration or usage error: fix the config or the command line
  3  corrupt input: the named object is malformed (the partition is quarantined)
  4  fenced or conflicting commit: nothing was committed, rerunning is safe
  5  verification failed (`kcompact verify`): a key was lost or changed; alert, keep the store as it is
"""


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="write a realistic Kafka log dir (segments, indexes, snapshots) for demos, tests and benchmarks",
        description="Generate a Kafka log directory: several topics and partitions, rolled segments plus an "
        "active one, skewed key updates, tombstones, idempotent and transactional producers (some transactions "
        "aborted), every codec, a `version` header, out-of-order timestamps and leader epoch changes. "
        "The output is a pure function of the options (the seed included). "
        "--bulk is the benchmark-scale path (millions of records a second instead of ~40 thousand): real "
        "segments, indexes, snapshots and checkpoints as well, but a plain workload: one non-idempotent, "
        "non-transactional producer per partition, one codec (the first of --codecs), exactly "
        "--records-per-batch records per batch, leader epoch 0, no headers, timestamps start-ms + offset × "
        "ms-per-record, keys key-%010d chosen by --key-order, values of exactly --value-bytes printable bytes or null "
        "(--tombstone-ratio), "
        "then optionally --update-fraction × --keys records rewriting distinct keys. --key-skew, "
        "--transactional-ratio and --abort-ratio do not apply to it; --key-order, --update-fraction, "
        "--update-spread, --jobs and --progress-interval apply only to it. With --bulk the segment files "
        "already in a partition directory are replaced.",
    )
    p.add_argument("--logdir", required=True, type=Path, help="directory to write (created if missing)")
    p.add_argument(
        "--topics",
        default="orders:2,users:2,inventory:1",
        help="comma-separated TOPIC:PARTITIONS (default: %(default)s)",
    )
    p.add_argument("--records", type=int, default=20_000, help="records per partition (default: %(default)s)")
    p.add_argument(
        "--keys", type=int, default=2_000, help="distinct keys per partition (default: %(default)s)"
    )
    p.add_argument(
        "--key-skew", type=float, default=None, help="Zipf exponent of key popularity (default: 1.1; not with --bulk)"
    )
    p.add_argument(
        "--value-bytes", type=int, default=100,
        help="approximate value size; exact with --bulk (default: %(default)s)",
    )
    p.add_argument(
        "--records-per-batch", type=int, default=None,
        help="mean records per batch; with --bulk every batch holds exactly this many (default: 20; 100 with --bulk)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=256 * 1024,
        help="roll segments at this size, like segment.bytes (default: %(default)s)",
    )
    p.add_argument(
        "--tombstone-ratio", type=float, default=0.03, help="share of tombstones (default: %(default)s)"
    )
    p.add_argument(
        "--transactional-ratio",
        type=float,
        default=None,
        help="chance that a producer is transactional (default: 0.25; not with --bulk)",
    )
    p.add_argument(
        "--abort-ratio", type=float, default=None,
        help="share of aborted transactions (default: 0.3; not with --bulk)",
    )
    p.add_argument(
        "--codecs",
        default="none,gzip,snappy,lz4,zstd",
        help="codecs the producers use, round robin; --bulk uses the first one for every batch "
        "(default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    p.add_argument(
        "--start-ms",
        type=int,
        default=1_700_000_000_000,
        help="timestamp of the first record (default: %(default)s)",
    )
    p.add_argument(
        "--ms-per-record", type=int, default=50,
        help="the clock advances this much per record (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")
    bulk = p.add_argument_group("benchmark-scale generation (--bulk)")
    bulk.add_argument(
        "--bulk", action="store_true",
        help="fast, plain workload for benchmarks (see above): ≥ 2 M records/s per core uncompressed",
    )
    bulk.add_argument(
        "--key-order", choices=["sequential", "uniform"], default=None,
        help="sequential: the first --keys records are key ids 0..K-1 in order (every key once), any further "
        "records draw uniformly; uniform: every record draws uniformly (default: sequential)",
    )
    bulk.add_argument(
        "--update-fraction", type=float, default=None, metavar="F",
        help="after --records records, append round(F × --keys) records rewriting that many distinct keys with "
        "new non-null values, F in [0, 1] (default: 0)",
    )
    bulk.add_argument(
        "--update-spread", choices=["clustered", "random"], default=None,
        help="which keys --update-fraction rewrites: clustered = a contiguous run of key ids at a seeded "
        "position, random = a seeded random sample (default: clustered)",
    )
    bulk.add_argument(
        "--jobs", type=int, default=None,
        help="partitions generated in parallel worker processes; the output does not depend on it (default: 1)",
    )
    bulk.add_argument(
        "--progress-interval", type=float, default=None, metavar="SECONDS",
        help="print a progress line per partition to stderr this often; 0 = only when a partition is done "
        "(default: 5)",
    )
    p.set_defaults(func=_cmd_generate)


_BULK_ONLY = ("key_order", "update_fraction", "update_spread", "jobs", "progress_interval")
_NOT_BULK = ("key_skew", "transactional_ratio", "abort_ratio")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _cmd_generate(args: argparse.Namespace) -> int:
    from compaction.bulkgen import BulkSpec
    from compaction.format.codecs import Codec
    from compaction.workload import (
        TopicSpec,
        WorkloadSpec,
        generate_partition,
        iter_partitions,
        topic_ids_for,
    )

    topics = []
    for item in args.topics.split(","):
        name, _, parts = item.strip().partition(":")
        if not name or (parts and not parts.isdigit()):
            raise _usage(f"--topics: {item!r} is not TOPIC:PARTITIONS")
        topics.append(TopicSpec(name, int(parts or 1)))
    try:
        codecs = tuple(Codec[c.strip().upper()] for c in args.codecs.split(","))
    except KeyError as exc:
        raise _usage(f"--codecs: unknown codec {exc.args[0]!r} (none, gzip, snappy, lz4, zstd)") from None
    if args.bulk:
        wrong = [_option(d) for d in _NOT_BULK if getattr(args, d) is not None]
        if wrong:
            raise _usage(f"{', '.join(wrong)}: not with --bulk (its single plain producer draws keys by --key-order)")
        return _generate_bulk(args, BulkSpec(
            topics=tuple(topics),
            records_per_partition=args.records,
            keys=args.keys,
            value_bytes=args.value_bytes,
            records_per_batch=100 if args.records_per_batch is None else args.records_per_batch,
            segment_bytes=args.segment_bytes,
            codec=codecs[0],
            tombstone_ratio=args.tombstone_ratio,
            key_order=args.key_order or "sequential",
            update_fraction=0.0 if args.update_fraction is None else args.update_fraction,
            update_spread=args.update_spread or "clustered",
            start_ms=args.start_ms,
            ms_per_record=args.ms_per_record,
            seed=args.seed,
        ))  # BulkSpec validates: a ConfigError (exit 2) names the offending options
    wrong = [_option(d) for d in _BULK_ONLY if getattr(args, d) is not None]
    if wrong:
        raise _usage(f"{', '.join(wrong)}: only with --bulk")
    spec = WorkloadSpec(
        topics=tuple(topics),
        records_per_partition=args.records,
        keys=args.keys,
        key_skew=1.1 if args.key_skew is None else args.key_skew,
        value_bytes=args.value_bytes,
        records_per_batch=20 if args.records_per_batch is None else args.records_per_batch,
        segment_bytes=args.segment_bytes,
        tombstone_ratio=args.tombstone_ratio,
        transactional_ratio=0.25 if args.transactional_ratio is None else args.transactional_ratio,
        abort_ratio=0.3 if args.abort_ratio is None else args.abort_ratio,
        codecs=codecs,
        seed=args.seed,
        start_ms=args.start_ms,
        ms_per_record=args.ms_per_record,
    )
    summary = []
    partitions = list(iter_partitions(spec))
    topic_ids = topic_ids_for(spec)
    for i, (topic, partition) in enumerate(partitions, 1):
        truth = generate_partition(
            args.logdir / f"{topic}-{partition}", spec, topic, partition, topic_ids[topic]
        )
        size = sum(p.stat().st_size for p in (args.logdir / f"{topic}-{partition}").glob("*.log"))
        summary.append(
            {
                "topic": topic,
                "partition": partition,
                "segments": len(truth.segment_bases),
                "log_end_offset": truth.log_end_offset,
                "bytes": size,
                "aborted_txns": len(truth.aborted),
            }
        )
        print(
            f"[{i}/{len(partitions)}] {topic}-{partition}: {len(truth.segment_bases)} segments, "
            f"{truth.log_end_offset} offsets, {size / 2**20:.1f} MiB",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({"logdir": str(args.logdir), "partitions": summary}, indent=2))
    else:
        total = sum(s["bytes"] for s in summary)
        print(f"wrote {len(summary)} partitions, {total / 2**20:.1f} MiB of segments to {args.logdir}")
    return ExitCode.OK


def _generate_bulk(args: argparse.Namespace, spec: Any) -> int:
    """`kcompact generate --bulk`: `spec` is a validated `bulkgen.BulkSpec`."""
    from compaction.bulkgen import generate_bulk_logdir, print_progress

    jobs = 1 if args.jobs is None else args.jobs
    interval = 5.0 if args.progress_interval is None else args.progress_interval
    if jobs < 1:
        raise _usage(f"--jobs must be >= 1, got {jobs}")
    if interval < 0:
        raise _usage(f"--progress-interval must be >= 0, got {interval}")
    summary = generate_bulk_logdir(args.logdir, spec, jobs=jobs, progress=print_progress,
                                   progress_interval_s=interval if interval > 0 else float("inf"))
    if args.json:
        print(json.dumps({"logdir": str(args.logdir), "bulk": True, **summary.to_dict()}, indent=2))
    else:
        print(f"wrote {summary.line()} to {args.logdir}")
    return ExitCode.OK


def _add_dump(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dump",
        help="print the contents of Kafka log files, like kafka-dump-log.sh",
        description="Print batches and records of a .log, or the entries of a .index, .timeindex, .txnindex, "
        ".snapshot, leader-epoch-checkpoint or partition.metadata file. CRCs are checked and reported "
        "(isvalid); a malformed file fails with exit code 3 naming the byte position.",
    )
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files to dump")
    p.add_argument("--print-data", action="store_true", help="also print keys, values and headers")
    p.add_argument("--json", action="store_true", help="one JSON document per file (keys/values base64)")
    p.set_defaults(func=_cmd_dump)


def _cmd_dump(args: argparse.Namespace) -> int:
    from compaction.dump import dump_path, format_doc

    for path in args.paths:
        doc = dump_path(path, print_data=args.print_data)
        if args.json:
            print(json.dumps(doc))
        else:
            for line in format_doc(doc, print_data=args.print_data):
                print(line)
    return ExitCode.OK


STORE_HELP = "object store: a local directory (default ./kcompact-store) or s3://bucket/prefix"


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default="./kcompact-store", help=STORE_HELP + " (default: %(default)s)")
    p.add_argument("--endpoint-url", default=None,
                   help="S3 endpoint (default: AWS_ENDPOINT_URL or the AWS default)")


def _open_store(args: argparse.Namespace) -> ObjectStore:
    from compaction.storage import open_store

    return open_store(args.store, endpoint_url=args.endpoint_url)


def _add_tier(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tier",
        help="copy the rolled segments of a Kafka log dir into the store (like KIP-405's copy path)",
        description="Copy every rolled segment (all but the active, highest one) of each <topic>-<partition> "
        "directory into the store, with its offset/time indexes (rebuilt when missing or inconsistent), "
        "transaction index, producer snapshot and leader-epoch checkpoint. Each segment is recorded "
        "COPY_SEGMENT_STARTED, uploaded under a fresh segment id, then COPY_SEGMENT_FINISHED in the metadata "
        "table. A rerun copies only what is new. A partition with corrupt input is reported (exit 3) and "
        "nothing of it becomes live; the other partitions are still tiered.",
    )
    p.add_argument("--logdir", required=True, type=Path, help="a Kafka log dir (one sub-directory per partition)")
    _store_args(p)
    p.add_argument("--now", type=int, default=None, help="clock in epoch ms (default: the wall clock)")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.set_defaults(func=_cmd_tier)


def _cmd_tier(args: argparse.Namespace) -> int:
    from compaction.metadata import table_in_store
    from compaction.tier import PartitionTierResult, tier_logdir

    now_ms = args.now if args.now is not None else int(time.time() * 1000)
    store = _open_store(args)
    table = table_in_store(store, create=True)

    def progress(i: int, n: int, r: PartitionTierResult) -> None:
        state = f"FAILED: {r.error}" if r.error else (
            f"copied {len(r.copied)} segments ({r.bytes_copied / 2**20:.1f} MiB), {r.already_tiered} already tiered")
        print(f"[{i}/{n}] {r.topic}-{r.partition}: {state}", file=sys.stderr)

    results = tier_logdir(args.logdir, store, table, now_ms, progress=progress)
    if args.json:
        print(json.dumps({"store": store.uri, "partitions": [r.to_dict() for r in results],
                          "requests": vars(store.stats)}, indent=2))
    else:
        copied = sum(len(r.copied) for r in results)
        print(f"tiered {copied} segments of {len(results)} partitions into {store.uri} "
              f"({sum(r.bytes_copied for r in results) / 2**20:.1f} MiB; {store.stats.puts} PUTs)")
    return max((r.exit_code for r in results), default=0)


def _add_partition_args(p: argparse.ArgumentParser) -> None:
    _store_args(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", required=True, type=int)


def _add_segments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "segments",
        help="list the live remote segments of a partition",
        description="The live (COPY_SEGMENT_FINISHED) segments of a partition according to the metadata table, "
        "with start and end offsets, size, state, leader epochs and the URI of the .log object.",
    )
    _add_partition_args(p)
    p.add_argument("--version", type=int, default=None, help="metadata table version to read (time travel)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_segments)


def _cmd_segments(args: argparse.Namespace) -> int:
    from compaction.metadata import ObjectSuffix, table_in_store

    store = _open_store(args)
    segments = table_in_store(store).live_segments(args.topic, args.partition, args.version)
    rows = [
        {
            "segment_id": s.segment_id,
            "start_offset": s.start_offset,
            "end_offset": s.end_offset,
            "size": s.segment_size_bytes,
            "state": s.state.name,
            "leader_epochs": {str(e.epoch): e.start_offset for e in s.segment_leader_epochs},
            "max_timestamp_ms": s.max_timestamp_ms,
            "log_uri": store.object_uri(s.object_key(ObjectSuffix.LOG) or ""),
        }
        for s in segments
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return ExitCode.OK
    print(f"{'start_offset':>14} {'end_offset':>14} {'size':>12}  {'state':<22} leader_epochs  log")
    for r in rows:
        epochs = ",".join(f"{k}@{v}" for k, v in r["leader_epochs"].items())  # type: ignore[attr-defined]
        print(f"{r['start_offset']:>14} {r['end_offset']:>14} {r['size']:>12}  {r['state']:<22} {epochs:<13}  "
              f"{r['log_uri']}")
    print(f"{len(rows)} live segments")
    return ExitCode.OK


def _add_read(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "read",
        help="print what a consumer of a partition would receive, as JSON lines",
        description="Read a partition from its live remote segments in offset order, as a consumer would: "
        "one JSON object per record, {offset, timestamp, key, value, headers: [{key, value}]}, with key, value "
        "and header values base64-encoded (null stays null). Control records are not emitted. "
        "read_committed also drops records of aborted (and still open) transactions.",
    )
    _add_partition_args(p)
    p.add_argument("--from-offset", type=int, default=0, help="first offset to return (default: 0)")
    p.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"],
                   help="consumer isolation.level (default: %(default)s, as in Kafka)")
    p.add_argument("--version", type=int, default=None, help="metadata table version to read (time travel)")
    p.set_defaults(func=_cmd_read)


def _cmd_read(args: argparse.Namespace) -> int:
    from compaction.metadata import table_in_store
    from compaction.reader import Isolation, consumer_records, record_json, segment_ref

    store = _open_store(args)
    segments = table_in_store(store).live_segments(args.topic, args.partition, args.version)
    refs = [segment_ref(s) for s in segments]
    out = sys.stdout
    for record in consumer_records(store, refs, from_offset=args.from_offset,
                                   isolation=Isolation.parse(args.isolation)):
        out.write(json.dumps(record_json(record)) + "\n")
    return ExitCode.OK


def _plan_args(p: argparse.ArgumentParser) -> None:
    _store_args(p)
    p.add_argument("--config", required=True, type=Path,
                   help="YAML config with Kafka topic-level names (see conf/kcompact.yaml)")
    p.add_argument("--now", type=int, default=None, help="the run's clock in epoch ms (default: the wall clock)")
    p.add_argument("--topic", action="append", default=None, help="only this topic (repeatable)")
    p.add_argument("--partition", type=int, default=None, help="only this partition (with --topic)")
    p.add_argument("--force", action="store_true",
                   help="recompact every partition below its first uncleanable offset, whatever the dirty ratio "
                   "(e.g. to drop tombstones whose delete horizon has passed)")
    p.add_argument("--disk-budget-bytes", type=int, default=None,
                   help="temporary local disk one rewrite chunk may use; chunks are at most min(segment.bytes, "
                   "this) (default: a third of the free space of the temporary directory)")


def _build_plan(args: argparse.Namespace) -> RunPlan:
    from compaction.config import load_config
    from compaction.run.plan import plan

    if args.partition is not None and not args.topic:
        raise _usage("--partition needs --topic")
    now_ms = args.now if args.now is not None else int(time.time() * 1000)
    return plan(_open_store(args), load_config(args.config), now_ms, topics=args.topic,
                partition=args.partition, force=args.force, disk_budget_bytes=args.disk_budget_bytes)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="show what a compaction run would do, and why, without doing it",
        description="Plan like Kafka's cleaner manager: per partition the cleaned, dirty and uncleanable regions "
        "(min.compaction.lag.ms, open transactions), bytes, dirty ratio, KIP-354 compaction delay, the decision "
        "and why (including what would make an ineligible partition eligible). Must-clean partitions first, then "
        "the filthiest. Reads only.",
    )
    _plan_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    run = _build_plan(args)
    if args.json:
        print(json.dumps({"run_id": run.run_id, **run.plan.to_dict()}, indent=2))
    else:
        print(run.plan.render_text())
    return ExitCode.OK


def _add_compact(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compact",
        help="compact the eligible partitions on Spark and commit the swap",
        description="plan -> stage -> commit. Eligible partitions (see `kcompact plan`) are scanned and compacted on "
        "Spark (local[2] unless --master or spark-submit says otherwise); every output segment is uploaded under "
        "a fresh segment id and becomes live in one metadata commit per partition. Replaced segments are marked "
        "DELETE_SEGMENT_STARTED; `kcompact gc` deletes them later. Rerunning is always safe. Exit codes: 0 done or "
        "nothing to do, 2 config error, 3 corrupt input in some partition (the others are committed), "
        "4 fenced or conflicting commit (rerun).",
    )
    _plan_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop (same as `kcompact plan`)")
    p.add_argument("--master", default=None, help="Spark master URL (default: local[2])")
    p.add_argument("--report-json", type=Path, default=None, help="also write the run report as JSON to this file")
    p.add_argument("--html-report", type=Path, default=None,
                   help="also write the run report as a self-contained HTML page (charts inline, works offline)")
    p.add_argument("--metrics-file", type=Path, default=None,
                   help="also write the run's metrics in Prometheus text format (for node_exporter's textfile "
                   "collector; replaced atomically). Written when there is nothing to do too")
    p.add_argument("--json", action="store_true", help="print the run report as JSON instead of text")
    p.set_defaults(func=_cmd_compact)


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_outputs(args: argparse.Namespace, report: dict[str, Any]) -> None:
    from compaction.metrics import prometheus_text
    from compaction.report_html import render_html

    if args.report_json:
        _write_atomically(args.report_json, json.dumps(report, indent=2))
    if args.html_report:
        _write_atomically(args.html_report, render_html(report))
    if args.metrics_file:
        _write_atomically(args.metrics_file, prometheus_text(report))


def _commit_each(staged: StagedRun, progress: Progress) -> list[PartitionOutcome]:
    """`commit`, reporting `commit i/n` with an ETA after each partition."""
    from compaction.run.commit import commit

    steps = progress.steps("commit", len(staged.partitions))

    def step(outcome: PartitionOutcome) -> None:
        verdict = (f"committed at version {outcome.version}" if outcome.committed
                   else f"NOT committed ({outcome.error_type})")
        steps.step(f"{outcome.topic}-{outcome.partition}: {verdict}")

    return commit(staged, progress=step)


def _cmd_compact(args: argparse.Namespace) -> int:
    from compaction.progress import Progress
    from compaction.report import plan_report, render_text, run_report
    from compaction.run.stage import stage

    progress = Progress(sys.stderr)
    run = _build_plan(args)
    phases = {"plan": progress.elapsed()}
    progress.phase(f"plan: {len(run.plan.partitions)} partitions at metadata version {run.plan.metadata_version}, "
                   f"{len(run.plan.eligible)} to compact (run {run.run_id})")
    if args.dry_run or not run.plan.eligible:
        report = plan_report(run, phases)
        if args.json and not args.dry_run:
            print(json.dumps(report, indent=2))
        else:
            print(run.plan.render_text())
        if args.dry_run:
            return ExitCode.OK
        if not args.json:
            print("nothing to compact" if not report["failed"] else
                  f"nothing to compact; {len(report['failed'])} partitions quarantined (see above)")
        _write_outputs(args, report)
        return int(report["exit_code"])  # a partition quarantined at planning is a failure an orchestrator sees
    from pyspark.sql import SparkSession

    from compaction.spark.session import build_session

    started_here = SparkSession.getActiveSession() is None  # a notebook's or test's session is not ours to stop
    spark = build_session(args.master)
    try:
        staged = stage(spark, run)
    finally:
        if started_here:
            spark.stop()
    phases["stage"] = progress.elapsed() - phases["plan"]
    progress.phase(f"stage: {len(staged.partitions)} partitions rewritten and uploaded, {len(staged.failed)} failed")
    outcomes = _commit_each(staged, progress)
    phases["commit"] = progress.elapsed() - phases["plan"] - phases["stage"]
    report = run_report(staged, outcomes, phases)
    _write_outputs(args, report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in render_text(report):
            print(line)
    return max((o.exit_code for o in outcomes), default=0)


def _add_gc(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gc",
        help="delete the objects of replaced, abandoned and orphaned segments once past their grace period",
        description="Garbage-collect the store, metadata first. Segments in DELETE_SEGMENT_STARTED (replaced by "
        "a compaction) for longer than the grace (file.delete.delay.ms) lose their objects, then are recorded "
        "DELETE_SEGMENT_FINISHED. Tier attempts stuck in COPY_SEGMENT_STARTED for longer than the grace are "
        "retired and deleted the same way; zombie rows are retired now and deleted a grace later. Objects under "
        "segment keys that no metadata row references (uploads of failed or fenced runs) are deleted once older "
        "than the orphan grace. Live segments, the metadata table and keys that are not segment keys are never "
        "touched. Idempotent: a rerun, also after a crash, converges.",
    )
    _store_args(p)
    p.add_argument("--now", type=int, default=None, help="clock in epoch ms (default: the wall clock)")
    p.add_argument("--config", type=Path, default=None,
                   help="kcompact YAML config: each topic's grace is its file.delete.delay.ms")
    p.add_argument("--grace-ms", type=int, default=None,
                   help="grace for every topic, overriding --config (default: file.delete.delay.ms, 60000)")
    p.add_argument("--orphan-grace-ms", type=int, default=None,
                   help="minimum age of an unreferenced object before it is deleted; keep it above the longest "
                   "upload-to-commit time of a compaction run (default: 86400000, one day)")
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted; change nothing")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.set_defaults(func=_cmd_gc)


def _cmd_gc(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.gc import DEFAULT_GRACE_MS, DEFAULT_ORPHAN_GRACE_MS, GraceMs, collect_garbage
    from compaction.metadata import table_in_store

    if any(v is not None and v < 0 for v in (args.grace_ms, args.orphan_grace_ms)):
        raise _usage("--grace-ms and --orphan-grace-ms must be >= 0")
    config = load_config(args.config) if args.config is not None else None

    def topic_grace(topic: str) -> int:
        return config.for_topic(topic).file_delete_delay_ms if config else DEFAULT_GRACE_MS

    grace: GraceMs = args.grace_ms if args.grace_ms is not None else topic_grace
    orphan_grace = args.orphan_grace_ms if args.orphan_grace_ms is not None else DEFAULT_ORPHAN_GRACE_MS
    now_ms = args.now if args.now is not None else int(time.time() * 1000)
    store = _open_store(args)
    report = collect_garbage(store, table_in_store(store), now_ms, grace_ms=grace, orphan_grace_ms=orphan_grace,
                             dry_run=args.dry_run)
    if args.json:
        print(json.dumps({"store": store.uri, **report.to_dict(), "requests": vars(store.stats)}, indent=2))
    else:
        for line in report.summary():
            print(line)
    return ExitCode.OK


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check that compaction kept every key's latest value between two metadata table versions",
        description="Compare a partition's latest-per-key view (read_committed; keys ranked by the topic's "
        "compaction.strategy if --config is given, else by offset) at metadata table version --before (Delta "
        "time travel) with --after (default: the latest), below --before's log end. The only change allowed is "
        "a tombstone below the cleaner offset dropped at or after its delete horizon (deleteHorizonMs, by the "
        "clock of the run that dropped it); any other lost, changed or new key, and any change at or above the "
        "cleaner offset, fails with exit code 5 and lists the keys. Run it before `kcompact gc` deletes the "
        "segments the --before version points at. Reads only; no Spark.",
    )
    _add_partition_args(p)
    p.add_argument("--before", required=True, type=int, metavar="VERSION",
                   help="the earlier metadata table version, e.g. a run report's metadata_version_planned")
    p.add_argument("--after", type=int, default=None, metavar="VERSION",
                   help="the later metadata table version (default: the latest)")
    p.add_argument("--config", type=Path, default=None,
                   help="kcompact YAML config: the topic's compaction.strategy ranks a key's records")
    p.add_argument("--max-keys", type=int, default=20, help="keys listed in the text output (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the verdict and every problem key as JSON")
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.verify import verify_partition

    config = load_config(args.config).for_topic(args.topic) if args.config is not None else None
    report = verify_partition(_open_store(args), args.topic, args.partition, args.before, args.after, config=config)
    if args.json:
        print(json.dumps({"store": args.store, **report.to_dict()}, indent=2))
    else:
        for line in report.render_text(args.max_keys):
            print(line)
    return ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED


def _usage(message: str) -> KcompactError:
    from compaction.errors import ConfigError

    return ConfigError(message)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_generate, _add_dump, _add_tier, _add_segments, _add_read, _add_plan, _add_compact, _add_gc, _add_verify,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcompact",
        description="Log compaction for Kafka topics whose segments live in object storage, as a Spark batch job.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kcompact` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KcompactError as exc:
        print(f"kcompact {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except BrokenPipeError:
        return ExitCode.OK


def run(argv: Sequence[str] | None = None) -> None:
    """The console script: `main`, then leave without running interpreter teardown.

    deltalake's Rust runtime can abort the interpreter at shutdown ("terminate called without an active
    exception", delta-rs#2184) after a table was read, which would turn a success into exit 134 for an
    orchestrator. Everything is flushed first; Spark was stopped by the command that started it.
    """
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
