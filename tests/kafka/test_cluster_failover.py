"""A leader change never halts the tier, nor makes a consumer see what kcompact compacted away (issue 40).

Three KRaft nodes (tests/kafka_cluster.py) tier one partition, replicated three times (min ISR 2), through
kcompact's plugin into one shared store on a moto S3 server; each node runs its own plugin processes.

Replicas roll apart: each node draws every segment's roll point on append for itself, from the topic's segment.ms and
segment.jitter.ms (`SEGMENT_MS`, `ROLL_JITTER_MS`; LogSegment.shouldRoll, LogConfig.randomSegmentJitter), and rolls
its non-empty active segment from its own retention check once the segment is past local.retention.ms
(UnifiedLog.deleteOldSegments), at its own log end. So the successor of a leader that dies with part of its log not
tiered usually holds a segment straddling the tier's end. Kafka's RemoteLogManager copies that whole segment: the
metadata table must take it from where the old leader stopped (before the fix it refused it, MetadataInvariantError
"live segments ... overlap", and the new leader retried forever), and the new leader's local retention must then
remove what it holds below the tier's end, or its consumers read uncompacted records below kcompact's cleaner offset
(before the fix: 277 superseded records in one run).

One cluster serves the module (CI time); the tests run in file order, each leaving the three nodes running (one
restarts the node the one before left down):
- the leader SIGKILLed where its successor straddles the tier's end: the new leader tiers on from exactly the old
  one's last offset, the live rows stay contiguous, no node logs a MetadataInvariantError, and consumers from offset 0
  (read_committed, read_uncommitted) get every record once;
- the deposed leader, started again, writes nothing live and rejoins the ISR as a follower;
- a leader frozen (SIGSTOP) past its session, woken up after its successor tiered under a newer epoch: nothing it
  writes goes live (a copy it tries is refused by leader epoch), it rejoins the ISR;
- the leader SIGKILLed while a copy is in flight: the same as the first;
- `kcompact compact` while the successor holds records below the cleaner offset, then the leader killed; the leader
  killed between a run's stage and its commit (the run must still commit: the new leader's rows are above what it
  replaces); a preferred-leader election instead of a kill: once local retention ran on the new leader, consumers get
  exactly the compacted view;
- a replica taken off a node and put back by reassignments rebuilds from the compacted tier, joins the ISR, and once
  elected serves the compacted view.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

import compaction
from compaction.metadata import broker_writer
from compaction.storage import StoreSpec
from tests.kafka.tiered import (
    TOPIC,
    Tier,
    Writer,
    create_tiered_topic,
    local_log_start,
    plugin_overrides,
    read_all,
    tier_settled,
    wait_for,
)
from tests.kafka_cluster import KafkaCluster
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, REGION, UNSET_AWS_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OLD_MS = 3_600_000
"""Where the replicas should roll apart (`_catch_where_the_successor_straddles`), records are timestamped as by a
clock stopped an hour back: each one ms after the last (Writer's age_ms), so they fall behind the wall clock by a
second every second of the stream."""
SEGMENT_MS, ROLL_JITTER_MS = 200, 150
"""The topic's segment.ms and segment.jitter.ms: each node rolls each segment on append once its records' timestamps
span 50 to 200 ms (50 to 200 records of a stream, `OLD_MS`), a span it draws for itself when it opens the segment
(LogConfig.randomSegmentJitter), so the replicas roll apart about once a step. With segment.ms 1000 and no jitter a
follower rolled only every 1,000 records of a stream: a catch took 4 to 8 looks on a quiet machine and timed out at
240 s on a loaded one (CI of 15db77e)."""
CONFIG = (f"topics:\n  {TOPIC}:\n    cleanup.policy: compact\n    min.cleanable.dirty.ratio: 0.01\n"
          "    segment.bytes: 8192\n")
"""kcompact's config for the topic. Its compacted output comes in several segments (grouped by segment.bytes, as
Kafka's cleaner groups them), so a consumer from offset 0 crosses from the tier into the leader's local log at a
segment boundary, below the cleaner offset if the leader's local log starts there."""
REFUSALS = re.compile(r"MetadataInvariantError[^\n]*")


@dataclass(frozen=True)
class Caught:
    """A leader caught (frozen) at a moment a test waited for: who, who takes over if it goes, where the tier ended
    then, and the successor's local segment (start, end) holding the next offset to tier, if it starts at or below
    the tier's end (it overlaps the tier)."""

    leader: int
    successor: int
    tier_end: int
    straddling: tuple[int, int] | None


@dataclass
class ClusterTier(Tier[KafkaCluster]):
    """The module's cluster and store, what was produced, the kills so far and kcompact's config for the topic."""

    config: str = ""
    kills: list[Caught] = field(default_factory=list)
    left_down: set[int] = field(default_factory=set)  # killed nodes a later test starts again

    @property
    def cluster(self) -> KafkaCluster:
        return self.broker

    def leader(self) -> int:
        return self.cluster.leader_of(TOPIC, 0)

    def successor(self) -> int:
        """Who the controller elects if the leader goes: the first replica of the assignment in the ISR."""
        leader, isr = self.leader(), self.cluster.isr(TOPIC, 0)
        return next(n for n in self.cluster.replicas(TOPIC, 0) if n != leader and n in isr)

    def tier_end(self) -> int:
        live = self.live()
        return live[-1].end_offset if live else -1

    def local_segments(self, node: int) -> list[tuple[int, int]]:
        """The node's local segments of the partition as (base offset, size in bytes), oldest first."""
        found = []
        for path in self.cluster.nodes[node].partition_dir(TOPIC, 0).glob("*.log"):
            try:  # the broker's local retention may delete a segment between the listing and its stat
                found.append((int(path.stem), path.stat().st_size))
            except FileNotFoundError:
                continue
        return sorted(found)

    def settled_on(self, node: int) -> bool:
        """The node leads, tiered everything below its empty active segment and its local retention removed the rest:
        only the active segment is left."""
        broker = self.cluster.nodes[node]
        return tier_settled(self, broker) and len(self.local_segments(node)) == 1

    def refusals(self) -> list[str]:
        """Every MetadataInvariantError any node logged (the metadata table refusing a broker's commit)."""
        return [f"node {n}: {m}" for n, text in self.cluster.server_logs() for m in REFUSALS.findall(text)]

    def contiguous(self) -> bool:
        live = self.live()
        return bool(live) and live[0].start_offset == 0 and all(
            a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))

    def rows(self) -> str:
        """The partition's rows, for a failure's message."""
        return "\n".join(f"{s.start_offset}-{s.end_offset} {s.state.name} {s.writer} "
                         f"epochs={[(e.epoch, e.start_offset) for e in s.segment_leader_epochs]} {s.segment_id}"
                         for s in sorted(self.partition().segments, key=lambda s: (s.start_offset, s.end_offset)))


