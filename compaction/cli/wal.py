"""`kcompact wal upload | list | roll`: the active-segment data of a log dir in combined objects (KIP-1176)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compaction.cli import options
from compaction.errors import ExitCode

WAL_HELP = "the recent (active-segment) log in combined objects: upload, list, roll into segments"
WAL_DESCRIPTION = """
The store holds the whole log: tiered segments, and above them the recent data that brokers upload every few
milliseconds as combined objects (KIP-1176), each holding whole record batches of many partitions. `upload` writes
them from a log dir, `list` shows them, `roll` turns them into tiered segments, `kcompact read` reads across both,
and `kcompact gc` deletes an object once tiered segments cover it (or a newer leader epoch truncated it).
"""
UPLOAD_HELP = "upload every batch above what the store holds, from rolled and active segments, in combined objects"
UPLOAD_DESCRIPTION = """
For each <topic>-<partition> of the log dir, upload every batch above the store's log (its tiered end and its WAL
end), packing slices of many partitions into combined objects of at most --max-object-bytes (a bigger batch gets an
object of its own), at batch and leader-epoch boundaries. Kafka's internal partitions (__cluster_metadata-0,
__consumer_offsets-N, ...) are skipped and named. Each group of objects is recorded COPY_SEGMENT_STARTED in
the WAL table (<store>/_kcompact_wal), written under fresh ids, then recorded COPY_SEGMENT_FINISHED: a crash leaves
nothing visible, and a rerun uploads what is missing. A log dir whose leader epochs diverged from the store's (a
newer epoch starting at an offset the store holds under an older one) uploads from the divergence point; one whose
latest epoch is older than the store's (a deposed leader) uploads nothing for that partition (exit 4).
"""
LIST_HELP = "list the combined objects and their entries"
LIST_DESCRIPTION = """
One item per combined object: object_id, uri, size, state, broker_id, created_ms and its entries (topic, partition,
start_offset, end_offset, leader_epoch, start_position, end_position). --topic / --partition keep the objects with an
entry of that topic (partition) and only those entries.
"""
ROLL_HELP = "turn the WAL above each partition's tier into tiered segments (a Spark job), as Kafka rolls a log"
ROLL_DESCRIPTION = """
For each partition with WAL data above its tiered segments, cut the batches into segments as Kafka rolls an active
segment: a new one when the next batch would pass segment.bytes, or when it is more than segment.ms (for a compacted
topic min(segment.ms, max.compaction.lag.ms)) newer than the segment's first batch. The last, open segment stays in
the WAL unless it is full or its first batch is older than that at --now. Every rolled segment is complete (.log,
offset/time/txn indexes, producer snapshot, leader-epoch checkpoint) and is registered in the metadata table under a
fencing epoch per partition, as compaction commits are (the run's epochs in one commit, its segments in one more):
reruns are safe and concurrent runs commit a partition once. Compaction,
verify, read and gc then treat rolled segments like any other. A partition whose WAL object is missing, truncated or
corrupt fails alone (exit 3, naming the object and byte position); the others roll.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "wal", lambda _args: int(ExitCode.CONFIG), WAL_HELP, WAL_DESCRIPTION)
    wal = p.add_subparsers(dest="wal_command", required=True, metavar="WAL_COMMAND")

    up = options.add_command(wal, "upload", run_upload, UPLOAD_HELP, UPLOAD_DESCRIPTION)
    up.add_argument("--logdir", required=True, type=Path, help="a Kafka log dir (one sub-directory per partition)")
    options.add_store_options(up)
    up.add_argument("--broker-id", type=options.NON_NEGATIVE, default=0,
                    help="the broker whose log dir this is (default: 0)")
    up.add_argument("--max-object-bytes", type=options.POSITIVE, default=4 * 1024 * 1024,
                    help="largest combined object (default: 4 MiB)")
    options.add_now_option(up)
    up.add_argument("--dry-run", action="store_true", help="say what would be uploaded; write nothing")
    options.add_json_option(up, "print a machine-readable report")

    rl = options.add_command(wal, "roll", run_roll, ROLL_HELP, ROLL_DESCRIPTION)
    options.add_store_options(rl)
    rl.add_argument("--config", required=True, type=Path,
                    help="YAML config with Kafka topic-level names (see conf/kcompact.yaml)")
    options.add_now_option(rl)
    rl.add_argument("--topic", default=None, help="roll only this topic")
    rl.add_argument("--partition", type=options.NON_NEGATIVE, default=None,
                    help="roll only this partition (with --topic)")
    rl.add_argument("--dry-run", action="store_true", help="cut and report the segments; upload and commit nothing")
    rl.add_argument("--master", default=None, help="Spark master URL (default: local[2])")
    options.add_json_option(rl, "print a machine-readable report")
    rl.add_argument("--report-json", type=Path, default=None,
                    help="also write that report to this file (under spark-submit the driver's stderr progress "
                    "lines share stdout with it)")

    ls = options.add_command(wal, "list", run_list, LIST_HELP, LIST_DESCRIPTION)
    options.add_store_options(ls)
    ls.add_argument("--topic", default=None)
    ls.add_argument("--partition", type=options.NON_NEGATIVE, default=None)
    options.add_json_option(ls, "print JSON")


