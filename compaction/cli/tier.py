"""`kcompact tier`: copy the rolled segments of a Kafka log dir into the store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from compaction.cli import options
from compaction.errors import worst_exit_code

if TYPE_CHECKING:
    from compaction.tier import PartitionTierResult

TIER_HELP = "copy the rolled segments of a Kafka log dir into the store (like KIP-405's copy path)"
TIER_DESCRIPTION = """
Copy every rolled segment (all but the active, highest one) of each <topic>-<partition> directory into the store
(Kafka's internal partitions, such as __cluster_metadata-0 and __consumer_offsets-N, are skipped and named),
with its offset/time indexes (rebuilt when missing or inconsistent), transaction index, producer snapshot and
leader-epoch checkpoint. Each segment is uploaded under a fresh segment id, then recorded COPY_SEGMENT_FINISHED in
the metadata table, for all partitions together: one metadata commit per GiB uploaded, whatever the partition
count. A crash before that commit leaves objects no row names, which `kcompact gc` deletes once older than its
orphan grace. A rerun copies only what is new. A partition with corrupt input is
reported (exit 3) and nothing of it becomes live; the other partitions are still tiered.
"""


def register(sub: options.Subcommands) -> None:
    p = options.add_command(sub, "tier", run_tier, TIER_HELP, TIER_DESCRIPTION)
    p.add_argument("--logdir", required=True, type=Path, help="a Kafka log dir (one sub-directory per partition)")
    options.add_store_options(p)
    options.add_now_option(p)
    options.add_json_option(p, "print a machine-readable report")


def _progress(i: int, n: int, r: PartitionTierResult) -> None:
    state = f"FAILED: {r.error}" if r.error else (
        f"copied {len(r.copied)} segments ({r.bytes_copied / 2**20:.1f} MiB), {r.already_tiered} already tiered")
    print(f"[{i}/{n}] {r.topic}-{r.partition}: {state}", file=sys.stderr)


def run_tier(args: argparse.Namespace) -> int:
    from compaction.metadata import table_in_store, table_requests
    from compaction.tier import internal_note, tier_logdir

    clock = options.now_ms(args)
    store = options.open_store(args)
    if note := internal_note(args.logdir):
        print(note, file=sys.stderr)
    before = table_requests(store)
    results = tier_logdir(args.logdir, store, table_in_store(store, create=True), clock, progress=_progress)
    table = table_requests(store) - before
    copied = sum(len(r.copied) for r in results)
    options.print_result(
        args.json,
        {"store": store.uri, "partitions": [r.to_dict() for r in results], "requests": vars(store.stats),
         "metadata_requests": vars(table)},
        [f"tiered {copied} segments of {len(results)} partitions into {store.uri} "
         f"({sum(r.bytes_copied for r in results) / 2**20:.1f} MiB; {store.stats.puts} PUTs; the metadata table "
         f"{table.puts} PUTs)"],
    )
    return worst_exit_code(results)
