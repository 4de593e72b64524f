"""The compaction data path on Spark, for every partition of a run at once: scan → winners → skip → rewrite.

The step-by-step path (`_step_by_step`), which every run can take:

1. **Scan** (`compaction.spark.scan`): every dirty segment, and clean segments without a filter (building it),
   fetched into the run's segment cache when it fits the disk budget, so the rewrite does not fetch them again.
2. **Winners** (`compaction.spark.winners.best_per_key`): the best rank per (partition, key) and whether the key
   is dirty; persisted, since the filter test and the rewrite both read it (without the key bytes when no
   partition has a clean segment: then nothing after the count needs them).
3. **Skip** (`compaction.spark.skipping`): the clean segments' filters against the dirty keys; a segment that
   may hold none, and that nothing else forces to be rewritten, is kept (`compaction.bloom.skipping`).
4. **Rescan** the clean segments to rewrite that the first scan did not read (their filter said they may hold a
   dirty key), cached as well, and fold their keys into the winners: every winner is known before any chunk is
   rewritten, and each segment is still fetched once.
5. **Rewrite** (`compaction.spark.rewrite_job`): the driver regroups what is left (kept segments end groups,
   chunks within the disk budget), gives each chunk the transaction-marker state at its start (from the
   transactional and control batches the scans saw: `compaction.strategies.transactions.states_at`) and the
   chunks are packed into tasks by bytes (`rewrite_slots`): small partitions' chunks share a task, a large chunk
   has one of its own, so one hot partition uses every core. Nothing is visible until the driver commits the
   metadata.

Jobs per run: the scan with its aggregate (collected as per-partition key counts), the filter test when there
are clean segments with filters, the rescan when some of them must be rewritten, and the rewrite.

The one job (`_in_one_job`), the alternative: when every chunk is known before the scan (no partition has a
clean segment, as in a first compaction), steps 1, 2 and 5 are one job (`_scan_and_rewrite`): no persisted
winners, no counting job; no shuffle of rows when every core has a slot and each partition's log is one a task can
fold (`compaction.spark.fused`: the scan task rewrites from its own fold; a partition of several chunks exchanges
its chunks' folds, packed), else one shuffle when each partition has one chunk, two when some have several. Each
chunk's marker-walk state must then be known before the scan too (`_plan_before_scan`): a partition's first
chunk starts the walk, and a later chunk's state is known when the rows of the segments before it say that none
holds a transactional or control batch (`SegmentMetadata.transactional` False, docs/metadata-table.md). A
partition with a later chunk after a segment that holds one, or may (a row nothing said it of: another storage
manager's copy, a row written before the column), is staged step by step, its states taken from what its scan saw;
the others still take the one job, first. Nothing is assumed, so no partition is staged twice. Both paths fill the
same `PartitionStage` per partition. A run's fixed cost is mostly Spark's per-job and per-stage cost in a JVM not
yet warm, so the job count is what sets it.
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
from compaction.metadata.model import ObjectSuffix, SegmentMetadata, TopicPartition
from compaction.packing import pack_for
from compaction.rewrite.cache import SegmentCache, cache_fits
from compaction.rewrite.upload import ChunkResult, check_budget
from compaction.spark import fused
from compaction.spark.rewrite_job import RewriteUnit, UnitOutcome, WinnerRows, run_rewrites
from compaction.spark.scan import PartitionScan, RowLayout, ScanSettings, ScanTracker, scan_rows
from compaction.spark.skipping import FilterProbe, ProbeOutcome, ProbeResult, probe_filters
from compaction.spark.winners import CHUNK_SLOT, Chunk, best_per_key, chunk_winners, slot_keys
from compaction.storage.base import StoreSpec, StoreStats
from compaction.strategies.transactions import TransactionState, TxnEvent, states_at
from compaction.tasks import PartitionTask, PartitionWork, SegmentScanTask


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

    partitions: dict[TopicPartition, PartitionStage]
    map_seconds: float
    rewrite_seconds: float


def stage_partitions(spark: SparkSession, spec: StoreSpec, works: Sequence[PartitionWork]) -> StageResult:
    """Run scan → winners → skip → rescan → rewrite for `works` (see the module docstring): in one job for the
    partitions whose every chunk, and its marker-walk state, is known before the scan, step by step for the
    others. Uploads outputs (fresh ids) and the filters built on the way; commits nothing. The run's segment
    cache is the directory its tasks name (`PartitionTask.cache_dir`), removed before returning."""
    if not works:
        return StageResult({}, 0.0, 0.0)
    staging = _Staging.start(spark, spec, works)
    planned = _plan_before_scan(staging)
    if planned.units:
        _in_one_job(staging, planned)
    if planned.step_by_step:
        _step_by_step(staging, planned.step_by_step)
    return staging.result()


@dataclass
class _Staging:
    """One run's staging: its partitions' work (the position of each is its partition index, which the Spark
    rows carry), what staging did for each so far, and what sizes the scan cache and the rewrite tasks."""

    spark: SparkSession
    settings: ScanSettings
    works: list[PartitionWork]
    stages: dict[TopicPartition, PartitionStage]
    index_of: dict[TopicPartition, int]
    largest_chunk: int
    concurrency: int  # chunks rewritten at once (`concurrent_chunks`)
    started: float
    map_seconds: float = 0.0

    @classmethod
    def start(cls, spark: SparkSession, spec: StoreSpec, works: Sequence[PartitionWork]) -> _Staging:
        directory = works[0].task.cache_dir
        assert directory is not None, "the run's tasks name its segment cache (run.stage.partition_work)"
        largest = max((g.size for w in works for g in w.task.groups), default=0)
        return cls(spark, ScanSettings.of(spec, [w.task for w in works], directory), list(works),
                   {w.tp: PartitionStage(w.task) for w in works}, {w.tp: i for i, w in enumerate(works)}, largest,
                   concurrent_chunks(spark.sparkContext.defaultParallelism, largest, works[0].task.disk_budget_bytes),
                   time.monotonic())

    @property
    def parallelism(self) -> int:
        return int(self.spark.sparkContext.defaultParallelism)

    @property
    def cache(self) -> SegmentCache:
        assert self.settings.cache_dir is not None  # `start` checked it
        return SegmentCache(self.settings.cache_dir)

    def stage_at(self, index: int) -> PartitionStage:
        return self.stages[self.works[index].tp]

    def tracker(self) -> Accumulator:
        """A fresh accumulator of the scan tasks' reports (`ScanTracker`)."""
        return self.spark.sparkContext.accumulator({}, ScanTracker())

    def cached(self, scans: Sequence[Sequence[SegmentScanTask]], before: Sequence[SegmentScanTask] = ()
               ) -> list[SegmentScanTask]:
        """`scans` (per work) set to keep their bytes for the rewrite, when they, what `before` already cached and
        the chunks rewritten at once all fit the run's disk budget; else none is."""
        total = sum(s.size for part in scans for s in part) + sum(s.size for s in before if s.cache)
        budget = self.works[0].task.disk_budget_bytes
        fits = (not before or any(s.cache for s in before)) and cache_fits(total, self.largest_chunk,
                                                                           self.concurrency, budget)
        return [replace(s, cache=fits) for part in scans for s in part]

    def scan_rows(self, layout: RowLayout, scans: Sequence[SegmentScanTask], tracker: Accumulator) -> DataFrame:
        return scan_rows(self.spark, self.settings.laid_out(layout), scans, self.index_of, tracker)

    def rewrite_slots(self, units: Sequence[RewriteUnit]) -> list[list[RewriteUnit]]:
        return rewrite_slots(units, self.concurrency, self.parallelism)

    def result(self) -> StageResult:
        return StageResult(self.stages, self.map_seconds, time.monotonic() - self.started - self.map_seconds)


