"""`kcompact gc`: delete the objects of replaced, abandoned and orphaned segments once past their grace."""

from __future__ import annotations

import argparse
from pathlib import Path

from compaction.cli import options
from compaction.errors import ExitCode

GC_HELP = ("delete the objects of replaced, abandoned and orphaned segments, and combined WAL objects no longer "
           "needed, once past their grace period")
GC_DESCRIPTION = """
Garbage-collect the store, metadata first. Segments in DELETE_SEGMENT_STARTED (replaced by a compaction) for longer
than the grace (file.delete.delay.ms) lose their objects, then are recorded DELETE_SEGMENT_FINISHED. Copies stuck
in COPY_SEGMENT_STARTED for longer than the grace (a broker's that died between its add and its finish) are retired
and deleted the same way; zombie rows are retired now and deleted a grace later. Objects under segment keys that no
metadata row references (uploads of failed, fenced or crashed runs and tier batches) are deleted once older than the
orphan grace. Combined WAL objects (`kcompact wal upload`) are deleted once no entry of theirs is needed any more
(tiered segments cover it, a newer leader epoch truncated it, or another copy serves it), the grace after that
moment; uploads abandoned in COPY_SEGMENT_STARTED likewise; the WAL table's rows of objects deleted over a day ago
are dropped. The metadata table's own upkeep follows: log entries older than its retention expire (one day), and
its data files that no version of that day names are deleted (each run replaces two per partition). Live
segments, the tables' current files, combined objects still needed and keys that are not segment keys are never
touched. Each metadata step (retiring, recording the deletions) is one commit for every partition; a partition that
keeps changing under gc is left for the next run (exit 4). Objects go in batches: on S3 one DeleteObjects request per
thousand keys (the IAM permission is still s3:DeleteObject). Idempotent: a rerun, also after a crash, converges.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "gc", run_gc, GC_HELP, GC_DESCRIPTION)
    options.add_store_options(p)
    options.add_now_option(p)
    p.add_argument("--config", type=Path, default=None,
                   help="kcompact YAML config: each topic's grace is its file.delete.delay.ms")
    p.add_argument("--grace-ms", type=int, default=None,
                   help="grace for every topic, overriding --config (default: file.delete.delay.ms, 60000)")
    p.add_argument("--orphan-grace-ms", type=int, default=None,
                   help="minimum age of an unreferenced object before it is deleted; keep it above the longest "
                   "upload-to-commit time of a compaction run (default: 86400000, one day)")
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted; change nothing")
    options.add_json_option(p, "print a machine-readable report")


def run_gc(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.gc import DEFAULT_GRACE_MS, DEFAULT_ORPHAN_GRACE_MS, GraceMs, collect_garbage
    from compaction.metadata import table_in_store, table_requests

    if any(v is not None and v < 0 for v in (args.grace_ms, args.orphan_grace_ms)):
        raise options.usage("--grace-ms and --orphan-grace-ms must be >= 0")
    config = load_config(args.config) if args.config is not None else None

    def topic_grace(topic: str) -> int:
        return config.for_topic(topic).file_delete_delay_ms if config else DEFAULT_GRACE_MS

    grace: GraceMs = args.grace_ms if args.grace_ms is not None else topic_grace
    orphan_grace = args.orphan_grace_ms if args.orphan_grace_ms is not None else DEFAULT_ORPHAN_GRACE_MS
    clock = options.now_ms(args)
    store = options.open_store(args)
    before = table_requests(store)
    report = collect_garbage(store, table_in_store(store), clock, grace_ms=grace, orphan_grace_ms=orphan_grace,
                             dry_run=args.dry_run)
    options.print_result(args.json, {"store": store.uri, **report.to_dict(), "requests": vars(store.stats),
                                     "metadata_requests": vars(table_requests(store) - before)},
                         report.summary())
    return ExitCode.OK
