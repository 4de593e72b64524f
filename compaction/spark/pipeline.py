"""The compaction data path on Spark, for every partition of a run at once: scan → winners → skip → rewrite.

1. **Scan** (`compaction.spark.scan`): every dirty segment, and clean segments without a filter (building it),
   fetched into the run's segment cache when it fits the disk budget, so the rewrite does not fetch them again.
2. **Winners** (`compaction.spark.winners.best_per_key`): the best rank per (tp, key) and whether the key is
   dirty; persisted, since the filter test and the rewrite both read it (without the key bytes when no
   partition has a clean segment: then nothing after the count needs them).
3. **Skip** (`compaction.spark.skipping`): the clean segments' filters against the dirty keys; a segment that
   may hold none, and that nothing else forces to be rewritten, is kept (`compaction.bloom.skipping`).
4. **Rescan** the clean segments to rewrite that the first scan did not read (their filter said they may hold a
   dirty key), cached as well, and fold their keys into the winners: every winner is known before any chunk is
   rewritten, and each segment is still fetched once.
5. **Rewrite** (`compaction.spark.rewrite_job`): the driver regroups what is left (kept segments end groups,
   chunks within the disk budget), gives each chunk the transaction-marker state at its start (from the
   transactional and control batches the scans saw: `compaction.strategies.transactions.states_at`) and each
   chunk becomes a task of its own, so one hot partition uses every core. Nothing is visible until the driver
   commits the metadata.

Jobs per run: the scan with its aggregate (collected as per-partition key counts), the filter test when there
are clean segments with filters, the rescan when some of them must be rewritten, and the rewrite.

When every chunk is known before the scan (`_units_before_scan`: no partition has a clean segment, as in a first
compaction), steps 1, 2 and 5 are one job instead (`_scan_and_rewrite`): no persisted winners, no counting job,
one shuffle when each partition has one chunk, two when some have several. A later chunk's marker-walk state is
found by its rewrite task from the batches the scan kept in the run's cache (`rewrite_job.learned_state`); where
they are not on its machine it is assumed (no transactional batch before it) and checked after the scan
(`_states_held`), and a partition where it does not hold is staged again step by step. A run's fixed cost is
mostly Spark's per-job and per-stage cost in a JVM not yet warm (`make bench` P5), so the job count is what sets it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyspark import Accumulator, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compaction.bloom.filter import FilterFacts
from compaction.bloom.skipping import Verdict, merge_small, verdict
from compaction.errors import KcompactError
from compaction.metadata.model import ObjectSuffix, SegmentMetadata
from compaction.rewrite.cache import SegmentCache, cache_dir, cache_fits
from compaction.rewrite.upload import ChunkResult, check_budget
from compaction.run.tasks import TP, PartitionTask, PartitionWork, SegmentScanTask
from compaction.spark.rewrite_job import RewriteUnit, UnitOutcome, run_rewrites
from compaction.spark.scan import PartitionScan, ScanSettings, ScanTracker, scan_rows
from compaction.spark.skipping import FilterProbe, ProbeOutcome, ProbeResult, probe_filters
from compaction.spark.winners import CHUNK_SLOT, best_per_key, chunk_winners, slot_keys
from compaction.storage.base import StoreSpec, StoreStats
from compaction.strategies.transactions import TransactionState, TxnEvent, states_at


@dataclass
class PartitionStage:
    """What staging did for one partition: its final task, the chunks rewritten, the filter test, counters."""

    task: PartitionTask
    chunks: list[ChunkResult] = field(default_factory=list)  # in offset order
    kept: tuple[SegmentMetadata, ...] = ()
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # clean segment id -> verdict
    probes: dict[str, ProbeResult] = field(default_factory=dict)  # clean segment id -> filter test result
    scan: PartitionScan = field(default_factory=PartitionScan)
    dirty_keys: int = 0
    keys: int = 0  # distinct keys among the scanned segments
    chunk_count: int = 0
    peak_temp_bytes: int = 0
    cache_hits: int = 0
    requests: StoreStats = field(default_factory=StoreStats)  # scan + filters + rewrite
    rewrite_task_ids: set[int] = field(default_factory=set)  # the Spark tasks (slots) that rewrote its chunks
    true_dirty: dict[str, int] = field(default_factory=dict)  # rescanned clean segment id -> dirty keys it holds
    error: KcompactError | None = None

    @property
    def rewrite_tasks(self) -> int:
        return len(self.rewrite_task_ids)

    def fail(self, error: KcompactError) -> None:
        self.error = self.error or error


@dataclass(frozen=True)
class StageResult:
    """Per partition what staging did, and the wall time of each phase (for the whole run)."""

    partitions: dict[TP, PartitionStage]
    map_seconds: float
    rewrite_seconds: float


def stage_partitions(spark: SparkSession, spec: StoreSpec, works: Sequence[PartitionWork], run_id: str,
                     temp_dir: str | None = None) -> StageResult:
    """Run scan → winners → skip → rescan → rewrite for `works`. Uploads outputs (fresh ids) and the filters
    built on the way; commits nothing."""
    if not works:
        return StageResult({}, 0.0, 0.0)
    started = time.monotonic()
    directory = cache_dir(temp_dir, run_id)
    works = [replace(w, task=replace(w.task, cache_dir=directory)) for w in works]
    tps = {w.tp: i for i, w in enumerate(works)}
    stages = {w.tp: PartitionStage(w.task) for w in works}
    parallelism = spark.sparkContext.defaultParallelism
    settings = ScanSettings(
        spec,
        strategies=tuple((w.task.strategy, w.task.strategy_header) for w in works),
        aborted=tuple(tuple((t.producer_id, t.first_offset, t.last_offset) for t in w.task.aborted) for w in works),
        fpps=tuple(w.task.bloom_fpp for w in works),
        cache_dir=directory,
    )
    largest = max((g.size for w in works for g in w.task.groups), default=0)
    concurrency = concurrent_chunks(parallelism, largest, works[0].task.disk_budget_bytes)
    first = _cached([w.scans() for w in works], largest, concurrency, works[0].task.disk_budget_bytes)
    tracker = spark.sparkContext.accumulator({}, ScanTracker())
    todo = list(works)
    known = None if any(w.clean for w in works) else _units_before_scan(works, stages, tps)
    if known is not None:
        try:
            outcomes = _scan_and_rewrite(spark, settings, [s for part in first for s in part], tps, tracker,
                                         rewrite_slots(known, concurrency, parallelism))
        finally:
            SegmentCache(directory).remove()
        _collect_scans(works, stages, tracker.value)  # first: a scan's error is the partition's error
        todo = _settle_one_job(works, stages, tps, outcomes)
        if not todo:
            total = time.monotonic() - started
            ended = max((r.ended for r in tracker.value.values()), default=0.0)
            map_seconds = min(total, max(0.0, total - (time.time() - ended))) if ended else 0.0
            return StageResult(stages, map_seconds, total - map_seconds)
        tracker = spark.sparkContext.accumulator({}, ScanTracker())  # the step-by-step path for `todo`
        first = _cached([w.scans() for w in todo], largest, concurrency, works[0].task.disk_budget_bytes)
    keys = best_per_key(scan_rows(spark, settings, [s for part in first for s in part], tps, tracker),
                        settings.by_offset, merged=True)
    if not any(w.clean for w in todo):  # no filter test, no rescan: later steps read (tp, offset, dirty) only
        keys = keys.select("tp", "offset", "dirty")  # the cache holds 13 bytes a key, not the key bytes
    keys = keys.persist(StorageLevel.MEMORY_AND_DISK)
    persisted = [keys]
    try:
        counted = keys.groupBy("tp").agg(F.sum(F.col("dirty").cast("long")).alias("dirty"),
                                         F.count(F.lit(1)).alias("keys")).collect()
        for row in counted:  # materialises the scan and the winners; dirty counts size the filter test
            stage = stages[works[row.tp].tp]
            stage.dirty_keys, stage.keys = int(row.dirty or 0), int(row.keys)
        _collect_scans(works, stages, tracker.value)
        live = [w for w in todo if stages[w.tp].error is None]
        outcome = probe_filters(spark, spec, keys, _probes(live, stages, tps),
                                {tps[w.tp]: stages[w.tp].dirty_keys for w in live})
        _decide(live, stages, outcome, tps)
        scanned = {s.segment_id for part in first for s in part}
        wanted = [w.rescans({k.segment_id for k in stages[w.tp].kept}, scanned) for w in live]
        rescans = [s for part in _cached(wanted, largest, concurrency, works[0].task.disk_budget_bytes,
                                         [s for p in first for s in p]) for s in part]
        winners = keys
        if rescans:
            again = spark.sparkContext.accumulator({}, ScanTracker())
            more = scan_rows(spark, replace(settings, with_segment=True), rescans, tps, again).persist(
                StorageLevel.MEMORY_AND_DISK)
            persisted.append(more)
            _count_true_positives(works, stages, more, keys, rescans)  # runs the rescan
            _collect_scans(works, stages, again.value)  # a partition whose rescan failed is not rewritten
            winners = best_per_key(keys.unionByName(more.drop("seg")), settings.by_offset)
        map_seconds = time.monotonic() - started
        units = _units(live, stages, tps)
        slots = rewrite_slots(units, concurrency, parallelism)
        outcomes = _rewrite(spark, spec, winners, slots) if units else []
    finally:
        for frame in persisted:
            frame.unpersist()
        SegmentCache(directory).remove()
    _collect_rewrites(works, stages, outcomes, todo)
    return StageResult(stages, map_seconds, time.monotonic() - started - map_seconds)


def _units_before_scan(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], tps: Mapping[TP, int]
                       ) -> list[RewriteUnit] | None:
    """The rewrite units, when they are known before any scan: no partition has a clean segment (nothing for the
    filter test to keep). A partition's first chunk starts its rewrite, so its marker-walk state depends on no
    scanned batch; a later chunk's does (`states_at`), so it is taken as if the chunks before it held no
    transactional or control batch, and checked once the scan has seen them (`_states_held`). None when some
    partition has a clean segment, or when a budget check fails (the step-by-step path reports it for that
    partition alone)."""
    units: list[RewriteUnit] = []
    tasks: dict[TP, PartitionTask] = {}
    for w in works:
        try:
            task = w.reshaped(set())
            check_budget(task)
        except KcompactError:
            return None
        task = _with_states(task, _chunk_states(task, {}))
        units.extend(RewriteUnit(tps[w.tp], task, (g,), assumed=i > 0) for i, g in enumerate(task.groups))
        tasks[w.tp] = task
    if not units:
        return None
    for tp, task in tasks.items():
        stages[tp].task = task
    return units


def _settle_one_job(works: Sequence[PartitionWork], stages: dict[TP, PartitionStage], tps: Mapping[TP, int],
                    outcomes: Sequence[UnitOutcome]) -> list[PartitionWork]:
    """Take in what the one job rewrote; the partitions to stage again step by step (their assumed marker-walk
    states did not hold), each with a fresh stage that keeps what the discarded attempt's requests cost."""
    for o in outcomes:  # a state a rewrite task found from the run's cache is the one it used
        if o.learned is not None:
            stage = stages[works[o.tp].tp]
            group_id, state = o.learned
            stage.task = replace(stage.task, groups=tuple(replace(g, txn_state=state) if g.group_id == group_id
                                                          else g for g in stage.task.groups))
    todo = [w for w in works if stages[w.tp].error is None and not _states_held(stages[w.tp])]
    redone = {tps[w.tp] for w in todo}
    for o in outcomes:
        if o.crashed is not None and o.tp not in redone and stages[works[o.tp].tp].error is None:
            raise RuntimeError(f"rewrite of {works[o.tp].tp} failed on the executor:\n{o.crashed}")
    kept = [o for o in outcomes if o.tp not in redone]
    _collect_rewrites(works, stages, kept, [w for w in works if tps[w.tp] not in redone])
    for o in kept:  # nothing is clean: every key is dirty, and the partition's chunks received all its winners
        stages[works[o.tp].tp].keys += o.keys
        stages[works[o.tp].tp].dirty_keys += o.keys
    for w in todo:
        attempt = [o.rewrite.requests if o.rewrite else o.requests for o in outcomes if o.tp == tps[w.tp]]
        stages[w.tp] = PartitionStage(w.task, requests=sum(attempt, stages[w.tp].requests))
    return todo


