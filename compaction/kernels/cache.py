"""Where kcompact's kernels keep their compiled code, and how a process finds it.

numba's own `cache=True` looks first in NUMBA_CACHE_DIR, under a directory named after the hash of the source
file's absolute path: a packed environment unpacked under a new path never finds what was built elsewhere. Next to
the source (`__pycache__`, numba's in-tree locator) the cache moves with the package, and numba checks an entry
against the source's content hash, the function's bytecode and the CPU it was compiled for, never the path. So
kcompact's kernels use that place first, and NUMBA_CACHE_DIR (then numba's user-wide directory) only where the
package directory is not writable.

An entry is keyed by the CPU name and features it was compiled for (`CPUCodegen.magic_tuple`). A process whose CPU
has no entry of its own loads the one compiled for `generic` (NUMBA_CPU_NAME=generic: the architecture's baseline
instruction set, which every CPU of it runs) before it compiles; its own entry, when one is compiled, wins next time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numba
from numba.core.caching import CompileResultCacheImpl, FunctionCache, InTreeCacheLocator

GENERIC_CPU = "generic"

PREBUILT_ONLY = "KCOMPACT_PREBUILT_KERNELS_ONLY"
"""Set to 1 in a process's environment (a Spark executor inherits the driver's in local mode), a kernel called with
argument types that have no cached code raises `KernelNotBuilt` instead of compiling: how the tests prove that
`build.py` covers every signature a run uses, and how a deployment can insist that nothing compiles at run time."""


class KernelNotBuilt(RuntimeError):
    """A kernel has no compiled code for a call's argument types and `PREBUILT_ONLY` forbids compiling it."""


class _PackageCacheImpl(CompileResultCacheImpl):
    """numba's locators, the one beside the source first (NUMBA_CACHE_LOCATOR_CLASSES still overrides them)."""

    _locator_classes = [InTreeCacheLocator, *CompileResultCacheImpl._locator_classes]  # noqa: RUF012 (numba's)


class KernelCache(FunctionCache):
    """A kernel's cache beside its source, falling back to the generic CPU's entry on a miss."""

    _impl_class = _PackageCacheImpl

    def _load_overload(self, sig: Any, target_context: Any) -> Any:
        found = super()._load_overload(sig, target_context)
        if found is not None or not self._enabled:
            return found
        signature, (triple, _cpu, _features), code = self._index_key(sig, target_context.codegen())
        data = self._cache_file.load((signature, (triple, GENERIC_CPU, ""), code))
        if data is None and os.environ.get(PREBUILT_ONLY) == "1":
            raise KernelNotBuilt(f"{self._name} has no compiled code for {sig} in {self._cache_path} and "
                                 f"{PREBUILT_ONLY}=1 forbids compiling it: `python -m compaction.prebuild.kernels` "
                                 "compiles what a run's calls need")
        return None if data is None else self._impl.rebuild(target_context, data)


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit(**options)` with its compiled code cached beside the module (`KernelCache`).

    numba has no option to pick a dispatcher's cache class; `enable_caching` assigns `_cache`, and so does this.
    """

    def wrap(function: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(function)
        dispatcher._cache = KernelCache(function)
        return dispatcher

    return wrap
