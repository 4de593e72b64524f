"""A run whose every chunk is known before the scan (no clean segment, one chunk per partition: every first
compaction of partitions within the disk budget) is one Spark job: scan, winners and rewrite, the winners
shuffled once, by rewrite slot (`compaction.spark.pipeline._scan_and_rewrite`), or not at all when each task can
fold its partitions' keys itself and rewrite from them (`compaction.spark.fused`). Either way it writes exactly
what the step-by-step path writes (scan, persisted winners, counts, rewrite), byte for byte, under every strategy,
and reports the same counts."""

from __future__ import annotations

import functools
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import compaction.spark.fused as fused_job
import compaction.spark.pipeline as pipeline
import compaction.spark.scan as scan
import compaction.tier.copy as tier_copy
from compaction.config import KcompactConfig, TopicConfig
from compaction.format.batch import Header, Record
from compaction.format.segment import iter_batch_headers
from compaction.metadata import ObjectSuffix, table_in_store
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.report import run_report
from compaction.run.stage import stage
from compaction.storage import ObjectStore, open_store
from tests.scenario_log import ScenarioLog, tier

NOW = 1_800_000_000_000
DAY = 86_400_000
PARTITIONS, KEYS = 3, 400


def _store(root: Path, transactions: bool = False) -> ObjectStore:
    store = open_store(str(root / "store"))
    logs = []
    for p in range(PARTITIONS):
        log = ScenarioLog("users", NOW - 3 * DAY, partition=p, segment_bytes=16 * 1024)
        for i in range(1500):  # keys rewritten at random-ish order, timestamps out of order, a version header
            key = (i * 7919 + p) % KEYS
            version = ((i * 31) % 97).to_bytes(8, "big", signed=True)
            log.append_records([Record(log.next_offset, NOW - 3 * DAY + (i * 37) % 1000, b"k%d" % key,
                                       None if i % 50 == 0 else b"v%d-%d" % (key, i), (Header("v", version),))])
            if transactions and p > 0 and i in (200, 700, 1200):  # a transaction across chunks, committed
                if i == 200:                                        # (partition 1) or aborted (partition 2)
                    append = log.producer(7 + p)
                if i < 1200:
                    append([1, 2, 3 + i])
                else:
                    log.commit(7 + p) if p == 1 else log.abort(7 + p)
        log.roll()
        logs.append(log)
    tier(logs, root / "logs", store, NOW - 2 * DAY)
    return store


def _config(strategy: str, segment_bytes: int | None = None) -> KcompactConfig:
    settings = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "compaction.strategy": strategy}
    if segment_bytes is not None:  # rewrite chunks of at most this many input bytes: several per partition
        settings["segment.bytes"] = str(segment_bytes)
    if strategy == "header":
        settings["compaction.strategy.header"] = "v"
    return KcompactConfig(defaults=TopicConfig.from_kafka(settings))


def _run(spark: SparkSession, store: ObjectStore, strategy: str, segment_bytes: int | None = None
         ) -> tuple[dict, int]:
    # unique for the session: the status tracker keeps earlier tests' jobs, and an id() can be reused after a store
    # is freed, which counted an earlier run's jobs into this one's
    group = f"one-job-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "kcompact test")
    try:
        staged = stage(spark, plan(store, _config(strategy, segment_bytes), NOW))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    # the status tracker learns of jobs from Spark's listener bus, which runs behind: wait for it to drain
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)  # type: ignore[union-attr]
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    return run_report(staged, commit(staged)).to_dict(), jobs


def _step_by_step_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition staged step by step."""
    monkeypatch.setattr(pipeline, "_plan_before_scan",
                        lambda staging: pipeline._BeforeScan(step_by_step=list(staging.works)))


def _shuffle_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one job always shuffles its rows (never the fused job)."""
    monkeypatch.setattr(fused_job, "fits", lambda *_a: False)


def _folds_through(monkeypatch: pytest.MonkeyPatch, path: str) -> list[str | None]:
    """The fused job hands its folds on as files (Spark local mode's default: path "fused") or, as on a cluster,
    as rows through Spark's shuffle ("fused-rows"); the directory each fused job of two stages used (None: rows),
    filled as they start."""
    used: list[str | None] = []
    real = fused_job.folds_dir

    def spy(*args: object) -> str | None:
        found = None if path == "fused-rows" else real(*args)  # type: ignore[arg-type]
        used.append(found)
        return found

    monkeypatch.setattr(fused_job, "folds_dir", spy)
    return used