def _in_one_job(staging: _Staging, planned: _BeforeScan) -> None:
    """The one job (`_scan_and_rewrite`) for the partitions of `planned.one_job`; what happened goes into their
    stages."""
    tracker = staging.tracker()
    scans = staging.cached([w.scans for w in planned.one_job])
    try:
        outcomes = _scan_and_rewrite(staging, scans, tracker, staging.rewrite_slots(planned.units))
    finally:
        staging.cache.remove()
    _collect_scans(staging, tracker.value)  # first: a scan's error is the partition's error
    total = time.monotonic() - staging.started
    ended = max((r.ended for r in tracker.value.values()), default=0.0)
    staging.map_seconds = min(total, max(0.0, total - (time.time() - ended))) if ended else 0.0
    _collect_rewrites(staging, outcomes, planned.one_job)
    for o in outcomes:  # nothing is clean: every key is dirty, and the partition's chunks received all its winners
        staging.stage_at(o.partition_index).keys += o.keys
        staging.stage_at(o.partition_index).dirty_keys += o.keys


def _step_by_step(staging: _Staging, works: Sequence[PartitionWork]) -> None:
    """Scan → winners (persisted and counted) → filter test → rescan → rewrite for `works`; what happened goes
    into their stages."""
    scans = staging.cached([w.scans for w in works])
    tracker = staging.tracker()
    winners = best_per_key(staging.scan_rows(RowLayout.STEP_BY_STEP, scans, tracker), staging.settings.by_offset,
                           merged=True)
    if not any(w.clean for w in works):  # no filter test, no rescan: later steps read (tp, offset, dirty) only
        winners = winners.select("tp", "offset", "dirty")  # the cache holds 13 bytes a key, not the key bytes
    winners = winners.persist(StorageLevel.MEMORY_AND_DISK)
    persisted = [winners]
    try:
        _count_keys(staging, winners)  # materialises the scan and the winners; dirty counts size the filter test
        _collect_scans(staging, tracker.value)
        live = [w for w in works if staging.stages[w.tp].error is None]
        _filter_test(staging, live, winners)
        winners = _rescan(staging, live, scans, winners, persisted)
        staging.map_seconds = time.monotonic() - staging.started
        units = _units(staging, live)
        outcomes = _rewrite(staging, winners, staging.rewrite_slots(units)) if units else []
    finally:
        for frame in persisted:
            frame.unpersist()
        staging.cache.remove()
    _collect_rewrites(staging, outcomes, works)


