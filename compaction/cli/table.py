"""`kcompact table`: keep a Delta table of a compacted topic's latest value per key, updated incrementally."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compaction.cli import options

TABLE_HELP = "keep a Delta table with the latest value per key of a topic (incremental, exactly once)"
TABLE_DESCRIPTION = """
Maintain a Delta table at --table (a local path or s3://bucket/prefix/name) holding one row per live key of
--topic: key, value, partition, offset, timestamp, headers, and the record's version under the timestamp and
header strategies. The winner of a key follows the topic's compaction.strategy from --config (ties go to the
higher offset); keys whose winner is a tombstone are absent. Only committed records (read_committed) below each
partition's last stable offset are applied. Each run applies what arrived since the previous one, on Spark (an
update of at most 512 MiB of new segments and table files in the driver's own process, with no Spark job), and
records the offsets it applied in the same Delta commit as the data: a crash and a rerun give what a rebuild
gives, and of two concurrent runs one fails with exit code 4 (rerun it). A partition whose log start passed the
table, or that was compacted past the table after delete.retention.ms (a tombstone may be gone), is rebuilt from
offset 0. --rebuild rebuilds every partition. An update writes the changed keys' winners as new files and marks
their old rows deleted with Delta deletion vectors (the first update turns on the table's deletionVectors feature,
in the commit of its data); a file past a fifth deleted is rewritten without them instead. Each run that writes
also removes the rows of partitions the store no longer has, compacts a partition split into many small files
(OPTIMIZE) and vacuums files removed, and deletion vector files unused, longer ago than the table's
delta.deletedFileRetentionDuration (one week by default). The table opens with delta-rs (DeltaTable.scan), DuckDB
or Spark (delta-spark); delta-rs's to_pyarrow_table reads no deletion vectors and refuses it. A table whose protocol
another writer moved past what kcompact implements (a table feature other than deletionVectors, such as rowTracking
or domainMetadata, or appendOnly, change data feed, constraints, invariants, generated columns or column mapping in
use) is refused with exit code 2, naming the features, before anything is read or written.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "table", run_table, TABLE_HELP, TABLE_DESCRIPTION)
    options.add_store_options(p)
    p.add_argument("--config", type=Path, required=True,
                   help="kcompact YAML config: the topic's compaction.strategy and delete.retention.ms")
    p.add_argument("--topic", required=True)
    p.add_argument("--table", required=True, help="Delta table URI: a local path or s3://bucket/prefix/name")
    options.add_now_option(p, "the run's clock (recorded with the applied offsets)")
    p.add_argument("--rebuild", action="store_true", help="rebuild every partition from offset 0")
    p.add_argument("--dry-run", action="store_true", help="print what would be applied; write nothing")
    p.add_argument("--master", default=None, help="Spark master URL (default: local[2])")
    options.add_json_option(p, "print a machine-readable report")


def run_table(args: argparse.Namespace) -> int:
    from compaction.config import load_config
    from compaction.progress import Progress
    from compaction.topic_table import Location, TopicTable, update_table

    config = load_config(args.config)
    clock = options.now_ms(args)
    store = options.open_store(args)
    location = Location.parse(args.table, endpoint_url=args.endpoint_url)
    topic = config.for_topic(args.topic)
    # a table another writer moved past what kcompact implements is refused before Spark starts (exit 2); the run
    # checks it again where it opens the table
    TopicTable(location, args.topic, topic.compaction_strategy, topic.compaction_strategy_header).check_protocol()
    progress = Progress(sys.stderr)
    with options.spark_session(args.master, progress) as spark:
        report = update_table(spark, store, config, args.topic, location, clock, rebuild=args.rebuild,
                              dry_run=args.dry_run, progress=progress)
    options.print_result(args.json, report.to_dict(), report.summary())
    return report.exit_code
