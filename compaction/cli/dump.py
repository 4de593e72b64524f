"""`kcompact dump`: Kafka's log files printed like kafka-dump-log.sh, or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from compaction.cli import options
from compaction.errors import ExitCode

DUMP_HELP = "print the contents of Kafka log files, like kafka-dump-log.sh"
DUMP_DESCRIPTION = """
Print batches and records of a .log, or the entries of a .index, .timeindex, .txnindex, .snapshot,
leader-epoch-checkpoint or partition.metadata file. CRCs are checked and reported (isvalid); a malformed file fails
with exit code 3 naming the byte position. The text is what Kafka's kafka-dump-log.sh prints for the same files
(--deep-iteration; with --print-data, its --print-data-log), line for line on stdout, and so is its stderr report
of non-consecutive record offsets (every compacted log has gaps); leader-epoch-checkpoint and partition.metadata,
which Kafka's tool does not read, are kcompact's own, and so is an .indexes object (the files of a segment kcompact
wrote, in one object): its parts' kinds, positions and sizes.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "dump", run_dump, DUMP_HELP, DUMP_DESCRIPTION)
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files to dump")
    p.add_argument("--print-data", action="store_true", help="also print keys, values and headers")
    options.add_json_option(p, "one JSON document per file (keys/values base64)")


def run_dump(args: argparse.Namespace) -> int:
    from compaction.dump import dump_path, format_doc, gaps_report

    docs = []
    for path in args.paths:
        doc = dump_path(path, print_data=args.print_data)
        if args.json:
            print(json.dumps(doc))
        else:
            for line in format_doc(doc, print_data=args.print_data):
                print(line)
            docs.append(doc)
    for line in gaps_report(docs):  # after every file, on stderr, as kafka-dump-log --deep-iteration
        print(line, file=sys.stderr)
    return ExitCode.OK
