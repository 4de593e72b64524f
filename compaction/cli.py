"""The `kcompact` command line. It parses arguments, reads the clock and the environment, and calls one function.

Exit codes (see `compaction.errors.ExitCode`): 0 success or nothing to do, 1 internal error, 2 configuration
or usage error, 3 corrupt input, 4 fenced or conflicting commit (a rerun is safe).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from compaction.errors import ExitCode, KcompactError

EPILOG = """exit codes:
  0  success (or nothing to do)
  1  internal error (a bug: please report it with the traceback)
  2  configuration or usage error: fix the config or the command line
  3  corrupt input: the named object is malformed (the partition is quarantined)
  4  fenced or conflicting commit: nothing was committed, rerunning is safe
"""


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="write a realistic Kafka log dir (segments, indexes, snapshots) for demos, tests and benchmarks",
        description="Generate a Kafka log directory: several topics and partitions, rolled segments plus an "
        "active one, skewed key updates, tombstones, idempotent and transactional producers (some transactions "
        "aborted), every codec, a `version` header, out-of-order timestamps and leader epoch changes. "
        "The output is a pure function of the options (the seed included).",
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
        "--key-skew", type=float, default=1.1, help="Zipf exponent of key popularity (default: %(default)s)"
    )
    p.add_argument(
        "--value-bytes", type=int, default=100, help="approximate value size (default: %(default)s)"
    )
    p.add_argument(
        "--records-per-batch", type=int, default=20, help="mean records per batch (default: %(default)s)"
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
        default=0.25,
        help="chance that a producer is transactional (default: %(default)s)",
    )
    p.add_argument(
        "--abort-ratio", type=float, default=0.3, help="share of aborted transactions (default: %(default)s)"
    )
    p.add_argument(
        "--codecs",
        default="none,gzip,snappy,lz4,zstd",
        help="codecs the producers use, round robin (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    p.add_argument(
        "--start-ms",
        type=int,
        default=1_700_000_000_000,
        help="timestamp of the first record (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
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
    spec = WorkloadSpec(
        topics=tuple(topics),
        records_per_partition=args.records,
        keys=args.keys,
        key_skew=args.key_skew,
        value_bytes=args.value_bytes,
        records_per_batch=args.records_per_batch,
        segment_bytes=args.segment_bytes,
        tombstone_ratio=args.tombstone_ratio,
        transactional_ratio=args.transactional_ratio,
        abort_ratio=args.abort_ratio,
        codecs=codecs,
        seed=args.seed,
        start_ms=args.start_ms,
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


def _usage(message: str) -> KcompactError:
    from compaction.errors import ConfigError

    return ConfigError(message)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_generate, _add_dump]


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


if __name__ == "__main__":
    sys.exit(main())
