"""Kafka itself, from the jars `make kafka` resolves into .kafka/libs (kafka/runtime/pom.xml, kafka/pom.xml's version).

`KafkaBroker` is a KRaft node (broker and controller in one JVM) on 127.0.0.1 with free ports, its log dirs under a
directory of the caller's: a single-node cluster by default, or one voter of several (`voters`, a shared
`cluster_uuid`: tests/kafka_cluster.py); `run_tool` runs one of Kafka's command-line classes
(`kafka.tools.DumpLogSegments`, the cleaner harness) on the same classpath. Nothing here skips: without the
runtime, a test fails naming `make kafka`.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
KAFKA_HOME = ROOT / ".kafka"
LIBS = KAFKA_HOME / "libs"
LOG4J = ROOT / "kafka" / "runtime" / "log4j2.properties"


def _pinned_kafka_version() -> str:
    """`kafka.version` of kafka/pom.xml, the one place it is pinned (every Maven module under kafka/ inherits it)."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    found = ElementTree.parse(ROOT / "kafka" / "pom.xml").find("m:properties/m:kafka.version", namespace)
    assert found is not None and found.text, "kafka/pom.xml pins kafka.version"
    return found.text


KAFKA_VERSION = _pinned_kafka_version()


class KafkaRuntimeMissing(RuntimeError):
    pass


def classpath(*extra_jars: str) -> str:
    """The runtime's classpath (and the named harness jars under .kafka/), or KafkaRuntimeMissing naming the target."""
    if not (LIBS / ".resolved").is_file():
        raise KafkaRuntimeMissing(f"Kafka's jars are not in {LIBS}: run `make kafka` (Maven Central)")
    jars = []
    for name in extra_jars:
        jar = KAFKA_HOME / f"{name}.jar"
        if not jar.is_file():
            raise KafkaRuntimeMissing(f"{jar} is not built: run `make kafka`")
        jars.append(str(jar))
    return os.pathsep.join([*jars, str(LIBS / "*")])


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def run_tool(main_class: str, args: Sequence[str], *, jars: Sequence[str] = (), logs_dir: Path | None = None,
             timeout: float = 300, check: bool = True, heap: str = "512m") -> subprocess.CompletedProcess[str]:
    """Runs one of Kafka's (or a harness's) main classes; CalledProcessError carries its stdout and stderr."""
    logs = logs_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    cmd = [java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile={LOG4J}",
           f"-Dkafka.logs.dir={logs}", "-cp", classpath(*jars), main_class, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_id() -> str:
    """What `kafka-storage.sh random-uuid` prints: a UUID in URL-safe base64, without padding, never starting with
    '-' (StorageTool would read it as an option; Kafka's `Uuid.randomUuid` draws again too)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


BROKER_DEFAULTS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "log.cleaner.backoff.ms": "200",
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
}


@dataclass
class KafkaBroker:
    """One KRaft node on 127.0.0.1. `start()` formats its log dir, starts it and waits until it answers a metadata
    request; `stop()` (also on a failed start) ends it: SIGTERM, then SIGKILL after `stop_timeout` seconds.

    Alone it is node 1 of a cluster of its own. As one node of several, it is given its `node_id`, its ports, the
    `controller.quorum.voters` of all (`voters`) and the cluster's id (`cluster_uuid`), and `launch()` starts it
    without waiting: a voter can only serve once a quorum of them runs."""

    workdir: Path
    overrides: Mapping[str, str] = field(default_factory=dict)
    jars: Sequence[str] = ()
    heap: str = "768m"
    jvm_args: Sequence[str] = ()  # more JVM options, e.g. remote JMX for a test that reads the broker's metrics
    start_timeout: float = 90.0
    stop_timeout: float = 30.0
    port: int = 0
    controller_port: int = 0
    node_id: int = 1
    voters: str = ""
    cluster_uuid: str = ""
    process: subprocess.Popen[bytes] | None = None
    _formatted: bool = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def server_log(self) -> Path:
        return self.workdir / "logs" / "server.log"

    def properties(self) -> dict[str, str]:
        props = dict(BROKER_DEFAULTS)
        props.update({
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir),
        })
        props.update(self.overrides)
        return props

    def start(self) -> KafkaBroker:
        """Launches the node and waits until it serves. A node alone whose ports `launch()` chose, and which exits
        because another process bound one of them in between (`free_port` frees its port before the JVM binds it:
        a client's outgoing connection may take it), is started again on new ports and a new log dir, up to three
        times; any other failure is raised."""
        chosen = not self.port and not self.voters
        for attempt in range(3):
            self.launch()
            try:
                self.wait_serving()
                return self
            except BaseException as exc:
                self.stop()
                if not (chosen and attempt < 2 and "Address already in use" in str(exc)):
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)  # never served: nothing in it to keep
                self._formatted, self.port, self.controller_port = False, 0, 0
        raise AssertionError("unreachable")

    def launch(self) -> None:
        """Formats the log dir (the first time) and starts the JVM, without waiting for it to serve."""
        if not self.port:
            self.port, self.controller_port = free_port(), free_port()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if not self._formatted:
            run_tool("kafka.tools.StorageTool", ["format", "-t", self.cluster_uuid or cluster_id(), "-c", str(config)],
                     logs_dir=self.workdir / "logs", timeout=120)
            self._formatted = True
        cmd = [java(), "-Xms128m", f"-Xmx{self.heap}", *self.jvm_args, "-XX:+UseSerialGC",
               f"-Dlog4j2.configurationFile={LOG4J}",
               f"-Dkafka.logs.dir={self.workdir / 'logs'}", "-cp", classpath(*self.jars), "kafka.Kafka", str(config)]
        stderr = open(self.workdir / "logs" / "stderr.log", "ab")  # noqa: SIM115 (kept for the process's life)
        self.process = subprocess.Popen(cmd, stdout=stderr, stderr=stderr, start_new_session=True)
        stderr.close()

    def restart(self) -> KafkaBroker:
        """Stops (cleanly, as `kafka-server-stop.sh`) and starts the same node on the same ports and log dirs."""
        self.stop()
        return self.start()

    def wait_serving(self) -> None:
        """Returns once the node answers a metadata request naming a broker; a node that exits or does not serve
        within `start_timeout` fails, with its logs' tails."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.process.returncode} while starting: "
                                   f"{self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError:
                time.sleep(0.2)
                continue
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
            try:
                meta = admin.list_topics(timeout=5)
                if meta.brokers:
                    return
            except Exception:  # not yet: the controller may still be electing itself
                time.sleep(0.2)
        raise TimeoutError(f"Kafka broker did not serve on {self.bootstrap} within {self.start_timeout} s: "
                           f"{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        """The last `lines` of the node's stderr and server.log, for a failure's message."""
        out = []
        for log in (self.workdir / "logs" / "stderr.log", self.server_log):
            if log.is_file():
                out.append(f"--- {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean shutdown marker, recovery on the next start."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def cleaner_checkpoint(self) -> dict[tuple[str, int], int]:
        """The broker's cleaner-offset-checkpoint (a version line, a count, then `topic partition offset`)."""
        path = self.data_dir / "cleaner-offset-checkpoint"
        if not path.is_file():
            return {}
        lines = path.read_text().split("\n")
        out: dict[tuple[str, int], int] = {}
        for line in lines[2:]:
            if line.strip():
                topic, partition, offset = line.split()
                out[(topic, int(partition))] = int(offset)
        return out

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
