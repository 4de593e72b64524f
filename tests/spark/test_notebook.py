"""docs/notebook.md runs top to bottom, twice, on the shared Spark session; rerunning its cells changes no data."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compaction.metadata import table_in_store

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebook.md"
CELL = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def cells() -> list[str]:
    return CELL.findall(NOTEBOOK.read_text())


def run_cell(namespace: dict[str, Any], cells_: list[str], marker: str) -> None:
    """Run the one cell containing `marker` again, as a person rerunning it would."""
    (code,) = [c for c in cells_ if marker in c]
    exec(compile(code, f"{NOTEBOOK.name} ({marker})", "exec"), namespace)


def run_all(namespace: dict[str, Any], cells_: list[str]) -> None:
    for i, code in enumerate(cells_, 1):
        exec(compile(code, f"{NOTEBOOK.name} cell {i}", "exec"), namespace)


def live(namespace: dict[str, Any]) -> dict[int, tuple[str, ...]]:
    table = table_in_store(namespace["store"])
    return {p: tuple(s.segment_id for s in table.live_segments("orders", p)) for p in (0, 1)}


@pytest.mark.spark
def test_the_notebook_runs_top_to_bottom_twice(spark: SparkSession, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = cells()
    assert len(code) == 10
    ns: dict[str, Any] = {"__name__": "__notebook__"}

    run_all(ns, code)
    assert ns["spark"] is spark, "the notebook uses the running session"
    assert len(ns["run"].plan.eligible) == 2
    assert [o.committed for o in ns["outcomes"]] == [True, True]
    assert ns["plan_df"].filter("eligible").count() == 2
    assert ns["staged_df"].count() == sum(len(sp.new_segments) for sp in ns["staged"].partitions) > 0
    assert all(v.ok for v in ns["verdicts"])
    assert ns["orders0"].count() < ns["report"].partitions[0].records_read
    assert (tmp_path / "notebook-report.html").read_text().startswith("<!DOCTYPE html>")
    compacted = live(ns)

    version = table_in_store(ns["store"]).version()
    run_cell(ns, code, "outcomes = commit(staged)")  # the same staged run, committed again: it already landed
    assert [o.committed for o in ns["outcomes"]] == [True, True]
    assert table_in_store(ns["store"]).version() == version and live(ns) == compacted, "nothing landed twice"
    run_cell(ns, code, "staged = stage(spark, run)")  # the same plan, staged again after its commit
    assert ns["staged"].partitions == [] and len(ns["staged"].failed) == 2
    assert {type(e).__name__ for e in ns["staged"].failed.values()} == {"CommitConflictError"}
    assert live(ns) == compacted

    version = table_in_store(ns["store"]).version()
    run_all(ns, code)
    assert ns["run"].plan.eligible == () and ns["outcomes"] == []
    assert table_in_store(ns["store"]).version() == version, "a second pass commits nothing"
    assert live(ns) == compacted
