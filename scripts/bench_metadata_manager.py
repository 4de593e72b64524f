"""The broker's metadata process at scale, driven directly (issue 41 item 5's simulation): a table of N partitions with
S live segments each, one `compaction.remote_log_metadata` tier answering the calls a broker leading all of them
makes, timed per call.

    python scripts/bench_metadata_manager.py --partitions 1000 --segments 50 [--s3] [--rounds 200] [--add-update]

What it does, in one process (the metadata process's own code, `answer` on request lines, as the pipe feeds it):
1. builds the table through kcompact's batched commit path (`commit_current_batch`, 1,000 partitions a commit);
2. starts the tier (`RemoteTier.of`: the follower's first read of the log) and asks `segments` for every partition
   once, as a broker that just became leader of all of them does (the plugin then answers reads from memory);
3. runs `--rounds` RLM copy rounds: each the `copy` of the next segment of a random partition, the one request the
   plugin sends for Kafka's `RemoteLogManager.copyLogSegment` (or, with `--add-update`, an `add` then an `update` to
   COPY_SEGMENT_FINISHED: what a plugin older than `copy` sends), and every 10th round a `follow` after another
   writer (a compaction, gc) committed to 10 other partitions through its own table handle;
4. prints p50 / p99 / max per call kind, as a markdown row per kind.

With `--s3` the store is a bucket on a moto server started here on 127.0.0.1 (tests/moto_s3.py's bucket and fake
credentials).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compaction.format.checkpoints import EpochEntry
from compaction.metadata import (
    ChangeSet,
    NewSegment,
    ObjectKey,
    PartitionSnapshot,
    TopicPartition,
    commit_current_batch,
    table_in_store,
)
from compaction.remote_log_metadata import RemoteTier, answer
from compaction.storage import open_store
from compaction.storage.layout import Suffix

TOPIC, TOPIC_ID = "changelog", "MWJ6FHTfRYy67jzwZdeqSQ"
SEGMENT_RECORDS = 1000


def _segment_id(partition: int, index: int) -> str:
    import base64
    raw = partition.to_bytes(8, "big") + index.to_bytes(8, "big")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _segments(partition: int, count: int) -> tuple[NewSegment, ...]:
    return tuple(
        NewSegment(segment_id=_segment_id(partition, i), start_offset=i * SEGMENT_RECORDS,
                   end_offset=(i + 1) * SEGMENT_RECORDS - 1, max_timestamp_ms=1_700_000_000_000 + i,
                   segment_leader_epochs=(EpochEntry(0, i * SEGMENT_RECORDS),), segment_size_bytes=1 << 20,
                   object_keys=(ObjectKey(Suffix.LOG, f"{TOPIC}/{partition}/{i}.log"),))
        for i in range(count))


def build(table: Any, partitions: int, segments: int) -> float:
    started = time.perf_counter()
    for first in range(0, partitions, 1000):
        tps = [TopicPartition(TOPIC, p) for p in range(first, min(partitions, first + 1000))]

        def plan(tp: TopicPartition) -> Callable[[PartitionSnapshot], ChangeSet]:
            return lambda current: ChangeSet.planned_from(current, fencing_epoch=0, writer="broker-1",
                                                          new_segments=_segments(tp.partition, segments),
                                                          topic_id=TOPIC_ID)

        outcomes = commit_current_batch(table, {tp: plan(tp) for tp in tps}, 1)
        failed = [o for o in outcomes.values() if isinstance(o, Exception)]
        if failed:
            raise failed[0]
    return time.perf_counter() - started


def run(store_uri: str, partitions: int, segments: int, rounds: int, seed: int,
        endpoint: str | None, add_update: bool = False) -> dict[str, list[float]]:
    store = open_store(store_uri, endpoint_url=endpoint)
    table = table_in_store(store, create=True)
    print(f"building {partitions} partitions x {segments} segments ...", file=sys.stderr)
    print(f"built in {build(table, partitions, segments):.1f} s, table version {table.version()}", file=sys.stderr)
    times: dict[str, list[float]] = defaultdict(list)

    started = time.perf_counter()
    tier = RemoteTier.of(table, store)
    times["start"].append(time.perf_counter() - started)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        began = time.perf_counter()
        answered = answer(tier, json.dumps(request))
        times[request["op"]].append(time.perf_counter() - began)
        if not answered["ok"]:
            raise RuntimeError(answered)
        return answered["result"]

    base = {"topic": TOPIC, "topic_id": TOPIC_ID, "broker_id": 1}
    for p in range(partitions):
        ask({"op": "segments", **base, "partition": p})
    rng = random.Random(seed)
    next_index = dict.fromkeys(range(partitions), segments)
    other = table_in_store(store)
    version = tier.follower.version
    for r in range(rounds):
        p = rng.randrange(partitions)
        i = next_index[p]
        next_index[p] += 1
        segment_id = _segment_id(p, i)
        add = {"op": "add", **base, "partition": p, "segment_id": segment_id, "start_offset": i * SEGMENT_RECORDS,
               "end_offset": (i + 1) * SEGMENT_RECORDS - 1, "max_timestamp_ms": 1_700_000_000_000 + i,
               "event_timestamp_ms": 1_700_000_000_000 + i, "segment_size_bytes": 1 << 20,
               "txn_index_empty": True, "leader_epochs": [[0, i * SEGMENT_RECORDS]]}
        if add_update:
            ask(add)
            ask({"op": "update", **base, "partition": p, "segment_id": segment_id, "state": "COPY_SEGMENT_FINISHED",
                 "event_timestamp_ms": 1_700_000_000_001 + i, "transactional": False})
        else:
            ask({**add, "op": "copy", "event_timestamp_ms": 1_700_000_000_001 + i, "transactional": False})
        if r % 10 == 9:
            touched = {TopicPartition(TOPIC, rng.randrange(partitions)) for _ in range(10)}
            commit_current_batch(other, {tp: (lambda c: ChangeSet.planned_from(
                c, fencing_epoch=c.fencing_epoch, writer="kcompact-gc")) for tp in touched}, 2)
            version = ask({"op": "follow", "since": version})["version"]
    return times


def _row(op: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"| {op} | {len(ms)} | {statistics.median(ms):.1f} | {p99:.1f} | {ms[-1]:.1f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--segments", type=int, default=50, help="live segments per partition before the rounds")
    parser.add_argument("--rounds", type=int, default=200, help="segments copied (one copy request each)")
    parser.add_argument("--add-update", action="store_true",
                        help="copy each segment as an add and an update, as a plugin older than `copy` does")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--s3", action="store_true", help="on a moto S3 server on 127.0.0.1 instead of a directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kcompact-rlmm-bench-") as tmp:
        if args.s3:
            import os

            from moto.server import ThreadedMotoServer

            from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, make_bucket
            os.environ.update(FAKE_AWS_ENV)
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            try:
                host, port = server.get_host_and_port()
                endpoint = f"http://{host}:{port}"
                make_bucket(endpoint, BUCKET)
                times = run(f"s3://{BUCKET}/bench", args.partitions, args.segments, args.rounds, args.seed, endpoint,
                            args.add_update)
            finally:
                server.stop()
        else:
            times = run(tmp, args.partitions, args.segments, args.rounds, args.seed, None, args.add_update)
    print(f"{args.partitions} partitions x {args.segments} segments, {'moto S3' if args.s3 else 'local directory'}")
    print("| call | n | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
    for op in ("start", "segments", "copy", "add", "update", "follow"):
        if times[op]:
            print(_row(op, times[op]))


if __name__ == "__main__":
    main()
