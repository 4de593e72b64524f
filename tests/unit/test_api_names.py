"""`compaction.gc` and `compaction.verify` stay the API's functions once their subpackages are imported."""

from __future__ import annotations

import importlib
from pathlib import Path

import compaction
from compaction.gc import GcReport, collect_garbage
from compaction.metadata import table_in_store
from compaction.storage import open_store


def test_importing_a_subpackage_of_the_same_name_keeps_the_function() -> None:
    importlib.import_module("compaction.gc")
    importlib.import_module("compaction.verify")
    assert callable(compaction.gc) and callable(compaction.verify)
    assert compaction.gc.__module__ == compaction.verify.__module__ == "compaction"
    assert callable(collect_garbage)  # the subpackage still imports by its full name


def test_a_notebook_calls_gc_twice(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    table_in_store(store, create=True)
    for _ in range(2):
        assert isinstance(compaction.gc(str(tmp_path / "store"), dry_run=True), GcReport)