def _spy_fused(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many units each fused job the runs start rewrites, filled as they do."""
    seen: list[int] = []
    real = fused_job.fold_and_rewrite

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(sum(len(units) for units in args[-1]))  # type: ignore[attr-defined]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_job, "fold_and_rewrite", spy)
    return seen


def _spy_step_by_step(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The partitions (numbers) the runs stage step by step, filled as they do."""
    seen: list[int] = []
    real = pipeline._step_by_step

    def spy(staging: object, works: list) -> None:
        seen.extend(w.tp.partition for w in works)
        real(staging, works)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "_step_by_step", spy)
    return seen


def _logs(store: ObjectStore) -> list[list[bytes]]:
    table = table_in_store(store)
    return [[store.get(s.object_key(ObjectSuffix.LOG) or "") for s in table.live_segments("users", p)]
            for p in range(PARTITIONS)]


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["offset", "timestamp", "header"])
@pytest.mark.parametrize("path", ["fused", "shuffle"])
def test_one_job_writes_what_the_step_by_step_path_writes(spark: SparkSession, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, strategy: str,
                                                          path: str) -> None:
    """Three partitions of one chunk on local[2]: packed into two rewrite slots, one per core, so the one job is the
    fused one (each task folds and rewrites its partitions: one stage); or, told not to, the shuffle by slot."""
    if path == "shuffle":
        _shuffle_only(monkeypatch)
    ran_fused = _spy_fused(monkeypatch)
    fused, fused_jobs = _run(spark, one := _store(tmp_path / "one"), strategy)
    assert ran_fused == ([PARTITIONS] if path == "fused" else [])
    _step_by_step_only(monkeypatch)
    stepped, stepped_jobs = _run(spark, other := _store(tmp_path / "other"), strategy)
    assert len(fused["partitions"]) == len(stepped["partitions"]) == PARTITIONS
    assert all(p["committed"] and p["error"] is None for p in fused["partitions"] + stepped["partitions"])
    assert fused_jobs <= 2 < stepped_jobs  # scan stage + rewrite stage (adaptive execution runs each as a job)
    assert _logs(one) == _logs(other)
    for a, b in zip(fused["partitions"], stepped["partitions"], strict=True):
        for field in ("dirty_keys", "segments_scanned", "cache_hits", "chunks", "rewrite_tasks"):
            assert a["stats"][field] == b["stats"][field], field
        assert a["stats"]["dirty_keys"] == KEYS
        assert a["requests"] == b["requests"] and a["fetch_ratio"] == b["fetch_ratio"]


@pytest.mark.spark
@pytest.mark.parametrize(("strategy", "transactions", "cached", "path"), [
    ("offset", False, True, "fused"), ("offset", False, True, "fused-rows"), ("offset", False, True, "shuffle"),
    ("timestamp", False, True, "fused"), ("timestamp", False, True, "fused-rows"),
    ("timestamp", False, True, "shuffle"),
    ("header", False, True, "fused"), ("offset", True, True, "fused"), ("offset", True, False, "fused")])
