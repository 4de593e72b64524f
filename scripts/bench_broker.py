"""P9 (issue 29 item 4): a real Kafka broker tiering through kcompact's plugin, and a consumer reading the tier back
through it, each beside the same broker and plugin storage manager with Kafka's stock topic-based metadata manager.

Why it is built this way:
- The volume is produced with remote storage off and tiering is switched on afterwards (an `AlterConfigs` of
  `remote.storage.enable`), so the producer never competes with the copy for the 2 cores and every segment is
  eligible at once. The tiering interval is then read from the broker's own log: from `RemoteLogManager`'s first
  "Copying <segment> to remote storage." to its last "Copied <segment> ... with segment-id", over exactly the
  segments that were rolled when tiering was switched on. Kafka logs "Copied" after the metadata manager's
  COPY_SEGMENT_FINISHED update returned, so the interval covers the storage manager's writes and both metadata
  updates of every segment, for either metadata manager, with the same clock. The wait before the first copy (the
  manager getting ready for the partition, the copy task's next turn) is kept apart, as is the tail segment that
  local retention rolls later.
- A read starts once the broker deleted every local copy (only an empty active segment left), so every fetch is a
  remote fetch; a fresh consumer reads from offset 0 to the partition's end. MB/s counts the bytes of the remote
  segments it went through, as the metadata (kcompact) or the store (stock) lists them.
- Compaction needs kcompact's metadata manager (it swaps segments in kcompact's table), so the compacted read is on
  kcompact's manager only; the stock manager gets tiering and the uncompacted read.
- Every run is a fresh broker in a fresh directory; shapes and managers alternate so that a change in the
  machine's load touches both managers alike. `os.getloadavg()` is kept at each interval's ends: the machine is
  shared.
"""

from __future__ import annotations

import datetime
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

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from compaction.metadata import table_in_store
from compaction.storage import ObjectStore, open_store
from tests.kafka.tiered import plugin_overrides, wait_for
from tests.kafka_runtime import LOG4J, KafkaBroker, classpath, java

TOPIC = "p9"
SEGMENT_BYTES = 8 * 2**20
VOLUME_BYTES = 256 * 2**20
RUNS = 3
DEADLINE_S = 900.0
SHAPES: list[dict[str, int]] = [
    {"key_bytes": 16, "value_bytes": 100, "keys": 200_000},
    {"key_bytes": 16, "value_bytes": 4000, "keys": 8_000},
]
"""Small values over many keys, and 4 KB values over fewer keys; every key updated about ten times."""

TOPIC_CONFIG = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "local.retention.ms": "1000",
    "local.retention.bytes": "1",
    "segment.bytes": str(SEGMENT_BYTES),
    "remote.storage.enable": "false",
}
PRODUCER = {"linger.ms": 50, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "compression.type": "none", "acks": "all"}
CONSUMER = {"enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"}
"""Every fetch setting at librdkafka's default (fetch.max.bytes 52428800, max.partition.fetch.bytes 1048576)."""

CONSUME_TIMEOUT_S = 0.05
"""`Consumer.consume(10000, timeout)` hands over a batch short of 10000 records only at the timeout (or with the
end-of-partition event): a long timeout would be added to every read whose last batch is short (a compacted tier
of 8000 records took 1.0 s with 1 s), so a short one bounds the delay."""
STOCK_RLMM = "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
TIMED_RLMM = "dev.kcompact.tiered.TimedRemoteLogMetadataManager"
LISTING_CACHE_S = 2.0
"""kcompact's metadata manager reads the table's new commits every `kcompact.metadata.follow.ms` (1000 by default), so
the broker serves a compaction's swap within that time: the compacted read starts after it (else its first fetches
walk the replaced segments, which stay readable until `kcompact gc`)."""
COPY_LINE = re.compile(r"^\[(\S+ \S+)\] INFO .*(Copying|Copied) (\d{20})\.log to remote storage")


