#!/usr/bin/env bash
# `make demo`: generate a realistic Kafka log dir, tier it into ./kcompact-store, look at it,
# then plan and compact it on Spark local[2], print the report and verify every compacted partition.
# The demo reads the clock once: the generated log ends at NOW (epoch ms) and tier, plan and compact run at NOW
# (`NOW=1795000000000 make demo` replays a given clock; the same NOW generates the same log dir).
set -euo pipefail
cd "$(dirname "$0")/.."
KC=${KC:-.venv/bin/kcompact}
PY=${PY:-.venv/bin/python}
LOGDIR=${LOGDIR:-demo-logdir}
STORE=${STORE:-./kcompact-store}
NOW=${NOW:-$($PY -c 'import time; print(int(time.time() * 1000))')}

echo "== 1. generate a log dir ending now ($NOW): 3 topics, 5 partitions, every codec, transactions, tombstones"
rm -rf "$LOGDIR"
$KC generate --logdir "$LOGDIR" --topics orders:2,users:2,inventory:1 --records 30000 --keys 3000 --now "$NOW"

echo
echo "== 2. one segment, as kafka-dump-log would print it"
$KC dump "$LOGDIR/orders-0/00000000000000000000.log" | head -6
$KC dump "$LOGDIR/orders-0/leader-epoch-checkpoint"

echo
echo "== 3. tier every rolled segment into $STORE (a rerun copies nothing new)"
$KC tier --logdir "$LOGDIR" --store "$STORE" --now "$NOW"
$KC tier --logdir "$LOGDIR" --store "$STORE" --now "$NOW"

echo
echo "== 3b. upload the active segments too, as combined WAL objects (KIP-1176): the store now holds the whole log"
$KC wal upload --logdir "$LOGDIR" --store "$STORE" --now "$NOW" --max-object-bytes 262144
$KC wal list --store "$STORE" --topic orders --partition 0 | tail -3

echo
echo "== 4. the live remote segments of orders-0, from the Delta metadata table"
$KC segments --store "$STORE" --topic orders --partition 0 | tail -4

echo
echo "== 5. read orders-0 back as a consumer would: the tiered segments, then the WAL tail (ranged GETs)"
uncommitted=$($KC read --store "$STORE" --topic orders --partition 0 | wc -l)
committed=$($KC read --store "$STORE" --topic orders --partition 0 --isolation read_committed | wc -l)
echo "read_uncommitted: $uncommitted records; read_committed: $committed records (aborted transactions dropped)"
$KC read --store "$STORE" --topic orders --partition 0 --from-offset 100 | head -1

echo
echo "== 6. plan: what compaction would do, and why (conf/kcompact.yaml)"
$KC plan --store "$STORE" --config conf/kcompact.yaml --now "$NOW"

echo
echo "== 7. compact on Spark local[2]: stage (rewrite + upload) and commit the swap atomically"
$KC compact --store "$STORE" --config conf/kcompact.yaml --now "$NOW" --report-json kcompact-report.json \
    --html-report kcompact-report.html --metrics-file kcompact.prom

echo
echo "== 8. orders-0 after compaction: same latest value per key, fewer segments and bytes"
$KC segments --store "$STORE" --topic orders --partition 0 | tail -2
after=$($KC read --store "$STORE" --topic orders --partition 0 --isolation read_committed | wc -l)
echo "read_committed: $committed records before, $after after"

echo
echo "== 9. a rerun finds nothing to do"
$KC compact --store "$STORE" --config conf/kcompact.yaml --now "$NOW" | tail -1

echo
echo "== 10. verify: every compacted partition keeps its latest value per key (Delta time travel to the plan's version)"
planned=$($PY -c 'import json; print(json.load(open("kcompact-report.json"))["metadata_version_planned"])')
$PY -c 'import json
for p in json.load(open("kcompact-report.json"))["partitions"]:
    if p["committed"]:
        print(p["topic"], p["partition"])' |
while read -r topic partition; do
    # --reference: these partitions are small, so compare on this process instead of starting Spark five times;
    # at scale `kcompact verify` (without it) runs the comparison on Spark with a flat driver
    $KC verify --store "$STORE" --topic "$topic" --partition "$partition" --before "$planned" --config conf/kcompact.yaml \
        --reference
done

echo
echo "== 11. the run's HTML report and Prometheus metrics"
echo "open kcompact-report.html in a browser (self-contained, works offline); kcompact.prom:"
grep -E '^kcompact_(max_compaction_delay_secs|max_dirty_percent|uncleanable_partitions_count|bytes_(read|written)_total|duration_seconds) ' kcompact.prom

echo
echo "== 12. a week later (segment.ms): wal roll turns the WAL tails into tiered segments, compact cleans them, gc"
echo "   deletes the combined objects the rolled segments now cover"
LATER=$((NOW + 604800001))
$KC wal roll --store "$STORE" --config conf/kcompact.yaml --now "$LATER" | tail -3
$KC compact --store "$STORE" --config conf/kcompact.yaml --now "$LATER" | tail -1
$KC gc --store "$STORE" --config conf/kcompact.yaml --now "$((LATER + 60000))" | tail -2
final=$($KC read --store "$STORE" --topic orders --partition 0 --isolation read_committed | wc -l)
echo "read_committed orders-0: $final records, all from tiered segments now"

echo
echo "== 13. the topic as a Delta table: one row per live key (kcompact table), read back with delta-rs"
rm -rf ./kcompact-tables/orders
$KC table --store "$STORE" --config conf/kcompact.yaml --topic orders --table ./kcompact-tables/orders --now "$LATER" | tail -1
$PY -c 'import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
rows = pa.table(QueryBuilder().register("orders", DeltaTable("kcompact-tables/orders")).execute(
    "SELECT * FROM orders ORDER BY key").read_all())
print(rows.num_rows, "live keys; the first three:")
for r in rows.slice(0, 3).to_pylist():
    print(" ", r["key"].decode(errors="replace"), "=", r["value"][:40], "partition", r["partition"], "offset", r["offset"])'
