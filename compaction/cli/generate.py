"""`kcompact generate`: a Kafka log dir, realistic (`generate.workload`) or at benchmark scale (`--bulk`).

The generated timestamps follow the command's clock: the last record is stamped `--now` (default: the wall
clock, read once here) unless `--start-ms` pins the first one. Same options and clock, same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from compaction.cli import options
from compaction.errors import ExitCode

if TYPE_CHECKING:
    from compaction.format.codecs import Codec
    from compaction.generate.bulk_spec import BulkSpec
    from compaction.generate.topics import TopicSpec
    from compaction.generate.workload import WorkloadSpec

Spec = TypeVar("Spec", "WorkloadSpec", "BulkSpec")
GENERATE_HELP = "write a realistic Kafka log dir (segments, indexes, snapshots) for demos, tests and benchmarks"
GENERATE_DESCRIPTION = """
Generate a Kafka log directory: several topics and partitions, rolled segments plus an active one, skewed key
updates, tombstones, idempotent and transactional producers (some transactions aborted), every codec, a `version`
header, out-of-order timestamps and leader epoch changes. Records are stamped by the clock: the last one at --now
(default: the wall clock), or from --start-ms on. The output is a pure function of the options and that clock (the
seed included). --bulk is the benchmark-scale path (a compiled encoder instead of Python per record): real
segments, indexes, snapshots and checkpoints as well, but a plain workload: one non-idempotent, non-transactional
producer per partition, one codec (the first of --codecs), exactly --records-per-batch records per batch, leader
epoch 0, no headers, timestamps start-ms + offset × ms-per-record, keys key-%010d chosen by --key-order, values of
exactly --value-bytes printable bytes or null (--tombstone-ratio), then optionally --update-fraction × --keys
records rewriting distinct keys. --key-skew, --transactional-ratio and --abort-ratio do not apply to it;
--key-order, --update-fraction, --update-spread, --jobs and --progress-interval apply only to it. With --bulk the
segment files already in a partition directory are replaced.
"""
WORKLOAD_ONLY: dict[str, Any] = {"key_skew": 1.1, "transactional_ratio": 0.25, "abort_ratio": 0.3}
"""Options of the realistic workload and their defaults (they are None on the command line when not given)."""
BULK_ONLY: dict[str, Any] = {
    "key_order": "sequential", "update_fraction": 0.0, "update_spread": "clustered", "jobs": 1,
    "progress_interval": 5.0,
}
"""Options of --bulk and their defaults."""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "generate", run_generate, GENERATE_HELP, GENERATE_DESCRIPTION)
    p.add_argument("--logdir", required=True, type=Path, help="directory to write (created if missing)")
    p.add_argument("--topics", default="orders:2,users:2,inventory:1",
                   help="comma-separated TOPIC:PARTITIONS (default: %(default)s)")
    p.add_argument("--records", type=options.POSITIVE, default=20_000,
                   help="records per partition (default: %(default)s)")
    p.add_argument("--keys", type=options.POSITIVE, default=2_000,
                   help="distinct keys per partition (default: %(default)s)")
    p.add_argument("--key-skew", type=float, default=None,
                   help="Zipf exponent of key popularity (default: 1.1; not with --bulk)")
    p.add_argument("--value-bytes", type=options.NON_NEGATIVE, default=100,
                   help="approximate value size; exact with --bulk (default: %(default)s)")
    p.add_argument("--records-per-batch", type=options.POSITIVE, default=None,
                   help="mean records per batch; with --bulk every batch holds exactly this many (default: 20; 100 "
                   "with --bulk)")
    p.add_argument("--segment-bytes", type=options.POSITIVE, default=256 * 1024,
                   help="roll segments at this size, like segment.bytes (default: %(default)s)")
    p.add_argument("--tombstone-ratio", type=float, default=0.03, help="share of tombstones (default: %(default)s)")
    p.add_argument("--transactional-ratio", type=float, default=None,
                   help="chance that a producer is transactional (default: 0.25; not with --bulk)")
    p.add_argument("--abort-ratio", type=float, default=None,
                   help="share of aborted transactions (default: 0.3; not with --bulk)")
    p.add_argument("--codecs", default="none,gzip,snappy,lz4,zstd",
                   help="codecs the producers use, round robin; --bulk uses the first one for every batch "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    clock = p.add_mutually_exclusive_group()
    clock.add_argument("--now", type=options.NON_NEGATIVE, default=None, metavar="MS",
                       help="the clock in epoch ms: the last record of a partition is stamped with it, so the log "
                       "reads as just written (default: the wall clock)")
    clock.add_argument("--start-ms", type=options.NON_NEGATIVE, default=None,
                       help="stamp the first record with this epoch ms instead, whatever the clock")
    p.add_argument("--ms-per-record", type=options.NON_NEGATIVE, default=50,
                   help="the clock advances this much per record (default: %(default)s)")
    options.add_json_option(p, "print a machine-readable summary")
    bulk = p.add_argument_group("benchmark-scale generation (--bulk)")
    bulk.add_argument("--bulk", action="store_true",
                      help="fast, plain workload for benchmarks (see above)")
    bulk.add_argument("--key-order", choices=["sequential", "uniform"], default=None,
                      help="sequential: the first --keys records are key ids 0..K-1 in order (every key once), any "
                      "further records draw uniformly; uniform: every record draws uniformly (default: sequential)")
    bulk.add_argument("--update-fraction", type=float, default=None, metavar="F",
                      help="after --records records, append round(F × --keys) records rewriting that many distinct "
                      "keys with new non-null values, F in [0, 1] (default: 0)")
    bulk.add_argument("--update-spread", choices=["clustered", "random"], default=None,
                      help="which keys --update-fraction rewrites: clustered = a contiguous run of key ids at a "
                      "seeded position, random = a seeded random sample (default: clustered)")
    bulk.add_argument("--jobs", type=options.POSITIVE, default=None,
                      help="partitions generated in parallel worker processes; the output does not depend on it "
                      "(default: 1)")
    bulk.add_argument("--progress-interval", type=float, default=None, metavar="SECONDS",
                      help="print a progress line per partition to stderr this often; 0 = only when a partition is "
                      "done (default: 5)")


def run_generate(args: argparse.Namespace) -> int:
    topics = _topics(args.topics)
    codecs = _codecs(args.codecs)
    if args.bulk:
        bulk = _mode_options(args, BULK_ONLY, WORKLOAD_ONLY,
                             "not with --bulk (its single plain producer draws keys by --key-order)")
        return _generate_bulk(args, _bulk_spec(args, topics, codecs[0], bulk), bulk)
    workload = _mode_options(args, WORKLOAD_ONLY, BULK_ONLY, "only with --bulk")
    return _generate_workload(args, _workload_spec(args, topics, codecs, workload))


def _topics(text: str) -> tuple[TopicSpec, ...]:
    from compaction.generate.topics import TopicSpec

    topics = []
    for item in text.split(","):
        name, _, parts = item.strip().partition(":")
        if not name or (parts and not parts.isdigit()):
            raise options.usage(f"--topics: {item!r} is not TOPIC:PARTITIONS")
        topics.append(TopicSpec(name, int(parts or 1)))
    return tuple(topics)


def _codecs(text: str) -> tuple[Codec, ...]:
    from compaction.format.codecs import Codec

    try:
        return tuple(Codec[c.strip().upper()] for c in text.split(","))
    except KeyError as exc:
        raise options.usage(f"--codecs: unknown codec {exc.args[0]!r} (none, gzip, snappy, lz4, zstd)") from None


def _mode_options(args: argparse.Namespace, own: dict[str, Any], other: dict[str, Any], misuse: str) -> dict[str, Any]:
    """The options of one mode, defaults filled in; a usage error names any option of the other mode given."""
    wrong = [options.option_name(dest) for dest in other if getattr(args, dest) is not None]
    if wrong:
        raise options.usage(f"{', '.join(wrong)}: {misuse}")
    return {dest: default if getattr(args, dest) is None else getattr(args, dest) for dest, default in own.items()}


def _records_per_batch(args: argparse.Namespace, default: int) -> int:
    return default if args.records_per_batch is None else int(args.records_per_batch)


def _workload_spec(args: argparse.Namespace, topics: tuple[TopicSpec, ...], codecs: tuple[Codec, ...],
                   mode: dict[str, Any]) -> WorkloadSpec:
    from compaction.generate.workload import WorkloadSpec

    spec = WorkloadSpec(
        topics=topics, records_per_partition=args.records, keys=args.keys, value_bytes=args.value_bytes,
        records_per_batch=_records_per_batch(args, 20), segment_bytes=args.segment_bytes,
        tombstone_ratio=args.tombstone_ratio, codecs=codecs, seed=args.seed, ms_per_record=args.ms_per_record,
        **mode,
    )
    return _clocked(args, spec)


def _bulk_spec(args: argparse.Namespace, topics: tuple[TopicSpec, ...], codec: Codec,
               mode: dict[str, Any]) -> BulkSpec:
    """The validated spec: a ConfigError (exit 2) names the offending options."""
    from compaction.generate.bulk_spec import BulkSpec

    spec = BulkSpec(
        topics=topics, records_per_partition=args.records, keys=args.keys, value_bytes=args.value_bytes,
        records_per_batch=_records_per_batch(args, 100), segment_bytes=args.segment_bytes, codec=codec,
        tombstone_ratio=args.tombstone_ratio, key_order=mode["key_order"],
        update_fraction=mode["update_fraction"], update_spread=mode["update_spread"],
        ms_per_record=args.ms_per_record, seed=args.seed,
    )
    return _clocked(args, spec)


def _clocked(args: argparse.Namespace, spec: Spec) -> Spec:
    """`spec` stamped from --start-ms, or ending at the command's clock."""
    import dataclasses

    if args.start_ms is not None:
        return dataclasses.replace(spec, start_ms=args.start_ms)
    return spec.ending_at(options.now_ms(args))


