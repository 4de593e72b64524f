"""`kcompact expire`: time and size retention (retention.ms, retention.bytes) of `compact,delete` topics."""

from __future__ import annotations

import argparse
from pathlib import Path

from compaction.cli import options
from compaction.errors import ExitCode

EXPIRE_HELP = "apply retention.ms and retention.bytes to compact,delete topics (their objects go with gc)"
EXPIRE_DESCRIPTION = """
Apply each compact,delete topic's retention.ms and retention.bytes to its tiered segments, as Kafka's
UnifiedLog.deleteOldSegments does after cleaning such a log, in two passes from the oldest live segment up, each
stopping at the first segment it keeps: by size, a segment expires while the partition stays at or above
retention.bytes without it; then by time, while now - its largest timestamp > retention.ms. The partition's last
segment never expires (it marks where the tier ends and the WAL's part of the log begins), retention.bytes counts
tiered segments only, and a segment whose batches carry no timestamp is aged from when it went live. Defaults are
Kafka's: retention.ms 604800000 (7 days), retention.bytes -1 (no limit); -1 turns a rule off.

Expiring is one metadata commit for every partition in scope (the segments go to DELETE_SEGMENT_STARTED and the log
start offset moves up to the first segment left, each partition decided again on its latest rows); readers stop
serving them at once and `kcompact gc` deletes their objects after file.delete.delay.ms. Topics whose cleanup.policy
is compact or delete are never touched: a plain delete topic's retention is the broker's. Nor is a partition a
broker tiers through kcompact's plugins (noted in the report): a broker's log start does not follow kcompact's
expiry; set retention on the broker's topic there. Idempotent: a rerun expires nothing more until the clock or the
log moves. A partition whose commit kept losing to concurrent commits exits 4 (rerun); the others are expired.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "expire", run_expire, EXPIRE_HELP, EXPIRE_DESCRIPTION)
    options.add_store_options(p)
    p.add_argument("--config", required=True, type=Path,
                   help="kcompact YAML config: the topics whose cleanup.policy is compact,delete, and their retention")
    options.add_now_option(p, "the run's clock")
    options.add_topic_scope(p)
    p.add_argument("--dry-run", action="store_true", help="report what would expire; change nothing")
    options.add_json_option(p, "print a machine-readable report")


def run_expire(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.metadata import table_in_store
    from compaction.retention import expire

    scope = options.topic_scope(args)
    config = load_config(args.config)
    store = options.open_store(args)
    report = expire(table_in_store(store), config, options.now_ms(args), **scope, dry_run=args.dry_run)
    options.print_result(args.json, {"store": store.uri, **report.to_dict(), "requests": vars(store.stats)},
                         report.summary().splitlines())
    return ExitCode.OK