@pytest.fixture(scope="module")
def cluster_tier(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str,
                 spark: SparkSession) -> Iterator[ClusterTier]:
    """The cluster (its nodes, their plugin processes and Spark's workers see fake credentials only), tiering until
    the leader has tiered three segments and deleted them locally, and read back once from offset 0 (which also
    creates the consumer offsets topic while every node runs)."""
    workdir = tmp_path_factory.mktemp("cluster-failover")
    executor_env = spark.sparkContext.environment
    saved = {k: executor_env.get(k) for k in FAKE_AWS_ENV}
    with pytest.MonkeyPatch.context() as env:
        for name, value in FAKE_AWS_ENV.items():
            env.setenv(name, value)
        for name in UNSET_AWS_ENV:
            env.delenv(name, raising=False)
        executor_env.update(FAKE_AWS_ENV)
        store = StoreSpec.parse(f"s3://{BUCKET}/cluster-{uuid.uuid4().hex[:12]}", endpoint_url=moto_endpoint,
                                region=REGION).open()
        cluster = KafkaCluster(workdir / "kafka", overrides=plugin_overrides(store), jars=["tiered-plugin"])
        tier = ClusterTier(cluster, store, [], config=str(workdir / "kcompact.yaml"))
        try:
            cluster.start_all()
            create_tiered_topic(cluster, replicas=3, segment_ms=SEGMENT_MS,
                                extra={"segment.jitter.ms": str(ROLL_JITTER_MS)})
            tier.writer = Writer(tier)
            leader = tier.leader()
            wait_for("the leader tiered 3 segments and deleted them locally",
                     lambda: local_log_start(cluster.nodes[leader]) > 0 and len(tier.live()) >= 3, cluster,
                     step=tier.writer.round)
            assert read_all(cluster, len(tier.uncompacted())) == tier.uncompacted()
            (workdir / "kcompact.yaml").write_text(CONFIG)
            yield tier
        finally:
            tier.writer = None  # its producers go before the brokers do
            cluster.kill_all()
            for k, v in saved.items():
                if v is None:
                    executor_env.pop(k, None)
                else:
                    executor_env[k] = v


