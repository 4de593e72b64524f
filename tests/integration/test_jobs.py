"""The spark-submit entry points run as scripts, with the venv's python, and exit with kcompact's codes.

They run here as plain subprocesses (verify starts its own local Spark session there, as spark-submit would
give it one); compact shares the CLI's code path (`tests/spark/test_verify.py` runs it in-process on the shared
session).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction.errors import ExitCode
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.tier import tier_logdir

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000_000
CONFIG = "defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n"


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jobs")
    generate_logdir(root / "logs", WorkloadSpec(topics=(TopicSpec("orders", 1), TopicSpec("users", 1)),
                                                records_per_partition=1000, keys=100, segment_bytes=32 * 1024))
    store = open_store(str(root / "store"))
    tier_logdir(root / "logs", store, table_in_store(store, create=True), NOW - 86_400_000)
    (root / "kcompact.yaml").write_text(CONFIG)
    return root / "store"


def job(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    return subprocess.run([sys.executable, str(REPO / "jobs" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # a hang guard: ~45 s when CI runs two workers


def test_jobs_plan_prints_the_plan_and_exits_0(store_dir: Path) -> None:
    done = job("plan.py", "--store", str(store_dir), "--config", str(store_dir.parent / "kcompact.yaml"),
               "--now", str(NOW), "--json")
    assert done.returncode == ExitCode.OK, done.stderr
    plan = json.loads(done.stdout)
    assert plan["metadata_version"] == table_in_store(open_store(str(store_dir))).version()
    assert plan["now_ms"] == NOW
    decisions = {(p["topic"], p["partition"]): p["decision"] for p in plan["partitions"]}
    # users-0 ends in a transaction tiered without its marker, which holds its dirty segments back
    assert decisions == {("orders", 0): "dirty_ratio", ("users", 0): "nothing_cleanable"}


def test_jobs_plan_exits_2_naming_a_bad_config_key(store_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("defaults:\n  min.cleanable.dirty.ratio: 1.5\n")
    done = job("plan.py", "--store", str(store_dir), "--config", str(tmp_path / "bad.yaml"))
    assert done.returncode == ExitCode.CONFIG
    assert "min.cleanable.dirty.ratio" in done.stderr and "bad.yaml" in done.stderr


def test_jobs_verify_exits_0_when_nothing_changed(store_dir: Path) -> None:
    version = str(table_in_store(open_store(str(store_dir))).version())
    done = job("verify.py", "--store", str(store_dir), "--topic", "orders", "--partition", "0", "--before", version)
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stdout.startswith("verify orders-0: OK")