def _count_keys(staging: _Staging, winners: DataFrame) -> None:
    """Per partition its distinct keys and dirty keys among the scanned segments."""
    counted = winners.groupBy("tp").agg(F.sum(F.col("dirty").cast("long")).alias("dirty"),
                                        F.count(F.lit(1)).alias("keys")).collect()
    for row in counted:
        stage = staging.stage_at(row.tp)
        stage.dirty_keys, stage.keys = int(row.dirty or 0), int(row.keys)


def _filter_test(staging: _Staging, works: Sequence[PartitionWork], winners: DataFrame) -> None:
    """Each clean segment's filter against its partition's dirty keys; the verdicts and the segments kept."""
    dirty_keys = {staging.index_of[w.tp]: staging.stages[w.tp].dirty_keys for w in works}
    outcome = probe_filters(staging.spark, staging.settings.spec, winners, _probes(staging, works), dirty_keys)
    _decide(staging, works, outcome)


def _rescan(staging: _Staging, works: Sequence[PartitionWork], scanned: Sequence[SegmentScanTask],
            winners: DataFrame, persisted: list[DataFrame]) -> DataFrame:
    """The winners with the keys of the clean segments to rewrite that the first scan did not read folded in:
    every winner is known before any chunk is rewritten. Counts each rescanned segment's dirty keys (its filter's
    truth); a partition whose rescan failed is not rewritten."""
    read = {s.segment_id for s in scanned}
    wanted = [w.rescans({k.segment_id for k in staging.stages[w.tp].kept}, read) for w in works]
    rescans = staging.cached(wanted, scanned)
    if not rescans:
        return winners
    tracker = staging.tracker()
    rows = staging.scan_rows(RowLayout.RESCAN, rescans, tracker)
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(rows)
    _count_true_positives(staging, rows, winners, rescans)  # runs the rescan
    _collect_scans(staging, tracker.value)
    return best_per_key(winners.unionByName(rows.drop("seg")), staging.settings.by_offset)


@dataclass(frozen=True)
class _BeforeScan:
    """What is decided before any scan: the partitions the one job stages (`one_job`, their rewrite `units`) and
    those staged step by step."""

    one_job: list[PartitionWork] = field(default_factory=list)
    units: list[RewriteUnit] = field(default_factory=list)
    step_by_step: list[PartitionWork] = field(default_factory=list)


