"""A three-node Kafka cluster on 127.0.0.1, for what one broker cannot show: a partition's leader changing.

Each node is a `KafkaBroker` (tests/kafka_runtime.py) running broker and controller in one JVM; all of them are
controller voters, so any one may be killed and a quorum stays. They share one cluster id and know each other's
controller ports from the start (`controller.quorum.voters`). Internal topics are replicated three times with a
min ISR of 2, so transactions and consumer groups go on with one node down. Leadership moves only when a test moves
it (`auto.leader.rebalance.enable=false`), and a killed node is fenced within `broker.session.timeout.ms` (4 s here,
instead of 9) so its partitions' leadership moves soon.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, PartitionMetadata

from tests.kafka_runtime import KafkaBroker, cluster_id, run_tool

CLUSTER_DEFAULTS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "auto.leader.rebalance.enable": "false",
    "unclean.leader.election.enable": "false",
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "4000",
}


def listen_port(chosen: set[int]) -> int:
    """A free port of 127.0.0.1 below the kernel's ephemeral range (and not in `chosen`, which it joins). A node
    killed and started again listens on the same ports, and one from the ephemeral range may meanwhile have become
    the local port of some outgoing connection (tried: a restarted node's controller listener failed to bind,
    "Address already in use", and the quorum went on without it)."""
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(10_000, ephemeral_start)
        if port in chosen:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.add(port)
        return port


@dataclass
class KafkaCluster:
    """Nodes 1..`size`, each under `workdir/node-<id>`, with `overrides` on top of `CLUSTER_DEFAULTS`. `start_all()`
    starts every node and waits until each serves; `kill(n)` is SIGKILL (a crash), `start(n)` brings the node back
    on the same ports and log dirs; `stop_all()` stops whatever runs (also after a failed start)."""

    workdir: Path
    overrides: Mapping[str, str] = field(default_factory=dict)
    jars: Sequence[str] = ()
    size: int = 3
    heap: str = "640m"
    nodes: dict[int, KafkaBroker] = field(init=False)
    _admin: tuple[str, AdminClient] | None = field(default=None, init=False, repr=False)
    _frozen: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        chosen: set[int] = set()
        ports = {n: (listen_port(chosen), listen_port(chosen)) for n in range(1, self.size + 1)}
        voters = ",".join(f"{n}@127.0.0.1:{controller}" for n, (_, controller) in ports.items())
        uuid = cluster_id()
        self.nodes = {
            n: KafkaBroker(self.workdir / f"node-{n}", overrides={**CLUSTER_DEFAULTS, **self.overrides},
                           jars=self.jars, heap=self.heap, port=port, controller_port=controller, node_id=n,
                           voters=voters, cluster_uuid=uuid)
            for n, (port, controller) in ports.items()
        }

    @property
    def bootstrap(self) -> str:
        """The nodes running now and not frozen (all of them if none is): a frozen one holds a request until the
        client's timeout."""
        up = [self.nodes[n].bootstrap for n in self.running() if n not in self._frozen]
        return ",".join(up or [b.bootstrap for b in self.nodes.values()])

    def start_all(self) -> KafkaCluster:
        """Formats and launches every node at once (a voter waits for a quorum), then waits until each serves."""
        try:
            with ThreadPoolExecutor(self.size) as pool:
                list(pool.map(KafkaBroker.launch, self.nodes.values()))
            for node in self.nodes.values():
                node.wait_serving()
        except BaseException:
            self.stop_all()
            raise
        return self

    def stop_all(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def kill_all(self) -> None:
        """SIGKILL every node: a clean stop of three voters takes ~30 s (the last ones wait for a quorum that
        is going away), and nothing is kept after a test anyway."""
        for node in self.nodes.values():
            node.kill()

    def kill(self, node: int) -> None:
        """SIGKILL node `node` and its children (the plugin's Python processes): a crash."""
        self.nodes[node].kill()
        self._frozen.discard(node)

    def freeze(self, node: int) -> None:
        """SIGSTOP the node and its children: it does nothing (and tiers nothing) until `thaw`; the controller fences
        it once `broker.session.timeout.ms` passes without a heartbeat."""
        self._signal(node, signal.SIGSTOP)
        self._frozen.add(node)

    def thaw(self, node: int, *, plugin: bool = True) -> None:
        """SIGCONT the frozen node, and its plugin processes unless `plugin` is False: those stay stopped (as by
        `freeze_plugin`)."""
        self._frozen.discard(node)
        if plugin:
            self._signal(node, signal.SIGCONT)
        else:
            process = self.nodes[node].process
            assert process is not None and process.poll() is None, f"node {node} is not running"
            os.kill(process.pid, signal.SIGCONT)

    def _signal(self, node: int, sig: signal.Signals) -> None:
        process = self.nodes[node].process
        assert process is not None and process.poll() is None, f"node {node} is not running"
        os.killpg(process.pid, sig)

    def freeze_plugin(self, node: int) -> list[int]:
        """SIGSTOP the processes the node's JVM started (the plugin's Python processes, for its metadata table and
        its store): the broker runs on, leads and replicates, but its tiering halts at its next call into them. The
        processes stopped; `thaw_plugin` resumes them, a kill of the node ends them (its process group)."""
        children = self.plugin_processes(node)
        assert children, f"node {node} runs no plugin process"
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        return children

    def thaw_plugin(self, node: int, *, module: str | None = None) -> None:
        """SIGCONT the node's plugin processes; with `module`, only those running `python -m <module>`."""
        for pid in self.plugin_processes(node, module=module):
            os.kill(pid, signal.SIGCONT)

    def freeze_store(self, node: int) -> list[int]:
        """SIGSTOP the node's store process only (`compaction.remote_storage`, which copies segment bytes for the
        RemoteStorageManager): the metadata process runs on, so the node's next copy starts (its add, held in the
        broker) and then waits, in flight, for as long as the store stays stopped. A kill of the node ends it."""
        stores = self.plugin_processes(node, module="compaction.remote_storage")
        assert stores, f"node {node} runs no store process"
        for pid in stores:
            os.kill(pid, signal.SIGSTOP)
        return stores

    def plugin_processes(self, node: int, *, module: str | None = None) -> list[int]:
        """The node JVM's child processes, found by their parent in /proc; with `module`, only those running
        `python -m <module>`."""
        process = self.nodes[node].process
        assert process is not None, f"node {node} is not running"
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                argv = (stat.parent / "cmdline").read_bytes().split(b"\0") if module else []
            except (OSError, IndexError, ValueError):
                continue
            if ppid == process.pid and (module is None or module.encode() in argv):
                found.append(int(stat.parent.name))
        return found

    def start(self, node: int) -> KafkaBroker:
        """Starts a stopped or killed node again, on the same ports and log dirs (a second JVM for a running node
        would fail to bind them, and the first one would run on unseen)."""
        assert node not in self.running(), f"node {node} runs already"
        return self.nodes[node].start()

    def running(self) -> list[int]:
        return [n for n, b in self.nodes.items() if b.process is not None and b.process.poll() is None]

    def admin(self) -> AdminClient:
        """An AdminClient bootstrapped from the nodes running now, kept while they run (a client must outlive the
        futures it returns: a collected one fails them with _DESTROY). One that knew a node since killed keeps
        sending it requests, so a kill or a start makes a new one."""
        bootstrap = self.bootstrap
        if self._admin is None or self._admin[0] != bootstrap:
            self._admin = (bootstrap, AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}))
        return self._admin[1]

    def partition(self, topic: str, partition: int) -> PartitionMetadata:
        """The partition as the cluster's metadata says now (a Metadata request to any running node: the
        AdminClient's describe_topics waits for a "controller", which in KRaft is any broker, a killed one too)."""
        metadata: PartitionMetadata = self.admin().list_topics(topic, timeout=10).topics[topic].partitions[partition]
        return metadata

    def leader_of(self, topic: str, partition: int) -> int:
        """The partition's leader: -1 while it has none (or no running node answers)."""
        try:
            return int(self.partition(topic, partition).leader)
        except KafkaException:
            return -1

    def isr(self, topic: str, partition: int) -> list[int]:
        return sorted(self.partition(topic, partition).isrs)

    def replicas(self, topic: str, partition: int) -> list[int]:
        """The assignment in order: its first node is the preferred leader."""
        return list(self.partition(topic, partition).replicas)

    def elect_preferred_leader(self, topic: str, partition: int) -> None:
        """A preferred-leader election (kafka-leader-election.sh --election-type PREFERRED), through the AdminClient.

        Raises:
            KafkaException: the election failed, e.g. the preferred leader is not in the ISR or leads already.
        """
        results = self.admin().elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, partition)]).result(30)
        for tp, error in results.items():
            if error is not None:
                raise RuntimeError(f"preferred leader election of {tp.topic}-{tp.partition} failed: {error}")

    def reassign(self, topic: str, partition: int, replicas: Sequence[int]) -> None:
        """Starts moving the partition onto `replicas` (in that order: the first is the preferred leader) with
        Kafka's own kafka-reassign-partitions tool (confluent_kafka's AdminClient has no AlterPartitionReassignments);
        `assigned` says when it is done."""
        plan = self.workdir / f"reassign-{topic}-{partition}-{time.monotonic_ns()}.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": partition, "replicas": list(replicas)}]}))
        done = run_tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                        ["--bootstrap-server", self.bootstrap, "--reassignment-json-file", str(plan), "--execute"],
                        logs_dir=self.workdir, timeout=120, heap="256m", check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kafka-reassign-partitions to {list(replicas)} exited {done.returncode}: "
                               f"{done.stdout[-1500:]} {done.stderr[-1500:]}")

    def assigned(self, topic: str, partition: int, replicas: Sequence[int]) -> bool:
        """Whether the partition sits on exactly `replicas`, in that order, every one in the ISR: a reassignment to
        them is done (while one runs, the assignment lists the replicas being added and removed too)."""
        p = self.partition(topic, partition)
        return list(p.replicas) == list(replicas) and set(p.isrs) == set(replicas)

    def server_logs(self) -> Iterator[tuple[int, str]]:
        """Every node's server.log (rotated ones too) as text."""
        for n, node in self.nodes.items():
            for log in sorted(node.server_log.parent.glob("server.log*")):
                yield n, log.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(f"=== node {n}\n{node.tail(lines)}" for n, node in self.nodes.items())

    def __enter__(self) -> KafkaCluster:
        return self.start_all()

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
