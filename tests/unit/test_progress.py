"""Progress lines: elapsed time per phase, `i/n` steps with an ETA from the mean step time so far."""

from __future__ import annotations

import io
from collections.abc import Iterator

from compaction.progress import Progress


def clock(*ticks: float) -> Iterator[float]:
    yield from ticks


def test_phases_and_steps_with_an_eta() -> None:
    out = io.StringIO()
    ticks = clock(100.0, 100.5, 130.0, 130.0, 132.0, 132.0, 133.0, 133.0, 136.0, 136.0)
    progress = Progress(out, clock=lambda: next(ticks))
    progress.phase("plan: 3 partitions")  # 100.5
    progress.phase("stage: 3 staged")  # 130.0
    steps = progress.steps("commit", 3)  # starts at 130.0
    steps.step("orders-0: committed")  # 132.0: 2 s per step, 2 left
    steps.step("orders-1: committed")  # 133.0: 1.5 s per step, 1 left
    steps.step("users-0: committed")  # 136.0: done, no ETA
    assert out.getvalue().splitlines() == [
        "[kcompact +0.5s] plan: 3 partitions",
        "[kcompact +30.0s] stage: 3 staged",
        "[kcompact +32.0s] commit 1/3 orders-0: committed (ETA 4.0s)",
        "[kcompact +33.0s] commit 2/3 orders-1: committed (ETA 1.5s)",
        "[kcompact +36.0s] commit 3/3 users-0: committed",
    ]
