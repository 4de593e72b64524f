"""P11 (issue 41 item 7): the same bytes over 8, 100 and 1,000 partitions, each command a fresh process.

The workload is the issue's own: `kcompact generate --bulk`, ~160 MB of 100-byte values in 128 KiB segments, split
evenly over N partitions of one topic (records and keys per partition = the totals / N). For each N, on a fresh
store: `kcompact tier` of the log dir, `kcompact compact`, `kcompact table` (a full build of the topic table),
`kcompact verify` of partition 0 (verify takes one partition: a topic-wide figure would be N processes), and
`kcompact gc --grace-ms 0` (deletes what the compaction replaced). Each is timed as a whole process, and the Delta
commits it made to the metadata table are counted (table versions before and after). Goals: 1,000 partitions
within 1.5x of 8 partitions' wall for tier and compact; a compaction's commits independent of N (<= 3).

With `--s3` the store is an S3 bucket on a moto server on 127.0.0.1 (started here, stopped at the end), and each
command that prints its store requests (`tier`, `compact`, `gc`, with `--json`) has them recorded: on object storage
the request counts are the figure (GETs, PUTs, DELETEs, LISTs), moto's wall is not S3's. `--latency-ms N` puts a
proxy in front of it (tests/s3_proxy.py) that holds every request N ms before forwarding it, requests concurrently,
as a network would: a model of S3's per-request latency, which moto on 127.0.0.1 lacks. `--steps` runs some steps.

    python scripts/bench_partitions.py [--partitions 8,100,1000] [--scale 1.0] [--s3 [--latency-ms 50]]
        [--steps tier,compact,table,verify,gc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_workloads import DATA, NOW_MS, START_MS

KCOMPACT = Path(sys.executable).parent / "kcompact"
TOTAL_RECORDS = 1_200_000
TOTAL_KEYS = 240_000
SEGMENT_BYTES = 128 * 1024
TOPIC = "p11"


def _workload(partitions: int, scale: float) -> Path:
    records, keys = int(TOTAL_RECORDS * scale) // partitions, max(1, int(TOTAL_KEYS * scale) // partitions)
    logdir = DATA / f"p11-{partitions}-{records}"
    if not (logdir / ".complete").exists():
        shutil.rmtree(logdir, ignore_errors=True)
        subprocess.run([str(KCOMPACT), "generate", "--logdir", str(logdir), "--bulk", "--start-ms", str(START_MS),
                        "--topics", f"{TOPIC}:{partitions}", "--records", str(records), "--keys", str(keys),
                        "--key-order", "uniform", "--value-bytes", "100", "--records-per-batch", "200",
                        "--segment-bytes", str(SEGMENT_BYTES), "--codecs", "none", "--tombstone-ratio", "0.01",
                        "--seed", "41"], check=True, stdout=subprocess.DEVNULL)
        (logdir / ".complete").write_text("")
    return logdir


STEPS = ("tier", "compact", "table", "verify", "gc")
"""The steps run after `tier` (which always runs: the others need its store)."""
ENDPOINT: str | None = None
"""The moto server's URL under `--s3`."""
BUCKET = "kcompact-bench"


def _version(store: str) -> int:
    """The metadata table's version, -1 before it exists."""
    from compaction.errors import MetadataTableNotFoundError
    from compaction.metadata import table_in_store
    from compaction.storage import open_store

    try:
        return table_in_store(open_store(store, endpoint_url=ENDPOINT)).version()
    except MetadataTableNotFoundError:
        return -1


def _timed(name: str, cmd: list[str], store: str, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    before = _version(store)
    cmd = [*cmd, *(["--endpoint-url", ENDPOINT] if ENDPOINT else [])]
    counted = ENDPOINT is not None and name in ("tier", "compact", "gc")
    cmd += ["--json"] if counted else []
    print("running:", " ".join(cmd), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(f"{name} exited {done.returncode}: {done.stderr[-2000:]}")
    step = {"command": name, "seconds": seconds, "exit": done.returncode, "commits": _version(store) - max(before, 0)}
    if counted:
        doc = json.loads(done.stdout)
        step["requests"] = doc["requests"]
        step |= {k: doc[k] for k in ("plan_requests", "metadata_requests") if k in doc}
    return step


def _start_moto(latency_ms: int = 0) -> list[Any]:
    """A moto S3 server on a free port of 127.0.0.1 with the bench's bucket (behind a proxy holding each request
    `latency_ms`, when given); fake credentials for every command. What to stop, in order."""
    import boto3
    from moto.server import ThreadedMotoServer

    global ENDPOINT
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    ENDPOINT = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=ENDPOINT).create_bucket(Bucket=BUCKET)
    if not latency_ms:
        return [server]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3_proxy import FlakyProxy

    proxy = FlakyProxy(ENDPOINT, latency=lambda method, path: time.sleep(latency_ms / 1000))
    ENDPOINT = proxy.start()
    return [proxy, server]


def one(partitions: int, scale: float) -> dict[str, Any]:
    logdir = _workload(partitions, scale)
    work = DATA / "stores" / f"p11-{partitions}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store, config = str(work / "store") if ENDPOINT is None else f"s3://{BUCKET}/p11-{partitions}", work / "config.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n")
    base = ["--store", store]
    steps = [_timed("tier", [str(KCOMPACT), "tier", "--logdir", str(logdir), *base, "--now", str(NOW_MS)], store)]
    tiered = _version(store)
    later = {
        "compact": [str(KCOMPACT), "compact", *base, "--config", str(config), "--now", str(NOW_MS)],
        "table": [str(KCOMPACT), "table", *base, "--config", str(config), "--topic", TOPIC,
                  "--table", str(work / "topic-table"), "--now", str(NOW_MS)],
        "verify": [str(KCOMPACT), "verify", *base, "--topic", TOPIC, "--partition", "0", "--before", str(tiered),
                   "--config", str(config)],
        "gc": [str(KCOMPACT), "gc", *base, "--now", str(NOW_MS + 86_400_000), "--grace-ms", "0",
               "--orphan-grace-ms", "0"],
    }
    steps += [_timed(name, cmd, store) for name, cmd in later.items() if name in STEPS]
    segment_bytes = sum(f.stat().st_size for f in logdir.rglob("*.log"))
    shutil.rmtree(work, ignore_errors=True)
    return {"partitions": partitions, "log_bytes": segment_bytes, "store": "s3 (moto)" if ENDPOINT else "local",
            "steps": steps, "load": os.getloadavg()}


def bench_partitions(scale: float = 1.0, counts: tuple[int, ...] = (8, 100, 1000)) -> dict[str, Any]:
    return {"runs": [one(n, scale) for n in counts], "segment_bytes": SEGMENT_BYTES,
            "total_records": int(TOTAL_RECORDS * scale)}


def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,100,1000")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--s3", action="store_true", help="the store on a moto S3 server on 127.0.0.1")
    parser.add_argument("--latency-ms", type=int, default=0, help="with --s3: hold each request this long")
    parser.add_argument("--steps", default=",".join(STEPS), help="the steps after tier to run")
    args = parser.parse_args()
    STEPS = tuple(args.steps.split(","))
    servers = _start_moto(args.latency_ms) if args.s3 else []
    try:
        result = bench_partitions(args.scale, tuple(int(n) for n in args.partitions.split(",")))
        result["latency_ms"] = args.latency_ms
    finally:
        for server in servers:
            server.stop()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
