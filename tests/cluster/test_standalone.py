"""kcompact on a Spark standalone cluster, as docs/operating.md's "Running on a cluster" runs it, step for step.

A master and two workers (separate JVMs, `scripts/standalone_cluster.py`: `spark-class` from the venv's pyspark,
on 127.0.0.1, stopped at the end whatever happens). Their environment holds no AWS_*, PYSPARK_* or PYTHONPATH
variable: executors run Python from the packed environment `make dist` built (`spark.archives`,
`./env/bin/python`), never from the project venv, so a dependency missing from the archive fails the run, and
reach S3 with the endpoint and credentials the application hands them (`spark.executorEnv.*`, as
conf/spark-defaults.conf documents). The driver runs in client mode from the project venv.

Against S3 on the moto server, the store a cluster uses (a local directory is one only where every worker sees the
same disk: the other tests run every job on one): tier and `wal upload` of the active segments (in-process), then
`spark-submit` of jobs/compact.py (exit 0, the JSON report: every planned partition committed), jobs/verify.py
(exit 0), jobs/gc.py (exit 0, replaced segments deleted, no orphan) and jobs/wal_roll.py (exit 0, every partition's
WAL tail rolled into a committed segment), then jobs/table.py with delta-spark's jars and confs (exit 0, the topic
table holds the latest value per key, read by delta-rs), each a spark-submit of ~1 min (gc starts no Spark
session, the others a Spark application each); after each step the latest record per key of every partition is what
it was before compaction (`tests/latest_view.py`, the property of the other end-to-end tests).
Last, that no executor compiled a kernel: each unpacked environment holds exactly the numba caches the archive
ships (`compaction.prebuild.kernels`), and the executors' NUMBA_CACHE_DIR stays empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compaction.errors import ExitCode
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.reader import log_refs
from compaction.spark import delta
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir
from compaction.wal.upload import upload_logdir
from tests.latest_view import store_problems, views
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, REGION, UNSET_AWS_ENV
from tests.topic_table import table_rows

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO / "dist" / "kcompact-env.tar.gz"
VENV_BIN = Path(sys.executable).parent
NOW = 1_800_000_000_000
DAY = 86_400_000
PARTITIONS = [("orders", 0), ("orders", 1), ("users", 0)]
CONFIG = "defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n"
SIZING = {  # this machine's two workers of 1 core and 1 GiB, instead of conf/spark-defaults.conf's production sizes
    "spark.driver.memory": "1g",
    "spark.executor.memory": "512m",
    "spark.executor.memoryOverhead": "512m",
    "spark.executor.cores": "1",
}
SUBMIT_TIMEOUT_S = 600  # a hang guard: each job takes ~1 min here, more beside make test (CI runs them together)
DRIVER_PYTHON = ({} if (REPO / ".venv").resolve() == VENV_BIN.parent.resolve()
                 else {"spark.pyspark.driver.python": sys.executable})
"""conf/spark-defaults.conf's driver python is the checkout's .venv/bin/python; a checkout that runs its tests
from another one's venv (a git worktree) names that one."""

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class Target:
    """A store as the jobs name it, with what the driver's and the executors' environments need to reach it."""

    uri: str
    driver_env: dict[str, str]
    executor_env: dict[str, str]

    def open(self) -> ObjectStore:
        return open_store(self.uri, endpoint_url=self.driver_env.get("AWS_ENDPOINT_URL"))


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: its master's URL and the directory of its pids, logs and the workers' work
    dirs (each executor's unpacked environment among them)."""

    url: str
    directory: Path

    @property
    def numba_cache(self) -> Path:
        """The executors' NUMBA_CACHE_DIR (conf/spark-defaults.conf sets one), checked to stay empty."""
        return self.directory / "executor-numba-cache"


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not ARCHIVE.is_file():
        pytest.fail(f"{ARCHIVE.relative_to(REPO)} is missing: `make cluster-test` builds it (`make dist`)")
    directory = tmp_path_factory.mktemp("standalone")
    script = [sys.executable, str(REPO / "scripts" / "standalone_cluster.py")]
    try:
        started = subprocess.run([*script, "start", "--dir", str(directory)], capture_output=True, text=True,
                                 timeout=180)
        assert started.returncode == 0, started.stderr
        yield Cluster(started.stdout.strip(), directory)
    finally:
        subprocess.run([*script, "stop", "--dir", str(directory)], timeout=60)


@pytest.fixture
def target(moto_endpoint: str, tmp_path: Path) -> Target:
    """S3 on the moto server: the driver's environment reaches it, the executors get what `spark.executorEnv.*`
    hands them."""
    credentials = {k: FAKE_AWS_ENV[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    return Target(f"s3://{BUCKET}/cluster-{tmp_path.name}", {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL": moto_endpoint},
                  {**credentials, "AWS_REGION": REGION, "AWS_ENDPOINT_URL": moto_endpoint})


@pytest.fixture
def tiered(target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """Three partitions tiered a day before the run; the kcompact config beside them."""
    for name in UNSET_AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in target.driver_env.items():
        monkeypatch.setenv(name, value)
    generate_logdir(tmp_path / "logs", WorkloadSpec(topics=(TopicSpec("orders", 2), TopicSpec("users", 1)),
                                                    records_per_partition=2000, keys=150, segment_bytes=32 * 1024))
    store = target.open()
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW - DAY)
    upload_logdir(tmp_path / "logs", store, NOW - DAY)  # the active segments, as combined WAL objects
    (tmp_path / "kcompact.yaml").write_text(CONFIG)
    return store


def numba_caches(root: Path) -> dict[str, str]:
    """Every numba cache file (index `.nbi`, compiled code `.nbc`) under `root`: relative path -> SHA-256."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in root.rglob("*.nb[ic]")}


def shipped_caches() -> dict[str, str]:
    """The numba cache files the archive ships (`make dist` compiles the kernels into it), as `numba_caches`."""
    with tarfile.open(ARCHIVE) as archive:
        members = [m for m in archive.getmembers()
                   if m.isfile() and m.name.endswith((".nbi", ".nbc")) and "site-packages/compaction/" in m.name]
        return {m.name.split("site-packages/", 1)[1]: hashlib.sha256(archive.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
                for m in members}


def executor_compilations(cluster: Cluster) -> list[str]:
    """What the executors compiled: cache files of an unpacked environment that the archive does not ship (or
    ships with other bytes: an index a compiled entry was added to), and any file in their NUMBA_CACHE_DIR."""
    shipped = shipped_caches()
    assert sum(name.endswith(".nbc") for name in shipped) >= 30, "the archive ships no compiled kernels"
    envs = list(cluster.directory.glob("work-*/app-*/*/env/lib/python*/site-packages"))
    assert envs, f"no executor environment under {cluster.directory}"
    changed = [f"{env.parents[3].name}: {name}" for env in envs
               for name, digest in numba_caches(env).items() if shipped.get(name) != digest]
    return changed + [str(f) for f in cluster.numba_cache.rglob("*") if f.is_file()]


def spark_submit(master: Cluster, target: Target, script: str, *args: str, jars: tuple[str, ...] = (),
                 extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """docs/operating.md's spark-submit line for `jobs/<script>`, from the checkout, with the venv's launcher on PATH
    (and `jars` and `extra` confs, as docs/topic-table.md adds delta-spark's). The executors' NUMBA_CACHE_DIR is the
    cluster's `numba_cache`."""
    conf = {**SIZING, **DRIVER_PYTHON, "spark.executorEnv.NUMBA_CACHE_DIR": str(master.numba_cache),
            **{f"spark.executorEnv.{k}": v for k, v in target.executor_env.items()}, **(extra or {})}
    command = ["spark-submit", "--master", master.url, "--properties-file", "conf/spark-defaults.conf",
               *(("--jars", ",".join(jars)) if jars else ()),
               *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}")), f"jobs/{script}", *args]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "PYSPARK_", "NUMBA_")) and k not in ("SPARK_HOME", "SPARK_MASTER")}
    env.update(target.driver_env, PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", SPARK_LOCAL_IP="127.0.0.1")
    try:
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # say where it stood: the driver's, master's, workers' and executors' logs
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"jobs/{script} ran past {SUBMIT_TIMEOUT_S} s; the driver's stderr ended:\n{stderr[-6000:]}\n"
                    + "".join(f"--- {log.relative_to(master.directory)}:\n{log.read_text(errors='replace')[-3000:]}\n"
                              for log in [*sorted(master.directory.glob("*.log")),
                                          *sorted(master.directory.glob("work-*/app-*/*/stderr"))[-4:]]))


def succeeded(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == ExitCode.OK


def test_compact_verify_gc_on_a_standalone_cluster(master: Cluster, target: Target, tiered: ObjectStore,
                                                   tmp_path: Path) -> None:
    store, config = tiered, str(tmp_path / "kcompact.yaml")
    before, version = views(store, PARTITIONS), table_in_store(store).version()

    report_file = tmp_path / "report.json"
    done = spark_submit(master, target, "compact.py", "--store", target.uri, "--config", config, "--now", str(NOW),
                        "--report-json", str(report_file))
    assert succeeded(done), done.stderr[-4000:]
    report = json.loads(report_file.read_text())
    assert (report["exit_code"], report["failed"], report["metadata_version_planned"]) == (0, [], version)
    committed = [(p["topic"], p["partition"]) for p in report["partitions"] if p["committed"]]
    assert sorted(committed) == sorted((p["topic"], p["partition"]) for p in report["planned"] if p["eligible"])
    assert ("orders", 0) in committed and ("orders", 1) in committed
    assert all(p["segments_replaced"] > p["segments_written"] for p in report["partitions"])
    assert views(store, PARTITIONS) == before, "latest record per key unchanged"

    done = spark_submit(master, target, "verify.py", "--store", target.uri, "--topic", "orders", "--partition", "0",
                        "--before", str(version), "--json")  # one partition: a Spark application each
    assert succeeded(done), done.stderr[-4000:]
    assert json.loads(done.stdout)["ok"] is True

    done = spark_submit(master, target, "gc.py", "--store", target.uri, "--config", config,
                        "--now", str(NOW + 2 * DAY), "--json")
    assert succeeded(done), done.stderr[-4000:]
    gc = json.loads(done.stdout)
    assert gc["totals"]["objects_deleted"] >= sum(p["segments_replaced"] for p in report["partitions"]) > 0
    assert store_problems(store) == []
    assert views(store, PARTITIONS) == before

    assert any(r.wal for t, p in PARTITIONS for r in log_refs(store, t, p)), "no WAL tail to roll"
    roll_file = tmp_path / "roll.json"  # spark-submit's stdout also carries the driver's stderr progress lines
    done = spark_submit(master, target, "wal_roll.py", "--store", target.uri, "--config", config,
                        "--now", str(NOW + 30 * DAY), "--report-json", str(roll_file))  # past segment.ms
    assert succeeded(done), done.stderr[-4000:]
    rolled = json.loads(roll_file.read_text())
    assert rolled["exit_code"] == 0 and rolled["segments_rolled"] == len(PARTITIONS)
    assert all(p["committed_version"] is not None and p["open_tail_bytes"] == 0 for p in rolled["partitions"])
    assert not any(r.wal for t, p in PARTITIONS for r in log_refs(store, t, p)), "the log still ends in the WAL"
    assert views(store, PARTITIONS) == before

    # the topic table, written by delta-spark on the cluster's executors (docs/topic-table.md's spark-submit line)
    table = f"{target.uri}/tables/orders"
    done = spark_submit(master, target, "table.py", "--store", target.uri, "--config", config, "--topic", "orders",
                        "--table", table, "--now", str(NOW + 30 * DAY), "--json",
                        jars=tuple(str(j) for j in delta.jars()), extra={**delta.with_sql({}), **delta.LOGSTORE})
    assert succeeded(done), done.stderr[-4000:]
    options = target.open().delta_storage_options()
    rows = {(r[0], r[1], r[2], r[3]) for r in table_rows(target.open().delta_uri("tables/orders"), options)}
    assert rows == {(p, key, value, offset) for (t, p), view in before.items() if t == "orders"
                    for key, (offset, _ts, value, _headers) in view.items() if value is not None}

    assert executor_compilations(master) == [], "executors compiled kernels"
