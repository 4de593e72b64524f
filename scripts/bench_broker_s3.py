"""P9 on S3 (issue 40 item 4): a Kafka broker tiering through kcompact's plugin into an s3:// store on a loopback S3
server, and Kafka's Java consumer reading the tier back through the broker, beside the same consumer reading the
broker's local log in the same run.

Why it is built this way:
- The store is a moto server (the S3 server the tests use) in a process of its own, so that its request handling
  does not share a GIL with this harness's producer; moto keeps the objects in memory.
- The two figures the issue asks for are paired in each run: the Java consumer (`kafka-consumer-perf-test`, as P9)
  reads the local log right after the produce, then, once every segment is tiered and deleted locally, the tier;
  and around the tier read the plugin's own counters are read over JMX (`org.apache.kafka.tools.JmxTool`, the
  KIP-877 metrics of `TierMetrics`): `store-get-bytes-total` and `store-gets-total` count every ranged GET the
  plugin's store process was asked for (segments and indexes), `bytes-total{op=fetch}` what the broker read of the
  plugin's streams. Bytes fetched / bytes served = GET bytes over the bytes of the tiered segments the consumer went
  through (each segment byte is served to it once).
- Each run is a fresh broker, store prefix and topic. The chunk cache is on at its defaults ("cache") or off
  (`kcompact.fetch.cache.bytes=0`, a chunk per fetch as before the cache, "no cache"), alternated, so the
  over-fetch the cache removes is measured on the same machine and load.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import SEGMENT_BYTES, SHAPES, TOPIC, TOPIC_CONFIG, java_read, log_segments, produce, table_log_bytes
from bench_broker import tier as tier_all
from confluent_kafka.admin import AdminClient, NewTopic

from compaction.storage import ObjectStore, StoreSpec
from tests.kafka.tiered import plugin_overrides
from tests.kafka_runtime import KafkaBroker, free_port, run_tool
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, REGION, UNSET_AWS_ENV, make_bucket

VOLUME_BYTES = 256 * 2**20
RUNS = 3
VARIANTS: dict[str, dict[str, str]] = {"cache": {}, "no cache": {"rsm.config.kcompact.fetch.cache.bytes": "0"}}
"""The plugin's chunk cache at its defaults, and off (a 4 MiB chunk read per fetchLogSegment, as before it)."""
RSM_METRICS = "kafka.server:type=plugins,config=remote.log.storage.manager.class.name"
COUNTERS = ("store-gets-total", "store-get-bytes-total", "fetch-bytes", "fetch-calls", "chunk-cache-peak-bytes",
            "chunk-cache-unused-prefetches-total", "reader-ms-mean", "reader-ms-median", "reader-reads")
READER_TIMER = "kafka.log.remote:type=RemoteLogManager,name=RemoteLogReaderFetchRateAndTimeMs"


@contextlib.contextmanager
def moto_process(workdir: Path) -> Iterator[str]:
    """A moto S3 server in its own process on a free port of 127.0.0.1, with the test bucket; its endpoint."""
    port = free_port()
    log = open(workdir / "moto.log", "wb")  # noqa: SIM115 (the server's, for its life)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=log, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start: {(workdir / 'moto.log').read_text()[-2000:]}") from None
                time.sleep(0.2)
        make_bucket(endpoint, BUCKET)
        yield endpoint
    finally:
        server.terminate()
        server.wait(30)
        log.close()


@contextlib.contextmanager
def fake_aws_env() -> Iterator[None]:
    """The broker's Python processes inherit fake credentials and no AWS config files."""
    saved = {k: os.environ.get(k) for k in (*FAKE_AWS_ENV, *UNSET_AWS_ENV)}
    os.environ.update(FAKE_AWS_ENV)
    for name in UNSET_AWS_ENV:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def jmx_args(port: int) -> list[str]:
    return [f"-Dcom.sun.management.jmxremote.port={port}", f"-Dcom.sun.management.jmxremote.rmi.port={port}",
            "-Dcom.sun.management.jmxremote.authenticate=false", "-Dcom.sun.management.jmxremote.ssl=false",
            "-Djava.rmi.server.hostname=127.0.0.1"]