def _plan_before_scan(staging: _Staging) -> _BeforeScan:
    """Which partitions the one job stages: when no partition has a clean segment (nothing for the filter test to
    keep), every chunk is known before the scan, and the one job takes each partition whose chunks' marker-walk
    states are known too (`_states_known`), with its rewrite units. Every partition goes step by step when some
    partition has a clean segment, or when a budget check fails (the step-by-step path reports it for that
    partition alone)."""
    stepwise = _BeforeScan(step_by_step=list(staging.works))
    if any(w.clean for w in staging.works):
        return stepwise
    planned = _BeforeScan()
    tasks: dict[TopicPartition, PartitionTask] = {}
    for index, w in enumerate(staging.works):
        try:
            task = w.reshaped(set())
            check_budget(task)
        except KcompactError:
            return stepwise
        if not _states_known(w, task):
            planned.step_by_step.append(w)
            continue
        task = _with_states(task, _chunk_states(task, {}))
        planned.one_job.append(w)
        planned.units.extend(RewriteUnit(index, task, (g,)) for g in task.groups)
        tasks[w.tp] = task
    if not planned.units:
        return stepwise
    for tp, task in tasks.items():
        staging.stages[tp].task = task
    return planned


def _states_known(work: PartitionWork, task: PartitionTask) -> bool:
    """Whether the marker-walk state at each of `task`'s chunk starts is known before the scan: the first chunk
    starts the walk, and a later chunk's state is the walk's start too when no segment before it holds a
    transactional or control batch (each of their rows says `transactional` False; None, unknown, may). Pure."""
    clear = {s.segment_id for s in work.segments if s.transactional is False}
    return all(i.segment_id in clear for g in task.groups[:-1] for i in g.inputs)


def _scan_and_rewrite(staging: _Staging, scans: Sequence[SegmentScanTask], tracker: Accumulator,
                      slots: Sequence[Sequence[RewriteUnit]]) -> list[UnitOutcome]:
    """Scan, winners and rewrite as one Spark job, when every chunk is known before the scan (`_plan_before_scan`).
    When there are slots for every core and each partition's log is small enough to fold in one task, the fused
    job (`compaction.spark.fused`): each task folds its partitions' keys itself and rewrites from them (a partition
    of several chunks exchanges its chunks' folds, packed, in a second stage). Else
    two stages: each scan row is tagged with the slot of its partition's chunk and shuffled once,
    by slot; the aggregate then runs in the rewrite task that needs its winners (grouping by slot too, on rows
    already partitioned by slot, adds no shuffle). No persisted winners and no counting job: each rewrite task
    counts the winners it receives. The rows carry no `dirty` (every key is dirty) and, when each slot holds one
    partition, no `tp` (the slot names it). When a partition has several chunks, a key's chunk is the one
    holding its winner: the aggregate comes first (a shuffle by key), then the winners go to their chunk's slot
    (a second)."""
    if fused.fits(slots, scans, staging.parallelism):  # each task folds and rewrites its partitions: no shuffle
        return fused.fold_and_rewrite(staging.spark, staging.settings, scans, staging.index_of, tracker, slots,
                                      parallelism=staging.parallelism)
    by_offset = staging.settings.by_offset
    if len({u.partition_index for units in slots for u in units}) < sum(len(units) for units in slots):
        rows = staging.scan_rows(RowLayout.ONE_JOB_BY_KEY, scans, tracker)
        return _rewrite(staging, best_per_key(rows, by_offset, merged=True), slots)
    keys = slot_keys(len(slots))
    slot_of = {u.partition_index: key for units, key in zip(slots, keys, strict=True) for u in units}
    shared = any(len(units) > 1 for units in slots)  # a slot runs several partitions' units: rows need `tp`
    layout = RowLayout.ONE_JOB_SHARED_SLOTS if shared else RowLayout.ONE_JOB_OWN_SLOTS
    settings = staging.settings.by_slot(slot_of, layout)
    tagged = scan_rows(staging.spark, settings, scans, staging.index_of, tracker)
    winners = best_per_key(tagged.repartition(len(slots), CHUNK_SLOT), by_offset, by=(CHUNK_SLOT,))
    laid_out = WinnerRows.PER_WINNER if shared else WinnerRows.PER_WINNER_OF_SLOT
    return run_rewrites(staging.settings.spec, winners.select(CHUNK_SLOT, *(["tp"] if shared else []), "offset"),
                        dict(zip(keys, slots, strict=True)), laid_out)


def _collect_scans(staging: _Staging, tracked: Mapping[int, PartitionScan]) -> None:
    for index, report in tracked.items():
        stage = staging.stage_at(index)
        stage.scan.add(report)
        stage.requests = stage.requests + report.requests
        if report.error is not None:
            stage.fail(report.error)