def test_several_chunks_per_partition_write_what_the_step_by_step_path_writes(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, transactions: bool,
        cached: bool, path: str) -> None:
    """Several chunks per partition, each in a rewrite slot of its own. Fused: each chunk's task folds its own
    segments and hands its fold, packed, to the chunks that need it (under `offset` the earlier ones), which
    merge them and rewrite: as files in the run's cache directory (local mode), gone with it when the job ends, or
    as rows through Spark's shuffle ("fused-rows", a cluster's way). Else each key goes to the chunk holding its
    winner (two shuffles, still one job's worth of planning). A later chunk's marker-walk state must be known
    before the scan: `kcompact tier` recorded in each segment's row whether it holds a transactional or control
    batch, so partitions 1 and 2 with `transactions` (a committed and an aborted transaction across chunks) are
    staged step by step from the start, partition 0 in the one job; with or without the run's cache, no partition
    is staged twice. The outputs' rows say it too."""
    if not cached:
        monkeypatch.setattr(pipeline, "cache_fits", lambda *_a: False)
    if path == "shuffle":
        _shuffle_only(monkeypatch)
    ran_fused = _spy_fused(monkeypatch)
    exchanged = _folds_through(monkeypatch, path)
    stepwise = _spy_step_by_step(monkeypatch)
    fused, fused_jobs = _run(spark, one := _store(tmp_path / "one", transactions), strategy, 40 * 1024)
    assert stepwise == ([1, 2] if transactions else [])
    chunks = sum(p["stats"]["chunks"] for p in fused["partitions"][:1 if transactions else PARTITIONS])
    assert ran_fused == ([chunks] if path != "shuffle" else [])
    assert len(exchanged) == len(ran_fused)
    if path == "fused":  # files, in the run's cache directory: gone with it
        assert all(d is not None and not Path(d).parent.exists() for d in exchanged)
    else:
        assert exchanged == [None] * len(ran_fused)
    _step_by_step_only(monkeypatch)
    stepped, stepped_jobs = _run(spark, other := _store(tmp_path / "other", transactions), strategy, 40 * 1024)
    assert all(p["committed"] and p["error"] is None for p in fused["partitions"] + stepped["partitions"])
    assert _logs(one) == _logs(other)
    for a, b in zip(fused["partitions"], stepped["partitions"], strict=True):
        assert a["stats"]["chunks"] == b["stats"]["chunks"] > 1
        assert a["stats"]["dirty_keys"] == b["stats"]["dirty_keys"]
        assert a["requests"] == b["requests"]  # no partition is staged twice
        if cached:  # each segment fetched once (the rest: the producer-state and index reads of planning)
            assert a["fetch_ratio"] == b["fetch_ratio"] < 1.01
    if not transactions:
        assert fused_jobs < stepped_jobs
    for store in (one, other):  # each output's row says whether it holds a transactional or control batch
        flags = []
        for p in range(PARTITIONS):
            for s in table_in_store(store).live_segments("users", p):
                headers = iter_batch_headers(store.get(s.object_key(ObjectSuffix.LOG) or ""))
                assert s.transactional is any(h.is_transactional_or_control for h in headers)
                flags.append(s.transactional)
        assert any(flags) is transactions


@pytest.mark.spark
@pytest.mark.parametrize("victim", ["first", "last"])
def test_a_corrupt_segment_in_a_chunk_fails_its_partition_alone_in_the_fused_exchange(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str) -> None:
    """A partition of several chunks in the fused job, with a bit flipped at rest in a segment of its first or its
    last chunk: the scan's error names the object and the byte, the partition exits 3 and keeps its segments, the
    other partitions commit. (Under `offset` the last chunk needs no other chunk's fold, so its rewrite may run;
    what it uploaded is never referenced.)"""
    ran_fused = _spy_fused(monkeypatch)
    store = _store(tmp_path / "one")
    before = table_in_store(store).live_segments("users", 0)
    segment = before[0 if victim == "first" else -1]
    key = segment.object_key(ObjectSuffix.LOG) or ""
    data = bytearray(store.get(key))
    data[100] ^= 0xFF
    store.delete(key)  # objects are never overwritten: replace it (as a bit flip at rest would)
    store.put(key, bytes(data))
    report, _jobs = _run(spark, store, "offset", 40 * 1024)
    assert len(ran_fused) == 1 and ran_fused[0] > PARTITIONS  # several chunks a partition, fused
    (failed,) = report["failed"]
    assert failed["partition"] == 0 and failed["exit_code"] == 3 == report["exit_code"]
    assert key in failed["error"] and "byte" in failed["error"]
    assert [p["partition"] for p in report["partitions"] if p["committed"] and p["error"] is None] == [1, 2]
    assert table_in_store(store).live_segments("users", 0) == before


