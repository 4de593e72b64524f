"""`kcompact segments` and `kcompact read`: a partition's live remote segments, and what a consumer reads."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from compaction.cli import options
from compaction.errors import ExitCode

VERSION_HELP = "metadata table version to read (time travel)"

SEGMENTS_HELP = "list the live remote segments of a partition"
SEGMENTS_DESCRIPTION = """
The live (COPY_SEGMENT_FINISHED) segments of a partition according to the metadata table, with start and end
offsets, size, state, leader epochs and the URI of the .log object. Tiered segments only: the WAL tail is listed
by `kcompact wal list`.
"""
READ_HELP = "print what a consumer of a partition would receive, as JSON lines"
READ_DESCRIPTION = """
Read a partition from its live remote segments and then its WAL tail (combined objects uploaded by `kcompact wal
upload`, read with ranged GETs of just the partition's bytes) in offset order, as a consumer would: one JSON object
per record,
{offset, timestamp, key, value, headers: [{key, value}]}, with key, value and header values base64-encoded (null
stays null). Control records are not emitted. read_committed stops at the last stable offset, as a Kafka consumer
does: the first offset of the earliest transaction still open at the end of the log (tier or WAL tail), or the log
end when none is open; below it, it drops records of aborted transactions. So --from-offset at or past the last
stable offset prints nothing (exit 0), and committed records written after a transaction still open appear only
once it commits or aborts. read_uncommitted reads to the log end. A partition the store does not hold (no
metadata row and no WAL object names it) is exit code 2, as Kafka answers UNKNOWN_TOPIC_OR_PARTITION, not an empty
read.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "segments", run_segments, SEGMENTS_HELP, SEGMENTS_DESCRIPTION)
    options.add_partition_options(p)
    p.add_argument("--version", type=options.NON_NEGATIVE, default=None, help=VERSION_HELP)
    options.add_json_option(p, "print JSON")

    p = options.add_command(sub, "read", run_read, READ_HELP, READ_DESCRIPTION)
    options.add_partition_options(p)
    p.add_argument("--from-offset", type=options.NON_NEGATIVE, default=0, help="first offset to return (default: 0)")
    p.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"],
                   help="consumer isolation.level (default: %(default)s, as in Kafka)")
    p.add_argument("--version", type=options.NON_NEGATIVE, default=None, help=VERSION_HELP)


def run_segments(args: argparse.Namespace) -> int:
    from compaction.metadata import ObjectSuffix
    from compaction.wal.view import partition_log

    store = options.open_store(args)
    tier, _log = partition_log(store, args.topic, args.partition, metadata_version=args.version)  # known, or exit 2
    segments = tier.live_segments if tier is not None else ()
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
    options.print_result(args.json, rows, _segment_table(rows))
    return ExitCode.OK


def _segment_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'start_offset':>14} {'end_offset':>14} {'size':>12}  {'state':<22} leader_epochs  log"]
    for r in rows:
        epochs = ",".join(f"{k}@{v}" for k, v in r["leader_epochs"].items())
        lines.append(f"{r['start_offset']:>14} {r['end_offset']:>14} {r['size']:>12}  {r['state']:<22} "
                     f"{epochs:<13}  {r['log_uri']}")
    return [*lines, f"{len(rows)} live segments"]


def run_read(args: argparse.Namespace) -> int:
    from compaction.reader import Isolation, consumer_batches, log_refs, row_json

    store = options.open_store(args)
    refs = log_refs(store, args.topic, args.partition, args.version)
    out = sys.stdout
    for batch in consumer_batches(store, refs, from_offset=args.from_offset, isolation=Isolation.parse(args.isolation)):
        out.writelines(json.dumps(row_json(row)) + "\n" for row in batch.to_pylist())
    return ExitCode.OK