@pytest.fixture(autouse=True)
def nodes_up_after_a_test(cluster_tier: ClusterTier) -> Iterator[None]:
    """After each test every node runs, unfrozen, and is in the ISR, even when the test failed half way, so that the
    next one does not fail for it; but a node the test left down on purpose for the next (`left_down`) stays down."""
    yield
    tier = cluster_tier
    for n, node in tier.cluster.nodes.items():
        if n in tier.cluster.running():
            tier.cluster.thaw(n)
        elif n not in tier.left_down:
            node.start()
    up = sorted(tier.cluster.running())
    wait_for(f"nodes {up} in the ISR", lambda: tier.cluster.isr(TOPIC, 0) == up, tier.cluster)


def _straddling(segments: list[tuple[int, int]], tier_end: int) -> tuple[int, int] | None:
    """The local segment (start, end) holding offset tier_end + 1 if it starts at or below tier_end and is not the
    active one: the segment a new leader copies first, overlapping the tier."""
    for (base, _), (next_base, _) in itertools.pairwise(segments):
        if base <= tier_end < next_base - 1:
            return base, next_base - 1
    return None


CATCH_DEADLINE_S = 240.0

def _catch_the_leader(tier: ClusterTier, when: Callable[[int, int, int], bool], what: str,
                      step: Callable[[], None]) -> Caught:
    """Runs `step` until `when(leader, successor, tier_end)` holds with the leader frozen (SIGSTOP, its plugin
    processes too: it tiers nothing while we look), and returns with it still frozen."""
    leader, successor = tier.leader(), tier.successor()
    caught: list[Caught] = []

    def look() -> bool:
        tier.cluster.freeze(leader)
        end = tier.tier_end()
        if when(leader, successor, end):
            caught.append(Caught(leader, successor, end, _straddling(tier.local_segments(successor), end)))
            return True
        tier.cluster.thaw(leader)
        return False

    try:
        # a moment of the nodes' own retention checks, not a bound on kcompact: on a slow machine it can take
        # longer than the other waits' deadline to come round
        wait_for(what, look, tier.cluster, step=step, deadline_s=CATCH_DEADLINE_S)
    except AssertionError as e:
        raise AssertionError(f"{e}\nnode {successor}'s local segments (base, bytes): "
                             f"{tier.local_segments(successor)}; the tier ends at {tier.tier_end()}") from None
    return caught[0]


def _kill(tier: ClusterTier, caught: Caught) -> None:
    """SIGKILLs the caught leader and waits until its successor leads."""
    tier.cluster.kill(caught.leader)
    tier.kills.append(caught)
    wait_for(f"node {caught.successor} leads after node {caught.leader} was killed",
             lambda: tier.leader() == caught.successor, tier.cluster)


def _catch_where_the_successor_straddles(tier: ClusterTier) -> Caught:
    """Catches the leader once its successor holds a segment straddling the tier's end.

    Each step streams 120 records, whose timestamps lag the clock (`OLD_MS`, so soon past local.retention.ms): every
    node rolls on append where its own jitter says (`ROLL_JITTER_MS`) and at its own retention checks, so the leader
    tiers segments whose ends fall inside the successor's."""
    assert tier.writer is not None
    writer = tier.writer

    def straddles(leader: int, successor: int, end: int) -> bool:
        return _straddling(tier.local_segments(successor), end) is not None

    return _catch_the_leader(tier, straddles,
                             "the successor's segment holding the next offset to tier starts below the tier's end",
                             lambda: writer.updates(120, pace_s=0.01, age_ms=OLD_MS))


