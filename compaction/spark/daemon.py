"""The Python daemon of the sessions kcompact launches (`spark.python.daemon.module`): pyspark's own, with pyspark
imported from its installed package instead of the zip Spark puts first on the workers' path.

Spark starts the daemon that forks a session's Python workers with `PYTHONPATH` led by `$SPARK_HOME/python/lib`'s
`pyspark.zip` and py4j's zip (`PythonUtils.sparkPythonPath`). Under a pip-installed pyspark those zips lie inside the
very package the interpreter would import without them, holding the same sources, but Python compiles a module
imported from a zip of sources every time: the daemon's imports took 0.6-1.1 s where the installed package's compiled
modules take 0.1-0.3 s, and each worker compiled the pyspark modules it imports after its fork again
(docs/operating.md, "Bytecode"). So this daemon drops those zips from `sys.path` when the same package is importable
without them, then runs pyspark's `daemon.manager` unchanged. Where they are the only pyspark (a Spark distribution's
`SPARK_HOME` and an environment without pyspark, as the packed executors' of `make dist`), the path is left as it is.

Before it forks any worker, the daemon also tells the C library's allocator to keep the memory the workers free
(`keep_freed_memory`): every worker inherits the setting.

Nothing else changes: the workers are forked as pyspark forks them, importing what they run after the fork (pyspark's
daemon imports nothing that starts threads before it forks, and neither does this module).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from importlib.machinery import PathFinder

SPARK_ZIPS = ("pyspark", "py4j")
"""The packages Spark's zips hold (`pyspark.zip`, `py4j-<version>-src.zip`), each in `<pyspark package>/python/lib`."""


def _is_spark_zip(entry: str) -> bool:
    """Whether a path entry is one of Spark's zips (`pyspark.zip`, `py4j-<version>-src.zip`). Pure."""
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def without_spark_zips(path: Sequence[str]) -> list[str]:
    """`path` without Spark's zips when they lie inside the pyspark package that `path` without them imports (a pip
    install: the zips hold that package's own sources) and that path imports py4j too; `path` unchanged otherwise."""
    zips = [e for e in path if _is_spark_zip(e)]
    if not zips:
        return list(path)
    rest = [e for e in path if not _is_spark_zip(e)]
    found = {name: PathFinder.find_spec(name, rest) for name in SPARK_ZIPS}
    pyspark = found["pyspark"]
    if pyspark is None or pyspark.origin is None or found["py4j"] is None:
        return list(path)
    package = os.path.dirname(os.path.realpath(pyspark.origin))
    inside = all(os.path.dirname(os.path.realpath(e)) == os.path.join(package, "python", "lib") for e in zips)
    return rest if inside else list(path)


M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
"""glibc's `mallopt` parameters (malloc.h)."""

KEEP_FREED: tuple[tuple[int, int], ...] = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, (1 << 31) - 1), (M_TOP_PAD, 512 << 20))
"""What a worker's allocator is told (`keep_freed_memory`): no block in a mapping of its own (glibc's default maps
every block above 128 KiB-32 MiB apart, and unmaps it when it is freed), the heap's free top returned to the system
only past 2 GiB (the most `mallopt` takes), and the heap grown 512 MiB beyond each need (address space: a page counts
only once touched)."""


def keep_freed_memory(parameters: Sequence[tuple[int, int]] = KEEP_FREED) -> bool:
    """Have this process's C library keep the memory it frees for its next allocations (`KEEP_FREED`), where the C
    library is glibc; whether it took every setting. A worker's arrays are large and short-lived (a segment's decoded
    columns, a fold's table, a rewrite's output): by default each is a fresh mapping, unmapped when freed, so the next
    one faults and zeroes every page again, in the kernel. Kept, the next array reuses the pages already faulted. A
    worker then holds the memory of its largest task until it exits (a reused worker: the session's end). Measured on
    2 cores (docs/operating.md, BENCHMARKS.md P10): P2K's stage in a session that had compacted before 4.1-4.4 s ->
    3.2-3.6 s (a pass over one partition's segments faulted 34-39 MB of pages instead of ~290 MB); P10's 12 M-key
    partition 13.0-13.3 s -> 9.3-9.9 s, its workers' peak memory 2.7-3.0 GB -> 3.9-4.0 GB."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the symbols of the process itself, its C library's among them
    except (OSError, AttributeError):  # no C library to ask, or not glibc's (macOS's has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(parameter, value) == 1 for parameter, value in parameters])


def main() -> None:
    sys.path[:] = without_spark_zips(sys.path)
    keep_freed_memory()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
