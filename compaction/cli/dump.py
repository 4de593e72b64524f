"""`kcompact dump`: Kafka's log files printed like kafka-dump-log.sh, or as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from compaction.cli.options import Subcommands
from compaction.errors import ExitCode


def register(sub: Subcommands) -> None:
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
    p.set_defaults(func=run_dump)


def run_dump(args: argparse.Namespace) -> int:
    from compaction.dump import dump_path, format_doc

    for path in args.paths:
        doc = dump_path(path, print_data=args.print_data)
        if args.json:
            print(json.dumps(doc))
        else:
            for line in format_doc(doc, print_data=args.print_data):
                print(line)
    return ExitCode.OK
