"""`kcompact compact` with nothing to do still writes its report, HTML page and metrics (no Spark is started)."""

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

    metrics = parse_strict(out["kcompact.prom"].read_text())
    assert metrics[("kcompact_max_dirty_percent", "")] == 100
    assert metrics[("kcompact_partition_dirty_ratio", '{topic="orders",partition="0"}')] == 1.0
    assert metrics[("kcompact_bytes_read_total", "")] == 0
    assert metrics[("kcompact_last_run_timestamp_seconds", "")] == NOW / 1000
    assert "Nothing was compacted in this run." in out["report.html"].read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*out, "config.yaml"]), "no temporary file left"


def test_a_dry_run_writes_nothing(tiered_store: Path, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(NOTHING_TO_DO)
    code = main(["compact", "--dry-run", "--store", str(tiered_store), "--config", str(tmp_path / "config.yaml"),
                 "--metrics-file", str(tmp_path / "kcompact.prom")])
    assert code == 0 and not (tmp_path / "kcompact.prom").exists()
