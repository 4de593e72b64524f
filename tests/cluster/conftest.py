"""The cluster tests run from `make cluster-test` only (KCOMPACT_CLUSTER_TEST=1), after `make dist`.

They start JVMs of their own (a standalone master, two workers, one spark-submit driver per job): minutes, not
seconds, so `make test` leaves them out (skipped, with the reason) and `.ci/run` runs them as a step of their own.
"""

from __future__ import annotations

import pytest

from tests.opt_in import skip_unless_enabled


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_unless_enabled(items, env="KCOMPACT_CLUSTER_TEST", folder="cluster",
                        why="a standalone cluster test: run `make cluster-test`")