def overrides(manager: str, store: ObjectStore) -> dict[str, str]:
    """kcompact's storage manager either way; the metadata manager kcompact's, or Kafka's default
    (`STOCK_RLMM`) behind the plugin's `TimedRemoteLogMetadataManager`, which passes every call on and publishes its
    latency as kcompact's manager publishes its own; on one broker it needs its metadata topic at replication factor
    1 and the listener its clients use."""
    props = plugin_overrides(store)
    if manager == "stock":
        props = {k: v for k, v in props.items() if not k.startswith("rlmm.config.")}
        props["remote.log.metadata.manager.class.name"] = TIMED_RLMM
        props["rlmm.config.kcompact.timed.delegate"] = STOCK_RLMM
        props["remote.log.metadata.manager.listener.name"] = "PLAINTEXT"
        props["rlmm.config.remote.log.metadata.topic.replication.factor"] = "1"
    return props


def produce(broker: KafkaBroker, shape: dict[str, int], volume: int) -> dict[str, Any]:
    """Keyed updates until `volume` bytes of keys and values: key i*7919 mod keys, so every key recurs about
    volume / (keys * record size) times, values cut from one random buffer (uncompressed: nothing to gain)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, **PRODUCER})
    blob = os.urandom(1 << 20)
    value_bytes, keys, key_fmt = shape["value_bytes"], shape["keys"], b"%0" + str(shape["key_bytes"]).encode() + b"d"
    count = volume // (value_bytes + shape["key_bytes"])
    started = time.monotonic()
    for i in range(count):
        at = (i * 4099) % (len(blob) - value_bytes)
        while True:
            try:
                producer.produce(TOPIC, key=key_fmt % ((i * 7919) % keys), value=blob[at : at + value_bytes])
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise RuntimeError("the producer did not deliver everything within 300 s")
    return {"records": count, "payload_bytes": count * (value_bytes + shape["key_bytes"]),
            "seconds": time.monotonic() - started}


def set_remote_storage(broker: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC, incremental_configs=[
        ConfigEntry("remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)
    del admin


def log_segments(broker: KafkaBroker) -> dict[str, int]:
    """The partition's local .log files and their sizes, by base offset (20 digits)."""
    return {p.stem: p.stat().st_size for p in broker.partition_dir(TOPIC, 0).glob("*.log")}


def copy_events(broker: KafkaBroker) -> dict[str, dict[str, float]]:
    """Per segment (base offset): when the broker logged "Copying" and "Copied", in seconds since the epoch of the
    broker's own log clock (its lines carry milliseconds)."""
    out: dict[str, dict[str, float]] = {}
    for line in broker.server_log.read_text(errors="replace").splitlines():
        m = COPY_LINE.match(line)
        if m:
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.setdefault(m.group(3), {})[m.group(2)] = at
    return out


def settled(broker: KafkaBroker) -> bool:
    """Every local copy deleted: one .log left, empty (local retention deletes a segment only once it is tiered,
    and rolls a non-empty active segment once it is due, so everything below it is in the tier)."""
    logs = log_segments(broker)
    return len(logs) == 1 and next(iter(logs.values())) == 0


def tier(broker: KafkaBroker) -> dict[str, Any]:
    """Switches tiering on and times it (see the module's docstring for what the interval covers)."""
    logs = log_segments(broker)
    active = max(logs)
    rolled = {base: size for base, size in logs.items() if base != active}
    load_before, switched = os.getloadavg()[0], time.time()
    set_remote_storage(broker)
    wait_for("every rolled segment copied", lambda: rolled.keys() <= {
        b for b, e in copy_events(broker).items() if "Copied" in e}, broker, deadline_s=DEADLINE_S)
    load_after = os.getloadavg()[0]
    events = copy_events(broker)
    first = min(events[b]["Copying"] for b in rolled)
    last = max(events[b]["Copied"] for b in rolled)
    wait_for("the broker deleted every local copy", lambda: settled(broker), broker, deadline_s=DEADLINE_S)
    return {"segments": len(rolled), "bytes": sum(rolled.values()), "seconds": last - first,
            "mb_s": sum(rolled.values()) / (last - first) / 1e6, "before_first_copy_seconds": first - switched,
            "tail_bytes": logs[active], "load": [load_before, load_after]}