def _tiers_on(tier: ClusterTier, node: int) -> None:
    """Produces a round through the new leader and waits until it has tiered everything and its local retention ran;
    fails at once if a node logs that the metadata table refused it, with the rows, the node's local segments and,
    after a compaction, what a consumer from offset 0 gets below the cleaner offset."""
    assert tier.writer is not None
    tier.writer.round()

    def settled() -> bool:
        refused = tier.refusals()
        if refused:
            raise AssertionError("\n".join(refused[:3]) + f"\nnode {node}'s local segments "
                                 f"{tier.local_segments(node)}; rows:\n{tier.rows()}\n{_superseded_read(tier)}")
        return tier.settled_on(node)

    wait_for(f"node {node} tiered everything and its local retention ran", settled, tier.cluster)


def _superseded_read(tier: ClusterTier) -> str:
    """What a read_committed consumer from offset 0 gets now, if kcompact compacted: how many records below the
    cleaner offset it gets that compaction removed."""
    if not tier.cleaned:
        return ""
    expected = tier.view(committed=True)
    got = read_all(tier.cluster, len(expected))
    superseded = [r for r in got if r[0] < tier.cleaned and r not in set(expected)]
    return (f"a consumer from offset 0 got {len(superseded)} superseded records below the cleaner offset "
            f"{tier.cleaned}, the first {superseded[:3]}")


def _every_record_once(tier: ClusterTier) -> None:
    for committed, isolation in ((True, "read_committed"), (False, "read_uncommitted")):
        expected = tier.view(committed=committed)
        got = read_all(tier.cluster, len(expected), isolation)
        assert got == expected, f"{isolation}: {len(got)} records, expected {len(expected)}"


def _restart(tier: ClusterTier, node: int) -> None:
    tier.cluster.start(node)
    wait_for(f"node {node} back in the ISR", lambda: node in tier.cluster.isr(TOPIC, 0), tier.cluster)


def test_a_new_leader_tiers_on_from_where_the_killed_one_stopped(cluster_tier: ClusterTier) -> None:
    """Killed where its successor's next segment to tier starts below the tier's end, the leader's successor copies
    that segment and the table takes it from the old leader's last offset on."""
    tier = cluster_tier
    kill = _catch_where_the_successor_straddles(tier)
    _kill(tier, kill)
    tier.left_down.add(kill.leader)  # the next test starts it again
    _tiers_on(tier, kill.successor)
    assert tier.contiguous(), tier.rows()
    live = tier.live()
    assert live[-1].end_offset > kill.tier_end
    after = [s for s in live if s.end_offset > kill.tier_end]
    assert after[0].start_offset == kill.tier_end + 1, tier.rows()
    assert {s.writer for s in after} == {broker_writer(kill.successor)}, tier.rows()
    assert not tier.refusals()
    _every_record_once(tier)


def test_the_deposed_leader_started_again_writes_nothing_live_and_follows(cluster_tier: ClusterTier) -> None:
    """Started again after the kill, the old leader is a follower: whatever it tried to tier was refused by leader
    epoch (FencedError), nothing it wrote since is live, and it catches up into the ISR."""
    tier = cluster_tier
    kill = tier.kills[-1]
    writer = broker_writer(kill.leader)
    before = {s.segment_id for s in tier.partition().segments if s.writer == writer}
    log = tier.cluster.nodes[kill.leader].server_log
    log_before = log.stat().st_size
    tier.left_down.discard(kill.leader)
    _restart(tier, kill.leader)
    _tiers_on(tier, tier.leader())
    live_since = [s for s in tier.live() if s.writer == writer and s.segment_id not in before]
    assert not live_since, tier.rows()
    since = log.read_bytes()[log_before:].decode(errors="replace")
    failed_copies = [line for line in since.splitlines() if "Error occurred while copying" in line]
    assert all("FencedError" in line for line in failed_copies), failed_copies[:3]
    assert kill.leader in tier.cluster.isr(TOPIC, 0)
    _every_record_once(tier)


