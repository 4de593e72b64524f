"""P11b (issue 41 item 5): one KRaft broker leading `--partitions` tiered partitions through kcompact's plugin on a
local-directory store; the latency of each metadata manager call, the remote log manager's task rounds, and the memory
of the broker and of its Python metadata process.

What is measured, and how:
- Per manager call (`op`): the plugin's own KIP-877 metrics (`TierMetrics`), read over JMX with Kafka's `JmxTool`
  every `--poll-s` while the producer runs. `calls-total` is cumulative; `latency-p50-ms`, `latency-p99-ms` and
  `latency-max-ms` cover Kafka's default sample window (two samples of 30 s), so each poll sees the last 30-60 s. The
  table gives the last poll under load and the worst p99 and max any poll saw.
- The task rounds: the expiration task of each partition (`RLMExpirationTask`) lists its remote segments once per
  leader epoch per round (`listRemoteLogSegments(tp, epoch)`; one epoch here), so the calls of
  `listRemoteLogSegments` over a poll interval, divided by the partitions, give the rounds a partition had; the mean
  round period is its inverse. Besides that: Kafka's `RemoteLogManagerTasksAvgIdlePercent` gauges (the copy and
  expiration thread pools' idle share), and each segment's copy from the broker's log, "Copying" to "Copied ... to
  remote storage" (the storage manager's write and both metadata calls), with the wait from the segment's roll
  deadline that precedes it not counted.
- Memory: VmRSS of the broker's JVM and of the Python metadata process (`compaction.remote_log_metadata`).

`--manager stock` runs the same with Kafka's own `TopicBasedRemoteLogMetadataManager` in place of kcompact's (the
storage manager stays kcompact's): the referee. It runs behind the plugin's `TimedRemoteLogMetadataManager`, which
passes every call on and publishes each call's latency under the same names as kcompact's manager (a write timed
until the future it returns completes, which is what Kafka's copier thread waits on), so the Kafka-named calls,
the copy times, the copier pool's idle share and the broker's memory compare; the `process:` rows are kcompact's
alone.

Segments roll by time (`segment.ms`, with jitter so the partitions do not roll at once), so every partition tiers a
few segments during the run; the producer sends small records round-robin to every partition at `--rate` records/s.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import overrides as manager_overrides
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compaction.storage import open_store
from tests.kafka.tiered import tiered_topic_config
from tests.kafka_runtime import KafkaBroker, free_port, run_tool

TOPIC = "p11b"
RLMM = "config=remote.log.metadata.manager.class.name"
READS = ("remoteLogSegmentMetadata", "listRemoteLogSegments", "listRemoteLogSegments-epoch", "highestOffsetForEpoch",
         "nextSegmentWithTxnIndex", "remoteLogSize", "addRemoteLogSegmentMetadata", "updateRemoteLogSegmentMetadata")
PIPE = ("segments", "copy", "add", "update", "batch", "follow")
JMX_LINE = re.compile(r"^(kafka\..+?)=(-?[0-9.E+-]+|NaN)$")
COPY_LINE = re.compile(r"^\[(\S+ \S+)\] INFO (.*)(Copying|Copied) (\d{20})\.log to remote storage")


def topic_config(segment_ms: int) -> dict[str, str]:
    """The tests' tiered topic, its rolls spread by a jitter of half the roll time (partitions do not all roll at
    once), and a local retention by time of four roll times: a tiered segment is still deleted from the broker's
    disk at once (`local.retention.bytes` 1), but an active segment is rolled only by `segment.ms`. (With the
    tests' 1 s, Kafka's retention check, every second here, rolls each partition whose newest record is a second
    old "to make it eligible for deletion": the copies then follow how late the producer runs on the machine, 4-5
    times more of them on a loaded disk than the ~25 a second `segment.ms` makes at 1,000 partitions.)"""
    return {**tiered_topic_config(segment_ms), "segment.jitter.ms": str(segment_ms // 2),
            "local.retention.ms": str(4 * segment_ms)}


def jmx(port: int, logs: Path) -> dict[str, float]:
    """The plugin's metrics and Kafka's remote log metrics, as `<object name>:<attribute>` -> value."""
    url = f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{port}/jmxrmi"
    out: dict[str, float] = {}
    for name in ("kafka.server:type=plugins,*", "kafka.log.remote:*"):
        done = run_tool("org.apache.kafka.tools.JmxTool", ["--jmx-url", url, "--object-name", name, "--one-time",
                                                           "true", "--report-format", "properties"],
                        logs_dir=logs, timeout=120)
        for line in done.stdout.splitlines():
            m = JMX_LINE.match(line.strip())
            if m and m.group(2) != "NaN":
                out[m.group(1)] = float(m.group(2))
    return out


def op_metrics(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """The metadata manager's per-op figures: op -> attribute -> value."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        m = re.search(r",op=([^,:]+):(calls-total|latency-p50-ms|latency-p99-ms|latency-max-ms|latency-avg-ms)$", key)
        if RLMM in key and m:
            out.setdefault(m.group(1), {})[m.group(2)] = value
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metadata_pids(store_uri: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"compaction.remote_log_metadata --store {store_uri}"],
                           capture_output=True, text=True, check=False).stdout.split()
    return [int(p) for p in found]