def read_tier(broker: KafkaBroker, tier_bytes: int) -> dict[str, Any]:
    """A fresh consumer from offset 0 to the end of the partition, every record's key and value touched; MB/s is
    `tier_bytes` (the segments it went through) over the time from its assignment to its last record. The
    end-of-partition event can come later than the last record (with the answer to a later fetch): kept apart as
    `eof_seconds`, not counted."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"p9-{time.time_ns()}", **CONSUMER})
    load_before, started = os.getloadavg()[0], time.monotonic()
    records = payload = 0
    last_record = started
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        while time.monotonic() < started + DEADLINE_S:
            batch = c.consume(10_000, CONSUME_TIMEOUT_S)
            last = batch[-1].error() if batch else None
            eof = last is not None and last.code() == KafkaError._PARTITION_EOF
            if eof:
                batch.pop()
            for m in batch:
                if m.error() is not None:
                    raise RuntimeError(f"consumer error: {m.error()}")
                records += 1
                payload += len(m.key() or b"") + len(m.value() or b"")
            if batch:
                last_record = time.monotonic()
            if eof:
                break
        else:
            raise TimeoutError(f"the consumer did not reach the end within {DEADLINE_S} s")
        eof_seconds = time.monotonic() - started
    finally:
        c.close()
    seconds = last_record - started
    return {"records": records, "payload_bytes": payload, "tier_bytes": tier_bytes, "seconds": seconds,
            "eof_seconds": eof_seconds, "mb_s": tier_bytes / seconds / 1e6, "load": [load_before, os.getloadavg()[0]]}


def java_read(broker: KafkaBroker, records: int, tier_bytes: int) -> dict[str, Any]:
    """The same read by Kafka's own Java consumer (`kafka-consumer-perf-test`, read_committed, its other settings at
    their defaults), right after the Python one: it tells the broker's serving rate from the Python client's cost
    per record. Its fetch time excludes its JVM start and group join; MB/s = `tier_bytes` over it."""
    config = broker.workdir / "perf-consumer.properties"
    config.write_text("isolation.level=read_committed\n")
    cmd = [java(), "-Xmx512m", f"-Dlog4j2.configurationFile={LOG4J}", f"-Dkafka.logs.dir={broker.workdir / 'logs'}",
           "-cp", classpath(), "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", broker.bootstrap,
           "--topic", TOPIC, "--num-records", str(records), "--group", f"perf-{time.time_ns()}",
           "--command-config", str(config), "--timeout", str(int(DEADLINE_S * 1000))]
    load_before = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, check=True)
    header, row = [line for line in done.stdout.splitlines() if line.count(",") >= 9][-2:]
    stats = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")], strict=True))
    if int(stats["data.consumed.in.nMsg"]) != records:
        raise RuntimeError(f"kafka-consumer-perf-test read {stats['data.consumed.in.nMsg']} of {records} records")
    seconds = float(stats["fetch.time.ms"]) / 1000
    return {"records": records, "tier_bytes": tier_bytes, "seconds": seconds, "mb_s": tier_bytes / seconds / 1e6,
            "load": [load_before, os.getloadavg()[0]]}


def store_log_bytes(store_dir: Path) -> tuple[int, int]:
    """What the stock manager's tier holds: the .log objects in the store (nothing compacts or deletes them)."""
    logs = list(store_dir.rglob("*.log"))
    return len(logs), sum(p.stat().st_size for p in logs)


def table_log_bytes(store: ObjectStore) -> tuple[int, int]:
    """What kcompact's manager serves: its live segments, as its metadata table lists them."""
    live = table_in_store(store).live_segments(TOPIC, 0)
    return len(live), sum(s.segment_size_bytes for s in live)


def table_records(store: ObjectStore) -> int | None:
    """The records the live segments hold, as their rows say (None if a row does not say)."""
    counts = [s.record_count for s in table_in_store(store).live_segments(TOPIC, 0)]
    return None if None in counts else sum(c for c in counts if c is not None)