def _states_held(stage: PartitionStage) -> bool:
    """Whether the marker-walk states the partition's chunks were rewritten from (assumed by `_units_before_scan`,
    or learned by their tasks) are the ones the batches its scan saw give (always, for a single chunk or a
    partition without transactional batches)."""
    groups = stage.task.groups
    return len(groups) < 2 or _chunk_states(stage.task, stage.scan.events) == [g.txn_state for g in groups]


def _scan_and_rewrite(spark: SparkSession, settings: ScanSettings, scans: Sequence[SegmentScanTask],
                      tps: Mapping[TP, int], tracker: Accumulator, slots: Sequence[Sequence[RewriteUnit]]
                      ) -> list[UnitOutcome]:
    """Scan, winners and rewrite as one Spark job of two stages, when every chunk is known before the scan
    (`_units_before_scan`): each scan row is tagged with the slot of its partition's chunk and shuffled once,
    by slot; the aggregate then runs in the rewrite task that needs its winners (grouping by slot too, on rows
    already partitioned by slot, adds no shuffle). No persisted winners and no counting job: each rewrite task
    counts the winners it receives. The rows carry no `dirty` (every key is dirty) and, when each slot holds one
    partition, no `tp` (the slot names it): Spark pays per column of every row. When a partition has several
    chunks, a key's chunk is the one holding its winner: the aggregate comes first (a shuffle by key), then the
    winners go to their chunk's slot (a second)."""
    settings = replace(settings, with_dirty=False)
    if len({u.tp for units in slots for u in units}) < sum(len(units) for units in slots):
        rows = scan_rows(spark, settings, scans, tps, tracker)
        return _rewrite(spark, settings.spec, best_per_key(rows, settings.by_offset, merged=True), slots)
    keys = slot_keys(len(slots))
    owner = [-1] * len(tps)
    for units, key in zip(slots, keys, strict=True):
        for u in units:
            owner[u.tp] = key
    shared = any(len(units) > 1 for units in slots)  # a slot runs several partitions' units: rows need `tp`
    tagged = scan_rows(spark, replace(settings, slots=tuple(owner), with_tp=shared), scans, tps, tracker)
    laid_out = tagged.repartition(len(slots), CHUNK_SLOT)
    winners = best_per_key(laid_out, settings.by_offset, by=(CHUNK_SLOT,))
    return run_rewrites(settings.spec, winners.select(CHUNK_SLOT, *(["tp"] if shared else []), "offset"),
                        dict(zip(keys, slots, strict=True)))