def _count_true_positives(staging: _Staging, rows: DataFrame, winners: DataFrame,
                          rescans: Sequence[SegmentScanTask]) -> None:
    """How many dirty keys each rescanned segment really holds (its filter's truth), from the rescan's rows."""
    dirty = winners.filter(F.col("dirty")).select("tp", "key")
    for row in rows.join(dirty, ["tp", "key"]).groupBy("seg").count().collect():
        s = rescans[row.seg]
        staging.stages[s.tp].true_dirty[s.segment_id] = int(row["count"])
    for s in rescans:
        staging.stages[s.tp].true_dirty.setdefault(s.segment_id, 0)


def _probes(staging: _Staging, works: Sequence[PartitionWork]) -> list[FilterProbe]:
    out = []
    for w in works:
        built = staging.stages[w.tp].scan.filters_built
        for s in w.clean:
            key = s.object_key(ObjectSuffix.BLOOM) or built.get(s.segment_id)
            if key is not None:
                out.append(FilterProbe(staging.index_of[w.tp], s.segment_id, key))
    return out


def _decide(staging: _Staging, works: Sequence[PartitionWork], outcome: ProbeOutcome) -> None:
    """Per partition the verdict of each clean segment, and the segments kept."""
    for w in works:
        stage, index = staging.stages[w.tp], staging.index_of[w.tp]
        stage.requests = stage.requests + outcome.requests.get(index, StoreStats())
        for s in w.clean:
            probe = outcome.results.get((index, s.segment_id))
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


def _units(staging: _Staging, works: Sequence[PartitionWork]) -> list[RewriteUnit]:
    """The rewrite units: per partition its regrouped chunks, each with the marker-walk state at its start, so
    that any unit can run in any task, in any order."""
    units: list[RewriteUnit] = []
    for w in works:
        stage = staging.stages[w.tp]
        if stage.error is not None:
            continue
        try:
            task = w.reshaped({s.segment_id for s in stage.kept})
            check_budget(task)
        except KcompactError as exc:
            stage.fail(exc)
            continue
        stage.task = _with_states(task, _chunk_states(task, stage.scan.events))
        units.extend(RewriteUnit(staging.index_of[w.tp], stage.task, (g,)) for g in stage.task.groups)
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
    """The rewrite tasks, each running its units one after the other. While all cores may rewrite at once, units
    packed by bytes (`compaction.packing`): many small partitions' chunks share a task, since Spark's cost is per
    task, while a chunk above a task's budget (a hot partition's) has one of its own, so one partition still uses
    every core. Else `concurrency` tasks, the largest unit first into the lightest task (so at most `concurrency`
    chunks are on local disk at any time). Pure."""
    if concurrency >= parallelism:
        return [[units[i] for i in task] for task in pack_for([u.groups[0].size for u in units], parallelism)]
    slots: list[list[RewriteUnit]] = [[] for _ in range(min(concurrency, len(units)))]
    loads = [0] * len(slots)
    for u in sorted(units, key=lambda u: -u.groups[0].size):
        i = loads.index(min(loads))
        slots[i].append(u)
        loads[i] += u.groups[0].size
    return slots


def _rewrite(staging: _Staging, winners: DataFrame, slots: Sequence[Sequence[RewriteUnit]]) -> list[UnitOutcome]:
    keys = slot_keys(len(slots))
    chunks = [Chunk(u.partition_index, g.start_offset, g.end_offset, key)
              for units, key in zip(slots, keys, strict=True) for u in units for g in u.groups]
    packed = chunk_winners(staging.spark, winners.select("tp", "offset"), chunks, len(slots))
    return run_rewrites(staging.settings.spec, packed, dict(zip(keys, slots, strict=True)), WinnerRows.PACKED)


def _collect_rewrites(staging: _Staging, outcomes: Sequence[UnitOutcome], finished: Sequence[PartitionWork]
                      ) -> None:
    """What the rewrite tasks did, into the stages of `finished` (the partitions whose staging ends here)."""
    for o in outcomes:
        stage = staging.stage_at(o.partition_index)
        stage.rewrite_task_ids.add(o.task_id)
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
    for stage in (staging.stages[w.tp] for w in finished):
        stage.chunks.sort(key=lambda c: c.group_id)
        stage.peak_temp_bytes += sum(stage.scan.cached.values())  # the run's cache held while chunks ran


__all__ = ["PartitionStage", "StageResult", "stage_partitions"]
