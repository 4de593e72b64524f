"""The cluster tests run from `make cluster-test` only (KCOMPACT_CLUSTER_TEST=1), after `make dist`.

They start JVMs of their own (a standalone master, two workers, one spark-submit driver per job): minutes, not
seconds, so `make test` leaves them out (skipped, with the reason) and `.ci/run` runs them as a step of their own.
"""

from __future__ import annotations

import os

import pytest

ENABLED = os.environ.get("KCOMPACT_CLUSTER_TEST") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="a standalone cluster test: run `make cluster-test`")
    for item in items:
        if "tests/cluster/" in item.nodeid:
            item.add_marker(skip)