def _cached(scans: Sequence[list[SegmentScanTask]], largest: int, concurrency: int, budget: int | None,
            before: Sequence[SegmentScanTask] = ()) -> list[list[SegmentScanTask]]:
    """`scans` (per work) set to keep their bytes for the rewrite, when they, what `before` already cached and the
    chunks rewritten at once (`concurrency` of the `largest`) all fit the run's disk `budget`; else none is."""
    total = sum(s.size for part in scans for s in part) + sum(s.size for s in before if s.cache)
    fits = (not before or any(s.cache for s in before)) and cache_fits(total, largest, concurrency, budget)
    return [[replace(s, cache=fits) for s in part] for part in scans]


def _collect_scans(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage],
                   tracked: Mapping[int, PartitionScan]) -> None:
    for i, report in tracked.items():
        stage = stages[works[i].tp]
        stage.scan.add(report)
        stage.requests = stage.requests + report.requests
        if report.error is not None:
            stage.fail(report.error)


def _count_true_positives(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], more: DataFrame,
                          keys: DataFrame, rescans: Sequence[SegmentScanTask]) -> None:
    """How many dirty keys each rescanned segment really holds (its filter's truth), from the rescan's rows."""
    dirty = keys.filter(F.col("dirty")).select("tp", "key")
    for row in more.join(dirty, ["tp", "key"]).groupBy("seg").count().collect():
        s = rescans[row.seg]
        stages[(s.topic, s.partition)].true_dirty[s.segment_id] = int(row["count"])
    for s in rescans:
        stages[(s.topic, s.partition)].true_dirty.setdefault(s.segment_id, 0)


