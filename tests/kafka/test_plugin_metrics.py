"""The plugin's metrics, read from a running broker over JMX with Kafka's own `JmxTool`: KIP-877 plugin metrics of
both managers (`dev.kcompact.tiered.TierMetrics`), under `kafka.server:type=plugins`. The broker tiers a topic
through the plugin and a consumer reads it back from the tier; then the metadata process is killed under the
broker, whose next metadata call fails and starts a new one. The metrics must show each of those."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction.storage import open_store
from tests.kafka.tiered import (
    Tier,
    Writer,
    create_tiered_topic,
    local_log_start,
    plugin_overrides,
    read_all,
    wait_for,
)
from tests.kafka_runtime import KafkaBroker, free_port, run_tool

RSM = "config=remote.log.storage.manager.class.name"
RLMM = "config=remote.log.metadata.manager.class.name"


@pytest.fixture(scope="module")
def tier(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    workdir = tmp_path_factory.mktemp("metrics")
    store = open_store(str(workdir / "store"))
    jmx = free_port()
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=plugin_overrides(store), jvm_args=[
        f"-Dcom.sun.management.jmxremote.port={jmx}", f"-Dcom.sun.management.jmxremote.rmi.port={jmx}",
        "-Dcom.sun.management.jmxremote.authenticate=false", "-Dcom.sun.management.jmxremote.ssl=false",
        "-Djava.rmi.server.hostname=127.0.0.1"])
    broker.start()
    tier = Tier(broker, store, [])
    tier.report["jmx"] = jmx
    try:
        create_tiered_topic(broker)
        writer = Writer(tier)
        wait_for("the broker tiered 2 segments and deleted them locally",
                 lambda: local_log_start(broker) > 0 and len(tier.live()) >= 2, broker, step=writer.round)
        tier.writer = writer
        yield tier
    finally:
        broker.stop()


def plugin_metrics(tier: Tier) -> dict[str, float]:
    """Every `kafka.server:type=plugins` attribute the broker's JMX shows, as `<object name>:<attribute>` -> value."""
    url = f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{tier.report['jmx']}/jmxrmi"
    done = run_tool("org.apache.kafka.tools.JmxTool", ["--jmx-url", url, "--object-name", "kafka.server:type=plugins,*",
                                                       "--one-time", "true", "--report-format", "properties"],
                    logs_dir=tier.broker.workdir / "logs", timeout=120)
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        m = re.match(r"(kafka\.server:type=plugins,.+?)=(-?[0-9.E+-]+|NaN)$", line.strip())
        if m and m.group(2) != "NaN":
            out[m.group(1)] = float(m.group(2))
    return out


def metric(metrics: dict[str, float], manager: str, name: str, **tags: str) -> float:
    """The one value of `name` of `manager` carrying `tags` (JMX lists an object's attributes as `name:attribute`)."""
    found = [v for k, v in metrics.items() if manager in k and k.endswith(":" + name)
             and set(k.split(":")[1].split(",")[3:]) == {f"{t}={v}" for t, v in tags.items()}]
    assert len(found) == 1, f"{manager} {name} {tags}: {found} in {sorted(metrics)}"
    return found[0]


def test_copies_fetches_and_metadata_calls_are_counted(tier: Tier) -> None:
    records = [r for r in tier.produced if not r.aborted]
    assert len(read_all(tier.broker, len(records))) == len(records)
    # the live segments first: the broker may finish another copy meanwhile, and a segment is live only once its
    # copy returned (the counters then hold it), so counters read afterwards cover every one of them
    live = tier.live()
    m = plugin_metrics(tier)
    copies = metric(m, RSM, "calls-total", op="copy")
    assert copies >= len(live), "a copy per tiered segment"
    assert metric(m, RSM, "bytes-total", op="copy") >= sum(s.segment_size_bytes for s in live)
    assert metric(m, RSM, "latency-max-ms", op="copy") > 0
    assert metric(m, RSM, "calls-total", op="fetch") >= 1, "the consumer read the tier"
    assert metric(m, RSM, "bytes-total", op="fetch") > 0
    assert metric(m, RSM, "calls-total", op="fetch-index") >= 1
    assert metric(m, RLMM, "calls-total", op="addRemoteLogSegmentMetadata") >= copies
    # a copy whose RSM call returned may not have had its COPY_SEGMENT_FINISHED update yet; a live segment has
    assert metric(m, RLMM, "calls-total", op="updateRemoteLogSegmentMetadata") >= len(live)
    assert metric(m, RLMM, "calls-total", op="copy") >= 1, "a copy's one commit, at its finish"
    assert metric(m, RLMM, "latency-avg-ms", op="copy") > 0
    assert metric(m, RLMM, "cache-hits-total", cache="listing") + metric(
        m, RLMM, "cache-misses-total", cache="listing") > 0
    assert metric(m, RLMM, "python-queue-depth") >= 0 and metric(m, RLMM, "python-restarts-total") == 0
    assert metric(m, RSM, "python-queue-depth") == 0, "a local store has no Python process"


def test_a_stalled_then_killed_metadata_process_shows_in_queue_depth_errors_and_restarts(tier: Tier) -> None:
    """The metadata process stops answering (SIGSTOP) while the broker tiers: its calls queue up (the gauge says
    so); killed (SIGKILL), the call in flight fails as ProcessGone and the next call starts a new process."""
    pids = subprocess.run(["pgrep", "-f", f"compaction.remote_log_metadata --store {tier.store.uri}"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert len(pids) == 1, pids
    writer = tier.writer
    assert writer is not None
    os.kill(int(pids[0]), signal.SIGSTOP)
    try:
        wait_for("a metadata call waits for the stopped process",
                 lambda: metric(plugin_metrics(tier), RLMM, "python-queue-depth") >= 1, tier.broker, step=writer.round)
    finally:
        os.kill(int(pids[0]), signal.SIGKILL)
    before = len(tier.live())
    wait_for("the broker tiered again after its metadata process died",
             lambda: len(tier.live()) > before, tier.broker, step=writer.round)
    m = plugin_metrics(tier)
    assert metric(m, RLMM, "python-restarts-total") >= 1
    failed = {k: v for k, v in m.items() if RLMM in k and k.endswith(":errors-total") and "kind=ProcessGone" in k}
    assert sum(failed.values()) >= 1, sorted(k for k in m if k.endswith(":errors-total"))


def test_the_metrics_are_named_in_the_broker_doc() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "broker.md").read_text()
    for name in ("calls-total", "latency-avg-ms", "bytes-total", "errors-total", "cache-hits-total",
                 "python-queue-depth", "python-restarts-total"):
        assert name in doc, name
