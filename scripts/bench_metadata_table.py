"""The metadata table at scale (issue 41 item 4): commit and read times at 10,000 partitions x 50 live segments, with
a short Delta log and with a long one, on a local directory and on a moto S3 server, with the S3 requests counted.

Steps (about 10 minutes on 2 cores at the defaults):

1. build the table through kcompact's own write path: `commit_current_batch` of 1,000 partitions a commit (100 topics x
   100 partitions, 50 COPY_SEGMENT_FINISHED segments each: 10 commits of 50,000 segment rows), with the project's
   table configuration (`table.LOG_CONFIGURATION`); kept as the pristine copy;
2. "short log": a copy of it, measured (the measurement's own commits join the log);
3. "long log": the same copy grown by `--commits` one-partition rewrites (`write_deltalake` overwrite with the
   partition's predicate, as a commit writes; checkpoints at the table's interval), then measured again; both logs
   also measured with delta-rs's default `delta.enableExpiredLogCleanup=true` (every commit lists the whole log);
4. S3: a moto server in its own process; both tables uploaded into the bucket with boto3 (building them on moto
   takes too long), measured there the same way, timings direct to moto and requests counted on one more pass
   through a counting proxy (`tests/s3_proxy.py`).

Measured per table: a one-partition commit through `commit_current` (a COPY_SEGMENT_STARTED segment added), a
1,000-partition one through `commit_current_batch`, `snapshot()`, `partition_snapshot` and `partition_snapshots` of
1,000 partitions. Prints a Markdown table and writes JSON (`--json`). Not part of `make bench`.

    .venv/bin/python scripts/bench_metadata_table.py --json /tmp/metadata-scale.json
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_broker_s3 import fake_aws_env, moto_process
from bench_measure import machine
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

from compaction.format.checkpoints import EpochEntry
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    PartitionSnapshot,
    SegmentState,
    TopicPartition,
    commit_current,
    commit_current_batch,
    new_kafka_uuid,
)
from compaction.metadata.batch import partitions_predicate
from compaction.metadata.table import read_rows
from compaction.metadata.upkeep import log_files
from tests.moto_s3 import BUCKET, REGION

TOPICS, PARTITIONS_PER_TOPIC, SEGMENTS = 100, 100, 50
TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
NOW_MS = 1_700_000_000_000
SEGMENT_RECORDS = 100_000
ONE_COMMITS, BATCH_COMMITS, FULL_READS, ONE_READS, BATCH_READS = 20, 2, 2, 10, 2


def partitions() -> list[TopicPartition]:
    return [TopicPartition(f"topic-{t:03d}", p) for t in range(TOPICS) for p in range(PARTITIONS_PER_TOPIC)]


def new_segment(tp: TopicPartition, start: int, state: SegmentState) -> NewSegment:
    sid = new_kafka_uuid()
    key = f"{tp.topic}-{TOPIC_ID}/{tp.partition}/{start:020d}-{sid}.log"
    return NewSegment(sid, start, start + SEGMENT_RECORDS - 1, NOW_MS, (EpochEntry(0, start),), 1 << 30,
                      (ObjectKey(ObjectSuffix.LOG, key),), record_count=SEGMENT_RECORDS, state=state)


def filled(tp: TopicPartition) -> Callable[[PartitionSnapshot], ChangeSet]:
    """A fresh partition's 50 live segments, as a tier run would add them."""
    segments = [new_segment(tp, i * SEGMENT_RECORDS, SegmentState.COPY_SEGMENT_FINISHED) for i in range(SEGMENTS)]
    return lambda current: ChangeSet.planned_from(current, fencing_epoch=0, writer="bench", new_segments=segments,
                                                  topic_id=TOPIC_ID)


def one_more(current: PartitionSnapshot) -> ChangeSet:
    """The broker's addRemoteLogSegmentMetadata: the next segment, COPY_SEGMENT_STARTED."""
    top = max(s.end_offset for s in current.segments) + 1
    tp = TopicPartition(current.topic, current.partition)
    return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="bench",
                                  new_segments=[new_segment(tp, top, SegmentState.COPY_SEGMENT_STARTED)])


def build(uri: str) -> float:
    started = time.perf_counter()
    table = MetadataTable.create_if_missing(uri)
    every = partitions()
    for i in range(0, len(every), 1000):
        outcomes = commit_current_batch(table, {tp: filled(tp) for tp in every[i:i + 1000]}, NOW_MS)
        refused = [o for o in outcomes.values() if isinstance(o, Exception)]
        if refused:
            raise refused[0]
    return time.perf_counter() - started


