"""docs/broker.md, run as pasted: its commands start a single-node broker from `make kafka`'s jars with
`conf/kafka-broker.properties`, which tiers a topic through kcompact's plugin into a local store; its properties
block keeps every comment on a line of its own; and a broker whose store setting carries a trailing `# comment`
(what the block had before) stops at start-up naming it, instead of tiering into a directory called
`store            # or ...`."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compaction.metadata import table_in_store
from compaction.storage import open_store
from tests.kafka.tiered import plugin_overrides
from tests.kafka_runtime import KafkaBroker

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "broker.md").read_text()
HOME = Path("/tmp/kcompact-broker")  # conf/kafka-broker.properties's log.dirs and store live here
BOOTSTRAP = "127.0.0.1:9092"


def _section() -> str:
    """The page's start-one-broker and settings sections: from its first heading to "## Metrics"."""
    start = DOC.index("## One broker, from the checkout")
    return DOC[start:DOC.index("\n## Metrics", start)]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", _section(), re.S)


def java_properties(text: str) -> dict[str, str]:
    """What java.util.Properties makes of `text`'s lines (no continuation lines here): `#`/`!` lines are comments,
    the value is everything after the first `=` or `:` but its leading blanks, a trailing `# ...` included."""
    props = {}
    for line in text.splitlines():
        line = line.lstrip()
        if line and line[0] not in "#!":
            key, value = [*re.split(r"\s*[=:]\s*", line, maxsplit=1), ""][:2]
            props[key] = value
    return props


def test_the_properties_block_keeps_comments_on_lines_of_their_own() -> None:
    (block,) = _blocks("properties")
    props = java_properties(block)
    assert not [k for k, v in props.items() if re.search(r"\s", v)], "a value Java would read with a comment in it"
    for name in ("kcompact.store", "kcompact.python", "kcompact.endpoint.url"):
        assert props[f"rsm.config.{name}"] == props[f"rlmm.config.{name}"]
    shipped = java_properties((ROOT / "conf/kafka-broker.properties").read_text())
    for key in ("remote.log.storage.system.enable", "remote.log.storage.manager.class.name",
                "remote.log.metadata.manager.class.name"):
        assert props[key] == shipped[key]


def test_the_documented_broker_starts_tiers_and_stops_as_pasted() -> None:
    (start,) = [b for b in _blocks("bash") if "kafka.Kafka conf/kafka-broker.properties" in b]
    (stop,) = re.findall(r"`(pkill -f '[^']+')`", _section())
    shutil.rmtree(HOME, ignore_errors=True)
    subprocess.run(["bash", "-euo", "pipefail", "-c", start], cwd=ROOT, check=True, timeout=300)
    try:
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        _wait("the broker answers", lambda: bool(_brokers(admin)))
        config = {"remote.storage.enable": "true", "cleanup.policy": "delete", "retention.ms": "-1",
                  "retention.bytes": "-1", "local.retention.ms": "1000", "segment.ms": "1000"}
        for f in admin.create_topics([NewTopic("readme", 1, 1, config=config)]).values():
            f.result(30)
        producer = Producer({"bootstrap.servers": BOOTSTRAP})
        store = open_store(str(HOME / "store"))
        sent = 0

        def produce_and_look() -> bool:
            nonlocal sent
            for _ in range(20):
                producer.produce("readme", key=b"k%d" % (sent % 7), value=b"v%d" % sent)
                sent += 1
            producer.flush(30)
            try:
                return len(table_in_store(store).live_segments("readme", 0)) >= 2
            except Exception:  # the broker's first copy creates the table
                return False

        _wait("two segments tiered into /tmp/kcompact-broker/store", produce_and_look)
        _wait("local retention removed a tiered segment",
              lambda: min(int(p.stem) for p in (HOME / "data/readme-0").glob("*.log")) > 0)
        consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "readme", "enable.auto.commit": False})
        consumer.assign([TopicPartition("readme", 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < sent and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.offset())  # type: ignore[arg-type]
        consumer.close()
        assert got == list(range(sent)), "every record from offset 0, the tiered ones through the plugin"
    finally:
        subprocess.run(["bash", "-c", stop], cwd=ROOT, timeout=60)
    _wait("the broker stopped", lambda: subprocess.run(["pgrep", "-f", "kafka.Kafka conf/kafka-broker.properties"],
                                                        capture_output=True).returncode != 0)


def test_a_store_setting_with_a_trailing_comment_stops_the_broker(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    overrides = plugin_overrides(store)
    overrides["rsm.config.kcompact.store"] = f"{store.uri}            # or a local directory: /path/to/store"
    broker = KafkaBroker(tmp_path / "kafka", jars=["tiered-plugin"], overrides=overrides, start_timeout=120)
    try:
        broker.start()
        raise AssertionError("the broker started with a store setting holding a comment")
    except RuntimeError as e:
        assert "exited" in str(e), e
    finally:
        broker.stop()
    log = broker.server_log.read_text(errors="replace")
    assert f"rsm.config.kcompact.store is '{store.uri}            # or a local directory" in log
    assert "lines of their own" in log


def _brokers(admin: AdminClient) -> list[object]:
    try:
        return list(admin.list_topics(timeout=2).brokers)
    except Exception:  # not serving yet
        return []


def _wait(what: str, condition: object, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.5)
    log = HOME / "logs/server.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.is_file() else ""
    raise AssertionError(f"not within {deadline_s} s: {what}\n{tail}")
