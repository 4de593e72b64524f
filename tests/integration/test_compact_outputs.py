"""`kcompact compact`: with nothing to do it still writes its report, HTML page and metrics (no Spark is started); a
fresh process with work says when Spark started and rates each partition by its own work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.tier import tier_logdir
from tests.prometheus_text import parse_strict
from tests.unit.run_reports import sample_report

NOW = 1_800_000_000_000
NOTHING_TO_DO = """
defaults:
  cleanup.policy: compact
  min.cleanable.dirty.ratio: 1.0   # a ratio is never above 1: nothing is eligible
"""


@pytest.fixture(scope="module")
def tiered_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outputs")
    generate_logdir(root / "logs", WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=1500,
                                                keys=100, segment_bytes=32 * 1024, seed=3))
    store = open_store(str(root / "store"))
    tier_logdir(root / "logs", store, table_in_store(store, create=True), NOW - 86_400_000)
    return root / "store"


def test_a_run_with_nothing_to_do_writes_every_output(tiered_store: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yaml").write_text(NOTHING_TO_DO)
    out = {name: tmp_path / name for name in ("report.json", "report.html", "kcompact.prom")}
    code = main(["compact", "--store", str(tiered_store), "--config", str(tmp_path / "config.yaml"),
                 "--now", str(NOW), "--report-json", str(out["report.json"]),
                 "--html-report", str(out["report.html"]), "--metrics-file", str(out["kcompact.prom"])])
    captured = capsys.readouterr()
    assert code == 0 and "nothing to compact" in captured.out
    assert "plan: 1 partitions at metadata version" in captured.err and ", 0 to compact" in captured.err

    report = json.loads(out["report.json"].read_text())
    assert report.keys() == sample_report().keys(), "tests/unit/run_reports.py must follow the real report"
    assert report["planned"][0].keys() == sample_report()["planned"][0].keys()
    assert report["partitions"] == [] and report["planned"][0]["decision"] == "below_ratio"
    assert report["metadata_requests"]["puts"] == 0, "nothing committed"
    # the plan read the partition's producer snapshot: one GET of its last segment's .indexes object (header and
    # snapshot together), in the driver
    assert report["plan_requests"]["gets"] == 1 and report["requests"]["gets"] == 0

    metrics = parse_strict(out["kcompact.prom"].read_text())
    assert metrics[("kcompact_max_dirty_percent", "")] == 100
    assert metrics[("kcompact_partition_dirty_ratio", '{topic="orders",partition="0"}')] == 1.0
    assert metrics[("kcompact_bytes_read_total", "")] == 0
    assert metrics[("kcompact_metadata_requests_total", '{method="PUT"}')] == 0
    assert metrics[("kcompact_plan_requests_total", "")] == 1
    assert metrics[("kcompact_last_run_timestamp_seconds", "")] == NOW / 1000
    assert "Nothing was compacted in this run." in out["report.html"].read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*out, "config.yaml"]), "no temporary file left"


def test_a_dry_run_writes_nothing(tiered_store: Path, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(NOTHING_TO_DO)
    code = main(["compact", "--dry-run", "--store", str(tiered_store), "--config", str(tmp_path / "config.yaml"),
                 "--metrics-file", str(tmp_path / "kcompact.prom")])
    assert code == 0 and not (tmp_path / "kcompact.prom").exists()


@pytest.mark.spark
def test_a_fresh_process_says_when_spark_started_and_rates_each_partition_by_its_own_work(
        tiered_store: Path, tmp_path: Path) -> None:
    """As a user runs it, a fresh `kcompact compact`: its progress says how long the Spark session took to start
    (before `stage:`), and the partition's Kafka-style lines count its own executor time, not that start."""
    import shutil
    import subprocess
    import sys

    store = tmp_path / "store"
    shutil.copytree(tiered_store, store)
    (tmp_path / "config.yaml").write_text("defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n")
    done = subprocess.run([sys.executable, "-m", "compaction.cli", "compact", "--store", str(store), "--config",
                           str(tmp_path / "config.yaml"), "--now", str(NOW)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    progress = [line for line in done.stderr.splitlines() if line.startswith("[kcompact +")]
    started = next(i for i, line in enumerate(progress) if "] spark: session started in " in line)
    assert "local[2], 2 task slots)" in progress[started]
    assert started < next(i for i, line in enumerate(progress) if "] stage: 1 partitions rewritten" in line)
    seconds = float(progress[started].split("session started in ")[1].split(" s ")[0])
    processed = next(line for line in done.stdout.splitlines() if "MB of log processed in" in line)
    own = float(processed.split("processed in ")[1].split(" seconds")[0])
    assert own < seconds, (processed, progress[started])  # a small partition's work, not Spark's start
    assert "(each partition's seconds above are its own executor time; the run's wall clock is below)" in done.stdout
    # the fencing-epoch commit and the swap: a data file of the partition and a commit file each
    assert "metadata table requests: 4 PUT" in done.stdout, done.stdout[-2000:]
    # its producer snapshot, and the transaction indexes of the region it compacts (the workload has transactions)
    plan_gets = int(done.stdout.split("the plan's requests (in the driver): ")[1].split(" GET")[0])
    assert plan_gets > 1
