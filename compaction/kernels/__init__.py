"""kcompact's numba kernels compiled once, at install time, and shipped with the package.

Every kernel is declared with `kernel(...)` (`cache.py`) instead of `numba.njit(cache=True)`: its compiled code is
kept in the `__pycache__` beside its module, wherever the package lives (a checkout, a wheel install, a packed
environment Spark unpacks under a new path per application), whatever NUMBA_CACHE_DIR says. `build.py` fills those
caches by calling every kernel once, for this machine's CPU and for a generic one of the same architecture; a
process on another CPU loads the generic code rather than compiling. `make venv` and `make dist` run it.
"""

from __future__ import annotations

from compaction.kernels.cache import kernel

__all__ = ["kernel"]