def storage_counters(broker: KafkaBroker, jmx: int) -> dict[str, float]:
    """The storage manager's counters of COUNTERS, read over JMX: its gauges by name, and the fetch op's
    `bytes-total` / `calls-total` as `fetch-bytes` / `fetch-calls`; and Kafka's own timer of its remote reads
    (`RemoteLogReaderFetchRateAndTimeMs`: each consumer fetch served from the tier, metadata and index lookups, the
    storage manager's stream and the copy into the response) as `reader-ms-mean` / `reader-ms-median` /
    `reader-reads`, since the broker started."""
    url = f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{jmx}/jmxrmi"
    done = run_tool("org.apache.kafka.tools.JmxTool", ["--jmx-url", url, "--object-name", f"{RSM_METRICS},*",
                                                       "--object-name", READER_TIMER, "--one-time", "true",
                                                       "--report-format", "properties"],
                    logs_dir=broker.workdir / "logs", timeout=120)
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        timer = re.match(re.escape(READER_TIMER) + r":(Mean|50thPercentile|Count)=(-?[0-9.E+-]+)$", line.strip())
        if timer:
            out[{"Mean": "reader-ms-mean", "50thPercentile": "reader-ms-median", "Count": "reader-reads"}[
                timer.group(1)]] = float(timer.group(2))
            continue
        m = re.match(r"kafka\.server:type=plugins,(.+?):([a-z-]+)=(-?[0-9.E+-]+)$", line.strip())
        if not m:
            continue
        tags, name, value = m.group(1), m.group(2), float(m.group(3))
        if tags.endswith(",op=fetch"):
            name = {"bytes-total": "fetch-bytes", "calls-total": "fetch-calls"}.get(name, "")
        elif ",op=" in tags or ",cache=" in tags:
            continue
        if name in COUNTERS:
            out[name] = value
    return {name: out.get(name, 0.0) for name in COUNTERS}


def one_run(shape: dict[str, int], variant: str, volume: int, workdir: Path, endpoint: str,
            topic_config: dict[str, str]) -> dict[str, Any]:
    """A fresh broker on a fresh store prefix: produce, the Java consumer on the local log, tier everything, the
    Java consumer on the tier with the plugin's counters read before and after it."""
    store: ObjectStore = StoreSpec.parse(f"s3://{BUCKET}/p9s-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint,
                                         region=REGION).open()
    jmx = free_port()
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], heap="1g", start_timeout=180,
                         overrides={**plugin_overrides(store), **VARIANTS[variant]}, jvm_args=jmx_args(jmx))
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(TOPIC, 1, 1, config=topic_config)]).values():
            f.result(60)
        del admin
        run: dict[str, Any] = {"variant": variant, "produced": produce(broker, shape, volume)}
        records = run["produced"]["records"]
        run["read_local_java"] = java_read(broker, records, sum(log_segments(broker).values()))
        run["tiering"] = tier_all(broker)
        segments, size = table_log_bytes(store)
        before = storage_counters(broker, jmx)
        run["read_java"] = {"segments": segments, **java_read(broker, records, size)}
        after = storage_counters(broker, jmx)
        counted = {k: after[k] - before[k] for k in COUNTERS}
        for gauge in ("chunk-cache-peak-bytes", "reader-ms-mean", "reader-ms-median"):
            counted[gauge] = after[gauge]  # no remote read before this one: the timer covers it alone
        run["counters"] = counted
        run["fetched_over_served"] = counted["store-get-bytes-total"] / size
        run["tier_over_local"] = run["read_java"]["mb_s"] / run["read_local_java"]["mb_s"]
    finally:
        broker.stop()
    return run


def _median(runs: list[dict[str, Any]], pick: Any) -> float:
    return float(median(pick(r) for r in runs))


def bench_broker_s3(scale: float = 1.0, runs: int = RUNS) -> dict[str, Any]:
    """Every shape with the cache on and off, `runs` times, alternated; medians per shape and variant."""
    volume, segment = int(VOLUME_BYTES * scale), max(2**20, int(SEGMENT_BYTES * scale))
    topic_config = {**TOPIC_CONFIG, "segment.bytes": str(segment)}
    root = Path(tempfile.mkdtemp(prefix="p9s-"))
    done: list[dict[str, Any]] = []
    try:
        with fake_aws_env(), moto_process(root) as endpoint:
            for i in range(runs):
                for s, shape in enumerate(SHAPES):
                    for variant in (list(VARIANTS) if (i + s) % 2 == 0 else list(reversed(VARIANTS))):
                        workdir = root / f"{s}-{variant.replace(' ', '-')}-{i}"
                        print(f"P9S: shape {s} {variant} run {i + 1}/{runs}", file=sys.stderr, flush=True)
                        done.append({"shape": s, **one_run(shape, variant, volume, workdir, endpoint, topic_config)})
                        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = []
    for s in range(len(SHAPES)):
        for variant in VARIANTS:
            mine = [r for r in done if r["shape"] == s and r["variant"] == variant]
            medians.append({"shape": s, "variant": variant,
                            "fetched_over_served": _median(mine, lambda r: r["fetched_over_served"]),
                            "tier_over_local": _median(mine, lambda r: r["tier_over_local"]),
                            "read_local_mb_s": _median(mine, lambda r: r["read_local_java"]["mb_s"]),
                            "read_mb_s": _median(mine, lambda r: r["read_java"]["mb_s"])})
    return {"shapes": SHAPES, "volume_bytes": volume, "segment_bytes": segment, "topic_config": topic_config,
            "variants": VARIANTS, "server": "moto", "runs": done, "medians": medians}


if __name__ == "__main__":
    import json

    print(json.dumps(bench_broker_s3(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0,
                                     int(sys.argv[2]) if len(sys.argv) > 2 else RUNS), indent=1))
