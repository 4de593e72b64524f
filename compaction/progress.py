"""Progress lines for long runs, on stderr: one per phase, and `i/n` steps with an ETA.

    [kcompact +0.4s] plan: 5 partitions at metadata version 12, 3 to compact
    [kcompact +41.2s] stage: 3 partitions rewritten and uploaded, 0 failed
    [kcompact +41.9s] commit 1/3 orders-0: committed at version 14

Spark's staging is one job for every partition, so it reports when it ends, and so does the commit of a run's
partitions (a line per partition once it is known); counted steps (`steps`) estimate what is left from the mean
time per step so far. The clock is injected (monotonic by
default) so the caller decides what time is; stdout stays free for the command's own output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Writes `[kcompact +<elapsed>s] <message>` lines to `stream`, elapsed since construction."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic, prefix: str = "kcompact") -> None:
        self._stream = stream
        self._clock = clock
        self._prefix = prefix
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def phase(self, message: str) -> None:
        """One line for a phase that finished (or started)."""
        self._stream.write(f"[{self._prefix} +{self.elapsed():.1f}s] {message}\n")
        self._stream.flush()

    def steps(self, label: str, total: int) -> Steps:
        """A counter of `total` steps, each reported as `label i/total`, with an ETA."""
        return Steps(self, label, total)


class Steps:
    """`total` steps of one phase; `step` reports one more as done."""

    def __init__(self, progress: Progress, label: str, total: int) -> None:
        self._progress = progress
        self._label = label
        self._total = total
        self._done = 0
        self._start = progress.elapsed()

    def step(self, message: str) -> None:
        self._done += 1
        spent = self._progress.elapsed() - self._start
        left = self._total - self._done
        eta = f" (ETA {spent / self._done * left:.1f}s)" if left > 0 else ""
        self._progress.phase(f"{self._label} {self._done}/{self._total} {message}{eta}")