def run_upload(args: argparse.Namespace) -> int:
    from compaction.tier.logdir import internal_note
    from compaction.wal.upload import upload_logdir

    clock = options.now_ms(args)
    store = options.open_store(args)
    if note := internal_note(args.logdir):
        print(note, file=sys.stderr)
    report = upload_logdir(args.logdir, store, clock, broker_id=args.broker_id, max_object_bytes=args.max_object_bytes,
                           dry_run=args.dry_run, progress=lambda line: print(line, file=sys.stderr))
    doc = {"store": store.uri, "dry_run": args.dry_run, **report.to_dict(), "requests": vars(store.stats)}
    lines = [_upload_line(p.to_dict()) for p in report.partitions]
    verb = "would upload" if args.dry_run else "uploaded"
    total = sum(p.bytes for p in report.partitions if p.status == "uploaded")
    lines.append(f"{verb} {total / 2**20:.2f} MiB of {len(report.partitions)} partitions in {len(report.objects)} "
                 f"combined objects into {store.uri} ({store.stats.puts} PUTs)")
    options.print_result(args.json, doc, lines)
    return report.exit_code


def _partition_line(p: dict[str, Any], failed: str, done: Callable[[dict[str, Any]], str]) -> str:
    """`topic-partition: ...` of a partition's JSON report: its error when it has one (its status `failed`), else
    what `done` says of it."""
    where = f"{p['topic']}-{p['partition']}"
    if p["error"]:
        return f"{where}: {failed} ({p['error_type']}): {p['error']}"
    return f"{where}: {done(p)}"


def _upload_line(p: dict[str, Any]) -> str:
    return _partition_line(p, p["status"].upper(), _uploaded)


def _uploaded(p: dict[str, Any]) -> str:
    if p["status"] == "up_to_date":
        return "up to date"
    diverged = f" (diverged from the store at {p['diverged_at']})" if p["diverged_at"] is not None else ""
    tail = f", {p['incomplete_tail_bytes']} bytes of a batch in progress left" if p["incomplete_tail_bytes"] else ""
    return f"offsets {p['from_offset']}..{p['end_offset'] - 1}, {p['batches']} batches{diverged}{tail}"


def run_roll(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.wal.roll import roll

    if args.partition is not None and args.topic is None:
        raise options.usage("--partition needs --topic")
    clock = options.now_ms(args)
    config = load_config(args.config)
    store = options.open_store(args)
    with options.spark_session(args.master) as spark:
        report = roll(spark, store, config, clock, topic=args.topic, partition=args.partition, dry_run=args.dry_run,
                      progress=lambda o: print(_roll_line(o.to_dict()), file=sys.stderr))
    doc = {"store": store.uri, **report.to_dict(), "requests": vars(store.stats)}
    if args.report_json:
        options.write_atomically(args.report_json, json.dumps(doc, indent=2))
    verb = "would roll" if args.dry_run else "rolled"
    ok = [p for p in report.partitions if p.error is None]
    lines = [_roll_line(p.to_dict()) for p in report.partitions]
    lines.append(f"{verb} {sum(len(p.new_segments) for p in ok)} segments "
                 f"({sum(p.rolled_bytes for p in ok) / 2**20:.2f} MiB) of {len(report.partitions)} partitions with WAL "
                 f"data; exit {report.exit_code}")
    options.print_result(args.json, doc, lines)
    return report.exit_code


def _roll_line(p: dict[str, Any]) -> str:
    return _partition_line(p, "FAILED", _rolled)


def _rolled(p: dict[str, Any]) -> str:
    segs = p["segments"]
    rolled = f"{len(segs)} segments, offsets {segs[0]['start_offset']}..{segs[-1]['end_offset']}" if segs else \
        "nothing to roll"
    tail = f"open tail {p['open_tail_batches']} batches ({p['open_tail_bytes']} bytes) stays in the WAL"
    return f"{rolled}; {tail}"


def run_list(args: argparse.Namespace) -> int:
    from compaction.wal.table import WalTable

    store = options.open_store(args)
    items = []
    for o in WalTable.in_store(store).objects():
        doc = o.to_dict(store.object_uri(o.key))
        doc["entries"] = [e for e in doc["entries"] if _wanted(e, args)]
        if doc["entries"] or (args.topic is None and args.partition is None):
            items.append(doc)
    options.print_result(args.json, items, _list_lines(items))
    return ExitCode.OK


def _wanted(entry: dict[str, Any], args: argparse.Namespace) -> bool:
    return (args.topic is None or entry["topic"] == args.topic) and (
        args.partition is None or entry["partition"] == args.partition)


def _list_lines(items: list[dict[str, Any]]) -> list[str]:
    lines = []
    for o in items:
        lines.append(f"{o['object_id']}  {o['state']:<23} {o['size']:>10} bytes  broker {o['broker_id']}  "
                     f"created {o['created_ms']}  {o['uri']}")
        for e in o["entries"]:
            lines.append(f"    {e['topic']}-{e['partition']}  offsets {e['start_offset']}..{e['end_offset']}  "
                         f"epoch {e['leader_epoch']}  bytes [{e['start_position']}, {e['end_position']})")
    return [*lines, f"{len(items)} combined objects"]