def test_a_leader_frozen_past_its_session_is_refused_by_leader_epoch_when_it_wakes(cluster_tier: ClusterTier) -> None:
    """A zombie leader: its copy of the next segment is on its way to the metadata table (its metadata process is
    stopped, so the copy's one commit waits in its pipe, the objects written) when the whole node is frozen past its
    session. The controller fences it, its successor leads and tiers records written under the newer leader epoch.
    Woken up, the old leader's copy reaches the table under the old epoch and is refused (FencedError, which the
    plugin logs); nothing it writes goes live, and it rejoins the ISR as a follower."""
    tier = cluster_tier
    assert tier.writer is not None
    writer = tier.writer

    def copy_due(leader: int, successor: int, end: int) -> bool:
        return any(base == end + 1 for base, _ in tier.local_segments(leader)[:-1])

    caught = _catch_the_leader(tier, copy_due, "the leader has rolled a segment it has not started to copy",
                               lambda: writer.updates(60, pace_s=0.01, age_ms=OLD_MS))
    zombie, successor = broker_writer(caught.leader), broker_writer(caught.successor)
    log = tier.cluster.nodes[caught.leader].server_log
    log_before = log.stat().st_size

    def logged(text: str) -> bool:
        return text in log.read_bytes()[log_before:].decode(errors="replace")

    tier.cluster.thaw(caught.leader, plugin=False)
    tier.cluster.thaw_plugin(caught.leader, module="compaction.remote_storage")
    # its copy may have been on its way already when it was caught: the whole log, not only what came since
    wait_for(f"node {caught.leader} copies {caught.tier_end + 1} (its commit waiting in the pipe)",
             lambda: f"Copying {caught.tier_end + 1:020d}.log to remote storage" in log.read_text(errors="replace"),
             tier.cluster)
    base = f"/{caught.tier_end + 1:020d}-"

    def copied() -> bool:  # the copy's five objects (log, indexes, producer snapshot, epochs), named by no row yet
        named = {o.key for s in tier.partition().segments for o in s.object_keys}
        return len([o for o in tier.store.list() if base in o.key and o.key not in named]) >= 5

    wait_for(f"node {caught.leader} wrote the objects of its copy of {caught.tier_end + 1}", copied, tier.cluster)
    tier.cluster.freeze(caught.leader)
    wait_for(f"node {caught.successor} leads while node {caught.leader} is frozen",
             lambda: tier.leader() == caught.successor, tier.cluster)
    # The records under the new leader's epoch go through a new producer, bootstrapped from the other nodes: the
    # writer's own would send to the frozen leader first and wait out its request timeout. Not an idempotent one: its
    # producer id would wait for the transaction coordinator, which may have been the frozen node too.
    others = [tier.cluster.nodes[n].bootstrap for n in tier.cluster.nodes if n != caught.leader]
    fresh = Producer({"bootstrap.servers": ",".join(others), "acks": "all", "enable.idempotence": False})
    old_epoch = max(e.epoch for s in tier.partition().segments for e in s.segment_leader_epochs)
    wait_for(f"node {caught.successor} tiered a segment written under a newer epoch than {old_epoch}",
             lambda: any(s.writer == successor and s.segment_leader_epochs[-1].epoch > old_epoch
                         for s in tier.live()), tier.cluster,
             step=lambda: writer.updates(60, pace_s=0.01, age_ms=OLD_MS, via=fresh))
    before = {s.segment_id for s in tier.partition().segments if s.writer == zombie}
    tier.cluster.thaw(caught.leader)
    wait_for(f"node {caught.leader}'s copy refused by leader epoch", lambda: logged("FencedError"), tier.cluster)
    wait_for(f"node {caught.leader} back in the ISR", lambda: caught.leader in tier.cluster.isr(TOPIC, 0),
             tier.cluster)
    _tiers_on(tier, caught.successor)
    refused = [line for line in log.read_bytes()[log_before:].decode(errors="replace").splitlines()
               if "refused" in line]
    assert refused and all("FencedError" in line and f"found {old_epoch} (segment" in line for line in refused), (
        refused[:3])
    written = [s for s in tier.partition().segments if s.writer == zombie and s.segment_id not in before]
    assert not written, tier.rows()
    assert tier.contiguous(), tier.rows()
    _every_record_once(tier)