def grow(uri: str, commits: int) -> float:
    """`commits` one-partition rewrites (the partition's own rows, as a commit rewrites them), checkpoints at the
    table's interval, no log cleanup: the log a busy table accumulates between two upkeeps."""
    started = time.perf_counter()
    dt = DeltaTable(uri)
    some = partitions()[:PARTITIONS_PER_TOPIC]
    read = read_rows(dt, None, [("topic", "=", some[0].topic)])
    rows = {tp: read.filter(pc.field("partition") == tp.partition) for tp in some}
    hooks = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
    for i in range(commits):
        tp = some[i % len(some)]
        write_deltalake(dt, rows[tp], mode="overwrite", predicate=partitions_predicate([tp]),
                        post_commithook_properties=hooks)
    return time.perf_counter() - started


def log_shape(uri: str, options: dict[str, str] | None) -> dict[str, Any]:
    dt = DeltaTable(uri, storage_options=options)
    files = log_files(uri, options)
    checkpoints = sorted(v for v, kind in files if kind == "checkpoint")
    version = int(dt.version())
    return {"version": version, "log_files": len(files), "commit_files": sum(k == "commit" for _, k in files),
            "checkpoints": len(checkpoints), "since_checkpoint": version - (checkpoints[-1] if checkpoints else -1),
            "data_files": len(dt.file_uris())}


def checkpoint_actions(root: Path) -> dict[str, int]:
    last = json.loads((root / "_delta_log" / "_last_checkpoint").read_text())["version"]
    t = pq.read_table(root / "_delta_log" / f"{last:020d}.checkpoint.parquet", columns=["add", "remove"])
    return {"checkpoint_adds": t.num_rows - t["add"].null_count,
            "checkpoint_removes": t.num_rows - t["remove"].null_count,
            "checkpoint_bytes": (root / "_delta_log" / f"{last:020d}.checkpoint.parquet").stat().st_size}


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(table: MetadataTable, rng: random.Random, rounds: dict[str, int]) -> dict[str, Any]:
    """Each operation `rounds[op]` times; one-partition commits on distinct random partitions."""
    every = partitions()
    out: dict[str, list[float]] = collections.defaultdict(list)
    for tp in rng.sample(every, rounds["commit_one"]):
        out["commit_one"].append(timed(lambda tp=tp: commit_current(table, tp, NOW_MS, one_more)))
    for _ in range(rounds["commit_1000"]):
        batch = rng.sample(every, 1000)
        plans = dict.fromkeys(batch, one_more)
        out["commit_1000"].append(timed(lambda p=plans: commit_current_batch(table, p, NOW_MS)))
    for _ in range(rounds["read_full"]):
        out["read_full"].append(timed(table.snapshot))
    for tp in rng.sample(every, rounds["read_one"]):
        out["read_one"].append(timed(lambda tp=tp: table.partition_snapshot(tp.topic, tp.partition)))
    for _ in range(rounds["read_1000"]):
        batch = rng.sample(every, 1000)
        out["read_1000"].append(timed(lambda b=batch: table.partition_snapshots(b)))
    return {op: {"p50": pct(s, 0.5), "p99": pct(s, 0.99), "max": max(s), "n": len(s)} for op, s in out.items()}


ROUNDS = {"commit_one": ONE_COMMITS, "commit_1000": BATCH_COMMITS, "read_full": FULL_READS, "read_one": ONE_READS,
          "read_1000": BATCH_READS}
ONCE = dict.fromkeys(ROUNDS, 1)


@contextlib.contextmanager
def auto_cleanup(uri: str, options: dict[str, str] | None) -> Iterator[None]:
    """delta-rs's default for the duration: every commit lists the log to expire it."""
    DeltaTable(uri, storage_options=options).alter.set_table_properties({"delta.enableExpiredLogCleanup": "true"})
    try:
        yield
    finally:
        DeltaTable(uri, storage_options=options).alter.set_table_properties(
            {"delta.enableExpiredLogCleanup": "false"})


def measure_table(uri: str, options: dict[str, str] | None, rng: random.Random) -> dict[str, Any]:
    table = MetadataTable.open(uri, options)
    shape = log_shape(uri, options)
    figures = measure(table, rng, ROUNDS)
    with auto_cleanup(uri, options):
        default = measure(table, rng, {**dict.fromkeys(ROUNDS, 0), "commit_one": 10})
    return {"log": shape, "figures": figures, "with_delta_rs_cleanup": default}