def _probes(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], tps: Mapping[TP, int]
            ) -> list[FilterProbe]:
    out = []
    for w in works:
        built = stages[w.tp].scan.filters_built
        for s in w.clean:
            key = s.object_key(ObjectSuffix.BLOOM) or built.get(s.segment_id)
            if key is not None:
                out.append(FilterProbe(tps[w.tp], s.segment_id, key))
    return out


def _decide(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], outcome: ProbeOutcome,
            tps: Mapping[TP, int]) -> None:
    """Per partition the verdict of each clean segment, and the segments kept."""
    for w in works:
        stage = stages[w.tp]
        stage.requests = stage.requests + outcome.requests.get(tps[w.tp], StoreStats())
        for s in w.clean:
            probe = outcome.results.get((tps[w.tp], s.segment_id))
            if probe is not None:
                stage.probes[s.segment_id] = probe
            stage.verdicts[s.segment_id] = _verdict(probe, w.task.now_ms)
        could = {i for i, v in stage.verdicts.items() if v.kept}
        kept = merge_small(w.segments, could, w.segment_bytes)
        stage.verdicts.update({i: Verdict.MERGED for i in could - kept})
        stage.kept = tuple(s for s in w.segments if s.segment_id in kept)


def _verdict(probe: ProbeResult | None, now_ms: int) -> Verdict:
    if probe is None or not probe.readable:
        return verdict(None, 0, now_ms)
    return verdict(FilterFacts(probe.horizon_ms, probe.transactional), probe.positives, now_ms)


