"""`kcompact verify`: did compaction keep every key's latest value between two metadata table versions?"""

from __future__ import annotations

import argparse
from pathlib import Path

from compaction.cli import options
from compaction.errors import ExitCode

VERIFY_HELP = "check that compaction kept every key's latest value between two metadata table versions"
VERIFY_DESCRIPTION = """
Compare a partition's latest-per-key view (read_committed; keys ranked by the topic's compaction.strategy if
--config is given, else by offset) at metadata table version --before (Delta time travel) with --after (default: the
latest), below --before's log end. The only change allowed is a tombstone below the cleaner offset dropped at or
after its delete horizon (deleteHorizonMs, by the clock of the run that dropped it); any other lost, changed or new
key, and any change at or above the cleaner offset, fails with exit code 5 and lists the keys. Run it before
`kcompact gc` deletes the segments the --before version points at. Reads only. The comparison runs on Spark
(executors read the segments, the driver receives only the problem keys, so its memory does not grow with the key
count); --reference compares on this process instead (the readable reference path; holds the partition's keys in
memory, fine for a spot check of a small partition). A partition the metadata table does not hold (at --after, or at
--before: a version older than its first tiering) is exit code 2, never a pass. For a topic whose --config says
compact,delete, keys whose latest record lay below the --after log start expired with retention (`kcompact expire`)
and pass; without that config a moved log start fails like any other loss.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "verify", run_verify, VERIFY_HELP, VERIFY_DESCRIPTION)
    options.add_partition_options(p)
    p.add_argument("--before", required=True, type=options.NON_NEGATIVE, metavar="VERSION",
                   help="the earlier metadata table version, e.g. a run report's metadata_version_planned")
    p.add_argument("--after", type=options.NON_NEGATIVE, default=None, metavar="VERSION",
                   help="the later metadata table version (default: the latest)")
    p.add_argument("--config", type=Path, default=None,
                   help="kcompact YAML config: the topic's compaction.strategy ranks a key's records")
    p.add_argument("--max-keys", type=options.NON_NEGATIVE, default=20,
                   help="keys listed in the text output (default: %(default)s)")
    p.add_argument("--master", default=None, help="Spark master URL (default: local[2])")
    p.add_argument("--reference", action="store_true", help="compare without Spark, on this process")
    options.add_json_option(p, "print the verdict and every problem key as JSON")


def run_verify(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.verify import verify_partition

    config = load_config(args.config).for_topic(args.topic) if args.config is not None else None
    store = options.open_store(args)
    if args.reference:
        report = verify_partition(store, args.topic, args.partition, args.before, args.after, config=config)
    else:
        with options.spark_session(args.master) as spark:
            report = verify_partition(store, args.topic, args.partition, args.before, args.after, config=config,
                                      spark=spark)
    options.print_result(args.json, {"store": args.store, **report.to_dict()}, report.render_text(args.max_keys))
    return ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED
