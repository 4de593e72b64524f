"""Suites that run only under their own make target (they need more than .venv): skipped in a plain `make test`,
naming the target, unless its environment variable is "1"."""

from __future__ import annotations

import os

import pytest


def skip_unless_enabled(items: list[pytest.Item], *, env: str, folder: str, why: str) -> None:
    """Mark every item under tests/`folder`/ skipped with `why`, unless `env` is "1"."""
    if os.environ.get(env) == "1":
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if f"tests/{folder}/" in item.nodeid:
            item.add_marker(skip)