def compact(store: ObjectStore, workdir: Path) -> dict[str, Any]:
    """`kcompact compact`, a fresh process, as a scheduled run would be (its Spark start included)."""
    config = workdir / "kcompact.yaml"
    config.write_text(f"topics:\n  {TOPIC}:\n    cleanup.policy: compact\n    min.cleanable.dirty.ratio: 0.01\n")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "compaction.cli", "compact", "--store", store.uri, "--config", str(config)],
                   check=True, capture_output=True, text=True)
    return {"seconds": time.monotonic() - started}


def reads(run: dict[str, Any], part: str, broker: KafkaBroker, segments: int, size: int) -> None:
    """The Python consumer's read as `part`, then the Java one's of as many records as `part + "_java"`."""
    run[part] = {"segments": segments, **read_tier(broker, size)}
    run[part + "_java"] = java_read(broker, run[part]["records"], size)


def one_run(shape: dict[str, int], manager: str, volume: int, workdir: Path,
            topic_config: dict[str, str] = TOPIC_CONFIG) -> dict[str, Any]:
    """A fresh broker: produce, read the local log (the same consumer before any remote fetch), tier, read the
    tier; on kcompact's manager also compact and read again."""
    store_dir = workdir / "store"
    store = open_store(str(store_dir))
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=overrides(manager, store),
                         heap="1g", start_timeout=180)
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(TOPIC, 1, 1, config=topic_config)]).values():
            f.result(60)
        del admin
        run: dict[str, Any] = {"manager": manager, "produced": produce(broker, shape, volume)}
        reads(run, "read_local", broker, 0, sum(log_segments(broker).values()))
        run["tiering"] = tier(broker)
        segments, size = table_log_bytes(store) if manager == "kcompact" else store_log_bytes(store_dir)
        reads(run, "read", broker, segments, size)
        if manager == "kcompact":
            run["compaction"] = compact(store, workdir)
            time.sleep(LISTING_CACHE_S + 1)
            segments, size = table_log_bytes(store)
            reads(run, "read_compacted", broker, segments, size)
            run["read_compacted"]["listed_records"] = table_records(store)
    finally:
        broker.stop()
    return run


def _medians(runs: list[dict[str, Any]], part: str) -> dict[str, float]:
    got = [r[part] for r in runs if part in r]
    return {"mb_s": median(x["mb_s"] for x in got), "seconds": median(x["seconds"] for x in got)} if got else {}


def bench_broker(scale: float = 1.0, runs: int = RUNS) -> dict[str, Any]:
    """P9: every shape on both managers `runs` times, alternated; medians per shape and manager. `--quick` shrinks
    the segments with the volume (Kafka's least segment.bytes is 1 MiB), so that some segments roll."""
    volume, segment = int(VOLUME_BYTES * scale), max(2**20, int(SEGMENT_BYTES * scale))
    topic_config = {**TOPIC_CONFIG, "segment.bytes": str(segment)}
    root = Path(tempfile.mkdtemp(prefix="p9-"))
    done: list[dict[str, Any]] = []
    try:
        for i in range(runs):
            for s, shape in enumerate(SHAPES):
                for manager in (("kcompact", "stock") if (i + s) % 2 == 0 else ("stock", "kcompact")):
                    workdir = root / f"{s}-{manager}-{i}"
                    print(f"P9: shape {s} {manager} run {i + 1}/{runs}", file=sys.stderr, flush=True)
                    done.append({"shape": s, **one_run(shape, manager, volume, workdir, topic_config)})
                    shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = []
    for s in range(len(SHAPES)):
        for manager in ("kcompact", "stock"):
            mine = [r for r in done if r["shape"] == s and r["manager"] == manager]
            figures.append({"shape": s, "manager": manager, **{part: _medians(mine, part) for part in (
                "read_local", "read_local_java", "tiering", "read", "read_java", "read_compacted",
                "read_compacted_java")}})
    return {"shapes": SHAPES, "volume_bytes": volume, "segment_bytes": segment, "topic_config": topic_config,
            "producer": PRODUCER, "consumer": CONSUMER, "stock_rlmm": STOCK_RLMM, "runs": done, "medians": figures}