def _units(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage], tps: Mapping[TP, int]
           ) -> list[RewriteUnit]:
    """The rewrite units: per partition its regrouped chunks, each with the marker-walk state at its start, so
    that any unit can run in any task, in any order."""
    units: list[RewriteUnit] = []
    for w in works:
        stage = stages[w.tp]
        if stage.error is not None:
            continue
        try:
            task = w.reshaped({s.segment_id for s in stage.kept})
            check_budget(task)
        except KcompactError as exc:
            stage.fail(exc)
            continue
        stage.task = _with_states(task, _chunk_states(task, stage.scan.events))
        units.extend(RewriteUnit(tps[w.tp], stage.task, (g,)) for g in stage.task.groups)
    return units


def _chunk_states(task: PartitionTask, events: Mapping[str, Sequence[TxnEvent]]) -> list[TransactionState]:
    """The marker-walk state at each of `task`'s chunk starts, from the transactional and control batches of its
    inputs (`events`: segment id -> batches; a segment without an entry holds none)."""
    seen = [e for g in task.groups for i in g.inputs for e in events.get(i.segment_id, ())]
    return states_at([g.start_offset for g in task.groups], task.aborted, seen)


def _with_states(task: PartitionTask, states: Sequence[TransactionState]) -> PartitionTask:
    return replace(task, groups=tuple(replace(g, txn_state=s) for g, s in zip(task.groups, states, strict=True)))


def concurrent_chunks(parallelism: int, largest_chunk: int, budget: int | None) -> int:
    """How many chunks may be rewritten at once: one per core, as far as the disk budget holds them. Pure."""
    if budget is None or largest_chunk <= 0:
        return parallelism
    return max(1, min(parallelism, budget // largest_chunk))


def rewrite_slots(units: Sequence[RewriteUnit], concurrency: int, parallelism: int) -> list[list[RewriteUnit]]:
    """The rewrite tasks: a unit each while all cores may rewrite at once; else `concurrency` tasks, each running
    its units one after the other, the largest first into the lightest task (so at most `concurrency` chunks are
    on local disk at any time). Pure."""
    if concurrency >= parallelism:
        return [[u] for u in units]
    slots: list[list[RewriteUnit]] = [[] for _ in range(min(concurrency, len(units)))]
    loads = [0] * len(slots)
    for u in sorted(units, key=lambda u: -u.groups[0].size):
        i = loads.index(min(loads))
        slots[i].append(u)
        loads[i] += u.groups[0].size
    return slots


def _rewrite(spark: SparkSession, spec: StoreSpec, winners: DataFrame, slots: Sequence[Sequence[RewriteUnit]]
             ) -> list[UnitOutcome]:
    keys = slot_keys(len(slots))
    chunks = [(u.tp, g.start_offset, g.end_offset, key) for units, key in zip(slots, keys, strict=True)
              for u in units for g in u.groups]
    return run_rewrites(spec, chunk_winners(spark, winners.select("tp", "offset"), chunks, len(slots)),
                        dict(zip(keys, slots, strict=True)))


def _collect_rewrites(works: Sequence[PartitionWork], stages: Mapping[TP, PartitionStage],
                      outcomes: Sequence[UnitOutcome], finished: Sequence[PartitionWork]) -> None:
    """What the rewrite tasks did, into the stages of `finished` (the partitions whose staging ends here)."""
    for o in outcomes:
        stage = stages[works[o.tp].tp]
        stage.rewrite_task_ids.add(o.task_id)
        if o.error is not None or o.crashed is not None:  # crashed: an assumed unit of a partition failed already
            if o.error is not None:
                stage.fail(o.error)
            stage.requests = stage.requests + o.requests
            continue
        assert o.rewrite is not None
        stage.chunks.extend(o.rewrite.groups)
        stage.chunk_count += o.rewrite.chunks
        stage.peak_temp_bytes = max(stage.peak_temp_bytes, o.rewrite.peak_temp_bytes)
        stage.cache_hits += o.rewrite.cache_hits
        stage.requests = stage.requests + o.rewrite.requests
    for stage in (stages[w.tp] for w in finished):
        stage.chunks.sort(key=lambda c: c.group_id)
        stage.peak_temp_bytes += sum(stage.scan.cached.values())  # the run's cache held while chunks ran


__all__ = ["PartitionStage", "StageResult", "stage_partitions"]
