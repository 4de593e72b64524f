"""A generated log dir shared by a test module, and a fresh store tiered from it per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction.generate import WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir


def generated_logdir(factory: pytest.TempPathFactory, name: str, spec: WorkloadSpec) -> Path:
    root = factory.mktemp(name)
    generate_logdir(root, spec)
    return root


def tiered_store(logdir: Path, root: Path, now_ms: int) -> ObjectStore:
    """A new store under `root` holding `logdir` tiered at `now_ms`."""
    store = open_store(str(root / "store"))
    tier_logdir(logdir, store, table_in_store(store, create=True), now_ms)
    return store