def copies(broker: KafkaBroker) -> list[float]:
    """Seconds from each segment's "Copying" to its "Copied", by the broker's log clock."""
    events: dict[tuple[str, str], dict[str, float]] = {}
    for line in broker.server_log.read_text(errors="replace").splitlines():
        m = COPY_LINE.match(line)
        if m:
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            partition = re.search(r"partition=(\S+?)[\]\s]", m.group(2))
            key = (partition.group(1) if partition else m.group(2), m.group(4))
            events.setdefault(key, {})[m.group(3)] = at
    return [e["Copied"] - e["Copying"] for e in events.values() if len(e) == 2]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def run(partitions: int, minutes: float, interval_ms: int, segment_ms: int, rate: int, poll_s: float,
        workdir: Path, manager: str = "kcompact", store_dir: Path | None = None) -> dict[str, Any]:
    store = open_store(str((store_dir or workdir) / "store"))
    port = free_port()
    overrides = {**manager_overrides(manager, store), "remote.log.manager.task.interval.ms": str(interval_ms)}
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=overrides, heap="1g", jvm_args=[
        f"-Dcom.sun.management.jmxremote.port={port}", f"-Dcom.sun.management.jmxremote.rmi.port={port}",
        "-Dcom.sun.management.jmxremote.authenticate=false", "-Dcom.sun.management.jmxremote.ssl=false",
        "-Djava.rmi.server.hostname=127.0.0.1"], start_timeout=180)
    broker.start()
    logs = broker.workdir / "logs"
    polls: list[dict[str, Any]] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(TOPIC, partitions, 1, config=topic_config(segment_ms))]).values():
            f.result(120)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 100, "acks": "1"})
        started = time.monotonic()
        next_poll, sent, value = started + poll_s, 0, b"x" * 100
        while time.monotonic() - started < minutes * 60:
            due = int((time.monotonic() - started) * rate)
            while sent < due:
                try:
                    producer.produce(TOPIC, key=b"%08d" % sent, value=value, partition=sent % partitions)
                    sent += 1
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0.05)
            if time.monotonic() >= next_poll:
                metrics = jmx(port, logs)
                assert broker.process is not None
                polls.append({"at_s": time.monotonic() - started, "ops": op_metrics(metrics),
                              "remote": {k: v for k, v in metrics.items() if k.startswith("kafka.log.remote")},
                              "broker_rss_mib": rss_mib(broker.process.pid),
                              "metadata_rss_mib": [rss_mib(p) for p in metadata_pids(store.uri)],
                              "load": os.getloadavg()[0]})
                print(f"P11b {partitions}: {polls[-1]['at_s']:.0f} s, {sent} records, load {polls[-1]['load']:.1f}",
                      file=sys.stderr, flush=True)
                next_poll = time.monotonic() + poll_s
        producer.flush(60)
        copy_s = copies(broker)
    finally:
        broker.stop()
    return {"partitions": partitions, "manager": manager, "store": store.uri, "minutes": minutes,
            "task_interval_ms": interval_ms, "segment_ms": segment_ms, "rate": rate, "records": sent, "polls": polls,
            "copy_seconds": copy_s}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per op: calls, the last poll's p50/p99/max, the worst p99 and max of any poll; rounds; memory."""
    polls, partitions = result["polls"], result["partitions"]
    last = polls[-1]["ops"]
    ops = {}
    for op in (*READS, *PIPE):
        seen = [p["ops"][op] for p in polls if op in p["ops"]]
        if op in last:
            ops[op] = {"calls": last[op].get("calls-total", 0.0), "p50_ms": last[op].get("latency-p50-ms"),
                       "p99_ms": last[op].get("latency-p99-ms"), "max_ms": last[op].get("latency-max-ms"),
                       "worst_p99_ms": max(s.get("latency-p99-ms", 0.0) for s in seen),
                       "worst_max_ms": max(s.get("latency-max-ms", 0.0) for s in seen)}
    periods = []
    for before, after in itertools.pairwise(polls):
        calls = (after["ops"].get("listRemoteLogSegments", {}).get("calls-total", 0.0)
                 - before["ops"].get("listRemoteLogSegments", {}).get("calls-total", 0.0))
        if calls > 0:
            periods.append((after["at_s"] - before["at_s"]) * partitions / calls)
    idle = {k.split("name=")[-1]: [p["remote"][k] for p in polls if k in p["remote"]]
            for p in polls for k in p["remote"] if "IdlePercent" in k}
    copy_s = result["copy_seconds"]
    return {"ops": ops, "round_period_s": {"median": median(periods) if periods else None,
                                           "max": max(periods) if periods else None},
            "idle_percent_min": {k: min(v) for k, v in idle.items()},
            "copies": len(copy_s), "copy_p50_s": percentile(copy_s, 50), "copy_p99_s": percentile(copy_s, 99),
            "broker_rss_mib_max": max(p["broker_rss_mib"] for p in polls),
            "metadata_rss_mib_max": max((max(p["metadata_rss_mib"], default=0.0) for p in polls), default=0.0),
            "load_median": median(p["load"] for p in polls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=4.0, help="how long the producer runs")
    parser.add_argument("--task-interval-ms", type=int, default=5000)
    parser.add_argument("--segment-ms", type=int, default=45000)
    parser.add_argument("--rate", type=int, default=2000, help="records per second over all partitions")
    parser.add_argument("--poll-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="write every poll and the summary here")
    parser.add_argument("--manager", choices=("kcompact", "stock"), default="kcompact",
                        help="the metadata manager: kcompact's, or Kafka's TopicBasedRemoteLogMetadataManager")
    parser.add_argument("--store-dir", type=Path, default=None,
                        help="put the store in a new directory under this one (a file system of its own, apart from "
                             "the broker's log dirs); default: beside the broker's, under TMPDIR")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="p11b-"))
    store_dir = Path(tempfile.mkdtemp(prefix="p11b-store-", dir=args.store_dir)) if args.store_dir else None
    try:
        result = run(args.partitions, args.minutes, args.task_interval_ms, args.segment_ms, args.rate, args.poll_s,
                     workdir, args.manager, store_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if store_dir is not None:
            shutil.rmtree(store_dir, ignore_errors=True)
    result["summary"] = summary(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    s = result["summary"]
    print(f"{args.partitions} partitions, {args.manager} metadata manager, {result['records']} records, "
          f"load median {s['load_median']:.1f}")
    print(f"{'op':28} {'calls':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'worst p99':>9} {'worst max':>9}")
    for op, f in s["ops"].items():
        cells = [f"{f[k]:.3f}" if f[k] is not None else "-" for k in ("p50_ms", "p99_ms", "max_ms")]
        print(f"{op:28} {f['calls']:9.0f} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} {f['worst_p99_ms']:9.3f} "
              f"{f['worst_max_ms']:9.3f}")
    print(f"expiration round period (s): {s['round_period_s']}; pools' least idle %: {s['idle_percent_min']}")
    print(f"copies {s['copies']}: p50 {s['copy_p50_s']:.3f} s, p99 {s['copy_p99_s']:.3f} s")
    print(f"RSS MiB: broker {s['broker_rss_mib_max']:.0f}, metadata process {s['metadata_rss_mib_max']:.0f}")


if __name__ == "__main__":
    main()