def upload(root: Path, endpoint: str, prefix: str) -> float:
    """Every file under `root` to s3://BUCKET/prefix/ (16 at a time)."""
    started = time.perf_counter()
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    files = [p for p in root.rglob("*") if p.is_file()]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: s3.upload_file(str(p), BUCKET, f"{prefix}/{p.relative_to(root)}"), files))
    return time.perf_counter() - started


def requests(uri: str, endpoint: str, moto_log: Path, rng: random.Random) -> dict[str, dict[str, int]]:
    """Each operation once more, its requests counted in the moto server's own request log (LIST is a GET with
    list-type; `LIST from the start` one without start-after)."""
    options = s3_options(endpoint)
    table = MetadataTable.open(uri, options)

    def counted(ops: dict[str, int]) -> dict[str, int]:
        offset = moto_log.stat().st_size
        measure(table, rng, {**dict.fromkeys(ROUNDS, 0), **ops})
        time.sleep(0.5)  # the server logs a request after answering it
        with moto_log.open("rb") as log:
            log.seek(offset)
            lines = [line.decode(errors="replace") for line in log if b'HTTP/1.1' in line]
        kinds: collections.Counter[str] = collections.Counter()
        for line in lines:
            method = line.split('"')[1].split()[0].lstrip("\x1b[0123456789;m")
            kinds["LIST" if "list-type" in line else method] += 1
            if "list-type" in line and "start-after" not in line:
                kinds["LIST from the start"] += 1
        return dict(kinds)

    counts = {op: counted({op: 1}) for op in ROUNDS}
    with auto_cleanup(uri, options):
        counts["commit_one_with_delta_rs_cleanup"] = counted({"commit_one": 1})
    return counts


def s3_options(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}


def main() -> None:
    global TOPICS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=10_000, help="one-partition commits of the long log")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the tables here (default: a temp dir)")
    parser.add_argument("--topics", type=int, default=TOPICS, help="of 100 partitions each (>= 10)")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    TOPICS = args.topics
    rng = random.Random(41)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kcompact-metadata-scale-"))
    pristine, table = work / "pristine", work / "table"
    result: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "partitions": TOPICS * PARTITIONS_PER_TOPIC, "segments": SEGMENTS,
                              "long_log_commits": args.commits}
    if not pristine.exists():
        result["build_s"] = build(str(pristine))
        print(f"built in {result['build_s']:.0f} s", flush=True)
    shutil.rmtree(table, ignore_errors=True)
    shutil.copytree(pristine, table)
    result["local_short"] = measure_table(str(table), None, rng) | checkpoint_actions(table)
    print("local short", json.dumps(result["local_short"]), flush=True)
    short = work / "short-after"
    shutil.rmtree(short, ignore_errors=True)
    shutil.copytree(pristine, short)
    result["grow_s"] = grow(str(table), args.commits)
    print(f"grew the log by {args.commits} commits in {result['grow_s']:.0f} s", flush=True)
    result["local_long"] = measure_table(str(table), None, rng) | checkpoint_actions(table)
    print("local long", json.dumps(result["local_long"]), flush=True)
    if not args.no_s3:
        with fake_aws_env(), moto_process(work) as endpoint:
            for name, root in (("short", short), ("long", table)):
                result[f"upload_{name}_s"] = upload(root, endpoint, name)
                uri = f"s3://{BUCKET}/{name}"
                result[f"s3_{name}"] = measure_table(uri, s3_options(endpoint), rng)
                result[f"s3_{name}"]["requests"] = requests(uri, endpoint, work / "moto.log", rng)
                print(f"s3 {name}", json.dumps(result[f"s3_{name}"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(render(result))


def render(result: dict[str, Any]) -> str:
    ops = ("commit_one", "commit_1000", "read_full", "read_one", "read_1000")
    lines = ["| store, log | log files (commits, checkpoints, since the last) | " + " | ".join(ops) +
             " | commit_one, delta-rs's cleanup on |", "|" + "---|" * (len(ops) + 3)]
    for key in ("local_short", "local_long", "s3_short", "s3_long"):
        if key not in result:
            continue
        r, log = result[key], result[key]["log"]
        cells = [f"{r['figures'][op]['p50'] * 1000:.0f} / {r['figures'][op]['p99'] * 1000:.0f}" for op in ops]
        d = r["with_delta_rs_cleanup"]["commit_one"]
        lines.append(f"| {key} | {log['log_files']} ({log['commit_files']}, {log['checkpoints']}, "
                     f"{log['since_checkpoint']}) | " + " | ".join(cells) +
                     f" | {d['p50'] * 1000:.0f} / {d['p99'] * 1000:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