def _generate_workload(args: argparse.Namespace, spec: WorkloadSpec) -> int:
    from compaction.generate.topics import iter_partitions, topic_ids
    from compaction.generate.workload import generate_partition

    summary = []
    partitions = list(iter_partitions(spec.topics))
    ids = topic_ids(spec.topics, spec.seed)
    for i, (topic, partition) in enumerate(partitions, 1):
        directory = args.logdir / f"{topic}-{partition}"
        truth = generate_partition(directory, spec, topic, partition, ids[topic])
        size = sum(p.stat().st_size for p in directory.glob("*.log"))
        summary.append({"topic": topic, "partition": partition, "segments": len(truth.segment_bases),
                        "log_end_offset": truth.log_end_offset, "bytes": size, "aborted_txns": len(truth.aborted)})
        print(f"[{i}/{len(partitions)}] {topic}-{partition}: {len(truth.segment_bases)} segments, "
              f"{truth.log_end_offset} offsets, {size / 2**20:.1f} MiB", file=sys.stderr)
    total = sum(s["bytes"] for s in summary)
    options.print_result(args.json, {"logdir": str(args.logdir), "partitions": summary},
                 [f"wrote {len(summary)} partitions, {total / 2**20:.1f} MiB of segments to {args.logdir}"])
    return ExitCode.OK


def _generate_bulk(args: argparse.Namespace, spec: BulkSpec, mode: dict[str, Any]) -> int:
    from compaction.generate.bulk import generate_bulk_logdir
    from compaction.generate.bulk_report import print_progress

    jobs, interval = mode["jobs"], mode["progress_interval"]
    if jobs < 1:
        raise options.usage(f"--jobs must be >= 1, got {jobs}")
    if interval < 0:
        raise options.usage(f"--progress-interval must be >= 0, got {interval}")
    summary = generate_bulk_logdir(args.logdir, spec, jobs=jobs, progress=print_progress,
                                   progress_interval_s=interval if interval > 0 else float("inf"))
    options.print_result(args.json, {"logdir": str(args.logdir), "bulk": True, **summary.to_dict()},
                 [f"wrote {summary.line()} to {args.logdir}"])
    return ExitCode.OK