def test_a_leader_killed_mid_copy_is_taken_over_from_its_last_finished_segment(cluster_tier: ClusterTier) -> None:
    """Killed between its addRemoteLogSegmentMetadata and its COPY_SEGMENT_FINISHED, the leader leaves no row (the
    plugin holds a copy in the broker until it finishes); its successor tiers from the last finished segment's end on.

    The leader's store process is stopped first, so its next copy starts and stays in flight until the kill (a copy
    takes ~100 ms: waiting to catch one by chance failed under load)."""
    tier = cluster_tier
    leader, successor = tier.leader(), tier.successor()
    log = tier.cluster.nodes[leader].server_log
    log_before = log.stat().st_size
    tier.cluster.freeze_store(leader)

    def copying() -> bool:
        since = log.read_bytes()[log_before:].decode(errors="replace")
        return f"Copying {tier.tier_end() + 1:020d}.log to remote storage" in since

    assert tier.writer is not None
    writer = tier.writer
    wait_for("the leader has a copy in flight", copying, tier.cluster, step=lambda: writer.updates(20))
    tier.cluster.freeze(leader)
    end = tier.tier_end()
    kill = Caught(leader, successor, end, _straddling(tier.local_segments(successor), end))
    _kill(tier, kill)
    _tiers_on(tier, kill.successor)
    assert tier.contiguous(), tier.rows()
    after = [s for s in tier.live() if s.end_offset > kill.tier_end]
    assert after[0].start_offset == kill.tier_end + 1, tier.rows()
    assert not [s for s in tier.partition().segments if s.writer == broker_writer(leader)
                and s.start_offset > kill.tier_end], tier.rows()
    assert not tier.refusals()
    _every_record_once(tier)
    _restart(tier, kill.leader)


def _compact(tier: ClusterTier, spark: SparkSession) -> None:
    report = compaction.compact(spark, tier.store, tier.config).to_dict()
    assert [p["committed"] for p in report["partitions"]] == [True], json.dumps(report, default=str)[:3000]
    tier.cleaned = tier.partition().lineage.current


def _halt_tiering_where_the_successor_straddles(tier: ClusterTier) -> Caught:
    """The leader caught where its successor straddles the tier's end, then running on with its plugin processes
    stopped: it leads and takes records, but tiers nothing more, so the tier's end stays inside the successor's
    segment while kcompact compacts up to it."""
    caught = _catch_where_the_successor_straddles(tier)
    tier.cluster.thaw(caught.leader, plugin=False)
    assert tier.writer is not None
    tier.writer.round()
    return caught


def _the_compacted_view(tier: ClusterTier) -> None:
    """Consumers from offset 0 get exactly the compacted view; a failure counts the records below the cleaner
    offset that compaction had removed."""
    for committed, isolation in ((True, "read_committed"), (False, "read_uncommitted")):
        expected = tier.view(committed=committed)
        assert len(expected) < len(tier.uncompacted())
        got = read_all(tier.cluster, len(expected), isolation)
        superseded = [r for r in got if r[0] < tier.cleaned and r not in set(expected)]
        assert got == expected, (f"{isolation}: {len(got)} records, expected {len(expected)}; {len(superseded)} "
                                 f"superseded below the cleaner offset {tier.cleaned}: {superseded[:5]}")


def _the_successor_serves_the_compacted_view(tier: ClusterTier, caught: Caught) -> None:
    """After the kill: the successor tiers on with the live rows contiguous, consumers get the compacted view, and
    the killed node is started again for the next test."""
    _tiers_on(tier, caught.successor)
    assert tier.contiguous(), tier.rows()
    _the_compacted_view(tier)
    _restart(tier, caught.leader)


def test_after_a_compaction_a_new_leader_serves_the_compacted_view(cluster_tier: ClusterTier,
                                                                    spark: SparkSession) -> None:
    """kcompact compacts the tier while the leader's successor holds records below the cleaner offset, then the
    leader is killed: once the new leader's local retention ran, a consumer from offset 0 gets the compacted view,
    not the new leader's local copies of what kcompact removed."""
    tier = cluster_tier
    caught = _halt_tiering_where_the_successor_straddles(tier)
    _compact(tier, spark)
    assert caught.straddling is not None and caught.straddling[0] < tier.cleaned, (caught, tier.cleaned)
    _kill(tier, caught)
    _the_successor_serves_the_compacted_view(tier, caught)


