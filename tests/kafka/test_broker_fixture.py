"""The fixture's own contract: a broker that serves, takes a compacted topic, and is gone after stop()."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka_runtime import KAFKA_VERSION, KafkaBroker


def test_broker_serves_produce_and_fetch_then_stops(kafka_broker: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for f in admin.create_topics([NewTopic("fixture", 1, 1, config={"cleanup.policy": "compact"})]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    for i in range(20):
        producer.produce("fixture", key=b"k%d" % (i % 5), value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["fixture"])
    got = []
    while len(got) < 20:
        msg = consumer.poll(10)
        assert msg is not None, f"only {len(got)} records read back"
        assert msg.error() is None, msg.error()
        got.append((msg.offset(), msg.key(), msg.value()))
    consumer.close()
    assert [o for o, _, _ in got] == list(range(20))
    assert (kafka_broker.partition_dir("fixture", 0) / "00000000000000000000.log").is_file()
    assert KAFKA_VERSION in kafka_broker.server_log.read_text()

    kafka_broker.stop()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", kafka_broker.port)) != 0, "the broker still listens after stop()"


def test_a_broker_whose_chosen_port_was_taken_starts_again_on_new_ports(
        kafka_runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`free_port` frees the port it found before the JVM binds it, so another process may take it in between (a
    CI run lost a broker to "Address already in use" so): a broker alone whose ports it chose starts again on new
    ports and a fresh log dir. Here the first port handed out is one this test keeps listening on."""
    import tests.kafka_runtime as runtime

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = runtime.free_port
        monkeypatch.setattr(runtime, "free_port", lambda: next(ports, None) or real())
        broker = KafkaBroker(tmp_path / "kafka").start()
        try:
            assert broker.port != taken.getsockname()[1]
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            assert admin.list_topics(timeout=10).brokers
        finally:
            broker.stop()
