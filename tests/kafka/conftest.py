"""Tests where Kafka itself is the referee: a real KRaft broker, Kafka's cleaner and Kafka's tools, from the jars
`make kafka` resolves (tests/kafka_runtime.py). Every test here is marked `kafka` (`make test-fast` leaves them out:
they need a JVM); none is skipped when the runtime is missing: the fixture fails naming `make kafka`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.kafka_runtime import KafkaBroker, KafkaRuntimeMissing, classpath


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def kafka_runtime() -> str:
    """The runtime's classpath; fails (never skips) when `make kafka` has not run."""
    try:
        return classpath()
    except KafkaRuntimeMissing as e:
        pytest.fail(str(e), pytrace=False)


BrokerFactory = Callable[..., KafkaBroker]


@pytest.fixture
def kafka_broker_factory(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """Starts brokers on demand (`factory(overrides={...})`); every one started is stopped at teardown."""
    started: list[KafkaBroker] = []

    def start(overrides: Mapping[str, str] | None = None, **kw: object) -> KafkaBroker:
        broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), overrides=dict(overrides or {}), **kw)  # type: ignore[arg-type]
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def kafka_broker(kafka_broker_factory: BrokerFactory) -> KafkaBroker:
    """One single-node KRaft broker on 127.0.0.1 with free ports, stopped after the test."""
    return kafka_broker_factory()


# The shared local[2] SparkSession of tests/spark/, for the tests here that compare kcompact's Spark path with Kafka.
from tests.spark.conftest import spark  # noqa: E402, F401