@pytest.mark.spark
def test_partitions_cut_across_scan_tasks_and_rows_in_small_batches_write_the_same_bytes(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition larger than a scan task's share is cut into runs of segments over several tasks, each handing
    Spark its own best per key, which the aggregate ranks (here: every partition over ~5 tasks, under the header
    strategy, whose rank columns then decide). A task hands Spark its rows in Arrow batches of
    `ScanSettings.rows_per_batch` (a million by default, so that binary keys stay within a batch's 2 GiB); cut
    into batches of 7 rows too, the run writes the same bytes as with whole partitions per task (there: the fused
    job, a partition folded by one task; a partition cut across tasks is not fused)."""
    ran_fused = _spy_fused(monkeypatch)
    whole, _jobs = _run(spark, one := _store(tmp_path / "one"), "header")
    assert ran_fused == [PARTITIONS]
    monkeypatch.setattr(scan, "SCAN_TASK_RECORDS", 300)
    settings_of = pipeline.ScanSettings.of
    monkeypatch.setattr(pipeline.ScanSettings, "of", functools.partial(settings_of, rows_per_batch=7))
    cut, _jobs = _run(spark, other := _store(tmp_path / "other"), "header")
    assert ran_fused == [PARTITIONS]
    assert all(p["committed"] for p in whole["partitions"] + cut["partitions"])
    assert _logs(one) == _logs(other)
    assert [p["stats"]["dirty_keys"] for p in cut["partitions"]] == [KEYS] * PARTITIONS


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["offset", "header"])
def test_one_rewrite_task_for_every_partition_writes_the_same_bytes(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str) -> None:
    """The one job's rows leave out `tp` when each rewrite slot holds one partition (the slot names it); when a
    disk budget of one chunk at a time puts every partition's chunk in one rewrite task, they carry it, and the
    task tells its partitions' winners apart by it. Both write what the step-by-step path writes."""
    _shuffle_only(monkeypatch)  # the rows' layouts are the shuffle's
    seen: list[bool] = []
    real = pipeline.scan_rows

    def spy(spark_: SparkSession, settings: pipeline.ScanSettings, *args: object) -> object:
        if settings.layout.by_slot:
            seen.append(settings.layout is scan.RowLayout.ONE_JOB_SHARED_SLOTS)
        return real(spark_, settings, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "scan_rows", spy)
    own, _jobs = _run(spark, one := _store(tmp_path / "one"), strategy)
    assert seen == [False]
    shared_store = _store(tmp_path / "shared")
    largest = max(sum(s.segment_size_bytes for s in table_in_store(shared_store).live_segments("users", p))
                  for p in range(PARTITIONS))
    budget = largest + largest // 2  # one chunk fits, two do not: a single rewrite task runs all three
    shared = run_report(staged := stage(spark, plan(shared_store, _config(strategy), NOW,
                                                   disk_budget_bytes=budget)), commit(staged)).to_dict()
    assert seen == [False, True]
    _step_by_step_only(monkeypatch)
    stepped, _jobs = _run(spark, other := _store(tmp_path / "other"), strategy)
    assert all(p["committed"] for p in own["partitions"] + shared["partitions"] + stepped["partitions"])
    assert {p["stats"]["rewrite_tasks"] for p in shared["partitions"]} == {1}
    assert _logs(one) == _logs(shared_store) == _logs(other)
    assert [p["stats"]["dirty_keys"] for p in shared["partitions"]] == [KEYS] * PARTITIONS


@pytest.mark.spark
@pytest.mark.parametrize(("strategy", "path"), [("offset", "fused"), ("timestamp", "fused"), ("offset", "fused-rows")])
def test_fewer_rewrite_slots_than_cores_fold_a_partition_of_one_chunk_in_parts(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, path: str) -> None:
    """The three partitions' chunks packed into one rewrite slot on local[2] (as `rewrite_slots` packs a run whose
    partitions are all small): the fused job still gives every core a task (`fused.spread`), cutting the largest
    partition's segments into two fold parts, one folded by a task of its own, whose fold the slot merges before it
    rewrites (no rows shuffled). It writes what the step-by-step path writes, with the same counts and each segment
    fetched once (the cut partition's segments from the run's cache)."""
    cut: list[dict[int, int]] = []
    real = fused_job.spread

    def spy(*args: object) -> dict[int, int]:
        found = real(*args)  # type: ignore[arg-type]
        cut.append(found)
        return found

    monkeypatch.setattr(fused_job, "spread", spy)
    ran_fused = _spy_fused(monkeypatch)
    exchanged = _folds_through(monkeypatch, path)
    monkeypatch.setattr(pipeline, "rewrite_slots", lambda units, *_a: [list(units)])
    report, _jobs = _run(spark, store := _store(tmp_path / "one"), strategy)
    assert ran_fused == [PARTITIONS] and [2] in [list(c.values()) for c in cut]
    assert len(exchanged) == 1 and (exchanged[0] is None) is (path == "fused-rows")
    _step_by_step_only(monkeypatch)
    stepped, _jobs = _run(spark, other := _store(tmp_path / "other"), strategy)
    assert all(p["committed"] and p["error"] is None for p in report["partitions"] + stepped["partitions"])
    assert _logs(store) == _logs(other)
    for a, b in zip(report["partitions"], stepped["partitions"], strict=True):
        assert a["stats"]["dirty_keys"] == b["stats"]["dirty_keys"] == KEYS
        assert a["fetch_ratio"] == b["fetch_ratio"] < 1.01


@pytest.mark.spark
@pytest.mark.parametrize("path", ["fused", "fused-rows"])
def test_a_later_chunk_within_the_last_fold_part_gets_its_winning_offsets_alone(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Under `offset`, a chunk whose first offset the last fold part reaches needs that part alone, and is handed
    its winning offsets, not its fold (as file or as rows): the parts cut here so that the last one holds every
    segment from the last chunk's on (each earlier part one segment), each chunk in a slot of its own (a slot
    holding chunks of several parts' needs gets their folds). It writes what the step-by-step path writes."""
    real_parts = fused_job._parts

    def last_part_large(scans: list, n: int) -> list[list]:
        ordered = sorted(scans, key=lambda s: s.start_offset)
        n = min(n, len(ordered))
        return [[s] for s in ordered[:n - 1]] + [ordered[n - 1:]] if n > 1 else real_parts(scans, n)

    monkeypatch.setattr(fused_job, "_parts", last_part_large)
    monkeypatch.setattr(pipeline, "rewrite_slots", lambda units, *_a: [[u] for u in units])  # a slot per chunk
    alone: list[int] = []  # the parts whose winning offsets alone the plan sends (the tasks run elsewhere)
    real_plan = fused_job.exchange_plan

    def plan(*args: object, **kwargs: object) -> object:
        first, merges = real_plan(*args, **kwargs)  # type: ignore[arg-type]
        alone.extend(f.chunk for units in first for f in units if f.offsets_to)
        return first, merges

    monkeypatch.setattr(fused_job, "exchange_plan", plan)
    exchanged = _folds_through(monkeypatch, path)
    ran_fused = _spy_fused(monkeypatch)
    fused, _jobs = _run(spark, one := _store(tmp_path / "one"), "offset", 40 * 1024)
    assert len(ran_fused) == 1 and len(alone) == PARTITIONS  # each partition's last part: offsets alone
    assert (exchanged[0] is None) is (path == "fused-rows")
    _step_by_step_only(monkeypatch)
    stepped, _jobs = _run(spark, other := _store(tmp_path / "other"), "offset", 40 * 1024)
    assert all(p["committed"] and p["error"] is None for p in fused["partitions"] + stepped["partitions"])
    assert _logs(one) == _logs(other)


@pytest.mark.spark
def test_rows_that_cannot_say_send_a_partition_of_several_chunks_step_by_step(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment row whose `transactional` is null (a broker's copy through the plugin: KIP-405's metadata does
    not say; a row written before the column) leaves a later chunk's marker-walk state unknown before the scan: a
    partition of several chunks is staged step by step from the start, while one of a single chunk, whose state
    is the walk's start, still takes the one job. The bytes are the same either way, and the outputs' rows know."""
    real = tier_copy._new_segment
    monkeypatch.setattr(tier_copy, "_new_segment", lambda *a: replace(real(*a), transactional=None))
    unknown_single, unknown_several = _store(tmp_path / "single"), _store(tmp_path / "several")
    monkeypatch.setattr(tier_copy, "_new_segment", real)
    known = _store(tmp_path / "known")
    assert {s.transactional for p in range(PARTITIONS) for s in table_in_store(unknown_several).live_segments(
        "users", p)} == {None}
    assert {s.transactional for p in range(PARTITIONS) for s in table_in_store(known).live_segments(
        "users", p)} == {False}
    stepwise = _spy_step_by_step(monkeypatch)
    single, single_jobs = _run(spark, unknown_single, "offset")
    assert stepwise == [] and single_jobs <= 2
    several, _jobs = _run(spark, unknown_several, "offset", 40 * 1024)
    assert stepwise == list(range(PARTITIONS))
    reference, _jobs = _run(spark, known, "offset", 40 * 1024)
    assert stepwise == list(range(PARTITIONS))  # the rows say: the one job
    assert all(p["committed"] for p in single["partitions"] + several["partitions"] + reference["partitions"])
    assert all(p["stats"]["chunks"] > 1 for p in several["partitions"])
    assert _logs(unknown_several) == _logs(known)
    assert {s.transactional for p in range(PARTITIONS) for s in table_in_store(unknown_several).live_segments(
        "users", p)} == {False}