def test_a_leader_killed_between_a_compactions_stage_and_commit(cluster_tier: ClusterTier,
                                                               spark: SparkSession) -> None:
    """kcompact plans and stages a run while the leader's successor straddles the tier's end; the leader is killed;
    the new leader's first copy goes live trimmed above the tier's end while the run waits; then the run commits: the
    broker's rows are above everything it replaces, so it is rebased onto them. Once local retention ran on the new
    leader, consumers get the compacted view."""
    tier = cluster_tier
    caught = _halt_tiering_where_the_successor_straddles(tier)
    staged = compaction.stage(spark, compaction.plan(spark, tier.store, tier.config))
    _kill(tier, caught)
    successor = broker_writer(caught.successor)
    wait_for(f"node {caught.successor}'s first copy is live", lambda: any(s.writer == successor for s in tier.live()),
             tier.cluster)
    compaction.commit(staged)
    tier.cleaned = tier.partition().lineage.current
    assert caught.straddling is not None and caught.straddling[0] < tier.cleaned, (caught, tier.cleaned)
    _the_successor_serves_the_compacted_view(tier, caught)


def test_after_a_compaction_a_preferred_leader_election_serves_the_compacted_view(cluster_tier: ClusterTier,
                                                                                   spark: SparkSession) -> None:
    """No kill: the same, with the leadership moved by a preferred-leader election (the follower made preferred by a
    reassignment of the replicas' order). The deposed leader's plugin processes resume after the election, so its
    copy in flight lands after the new leader took over."""
    tier = cluster_tier
    leader = tier.leader()
    target = next(n for n in tier.cluster.replicas(TOPIC, 0) if n != leader)
    order = [target, *(n for n in tier.cluster.replicas(TOPIC, 0) if n != target)]
    tier.cluster.reassign(TOPIC, 0, order)
    wait_for(f"the assignment is {order}", lambda: tier.cluster.assigned(TOPIC, 0, order), tier.cluster)
    caught = _halt_tiering_where_the_successor_straddles(tier)
    assert caught.successor == target
    _compact(tier, spark)
    assert caught.straddling is not None and caught.straddling[0] < tier.cleaned, (caught, tier.cleaned)
    tier.cluster.elect_preferred_leader(TOPIC, 0)
    wait_for(f"node {target} leads", lambda: tier.leader() == target, tier.cluster)
    tier.cluster.thaw_plugin(caught.leader)
    _tiers_on(tier, target)
    assert tier.contiguous(), tier.rows()
    assert not tier.refusals()
    _the_compacted_view(tier)


def test_a_replica_moved_back_rebuilds_from_the_compacted_tier_and_leads_with_the_same_view(
        cluster_tier: ClusterTier, spark: SparkSession) -> None:
    """A reassignment takes the partition off a node (which deletes its replica) and, once kcompact compacted the
    whole tier, puts it back first in the assignment. The new replica starts far behind the leader's local log start:
    it builds its leader epochs and producer state from the remote segment below that start (kcompact's compacted
    one, RemoteLogManager's buildRemoteLogAuxState) and joins the ISR; elected, it serves the compacted view and
    takes the idempotent and transactional producers on."""
    tier = cluster_tier
    assert tier.writer is not None
    leader = tier.leader()
    moved = next(n for n in tier.cluster.replicas(TOPIC, 0) if n != leader)
    rest = [n for n in tier.cluster.replicas(TOPIC, 0) if n != moved]
    tier.cluster.reassign(TOPIC, 0, rest)
    wait_for(f"the partition is on {rest} only", lambda: tier.cluster.assigned(TOPIC, 0, rest)
             and not tier.cluster.nodes[moved].partition_dir(TOPIC, 0).exists(), tier.cluster)
    tier.writer.round()
    wait_for(f"node {leader} tiered everything", lambda: tier.settled_on(leader), tier.cluster)
    _compact(tier, spark)
    last = tier.live()[-1]
    assert not last.by_broker and last.end_offset + 1 == tier.cleaned, tier.rows()
    order = [moved, *rest]
    tier.cluster.reassign(TOPIC, 0, order)
    wait_for(f"node {moved} rebuilt its replica and joined the ISR", lambda: tier.cluster.assigned(TOPIC, 0, order),
             tier.cluster)
    assert tier.local_segments(moved)[0][0] == tier.cleaned, tier.local_segments(moved)
    tier.cluster.elect_preferred_leader(TOPIC, 0)
    wait_for(f"node {moved} leads", lambda: tier.leader() == moved, tier.cluster)
    _tiers_on(tier, moved)
    assert tier.contiguous(), tier.rows()
    _the_compacted_view(tier)
