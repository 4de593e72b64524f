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

Nothing else changes: the workers are forked as pyspark forks them, importing what they run after the fork (pyspark's
daemon imports nothing that starts threads before it forks, and neither does this module).
"""

from __future__ import annotations

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


def main() -> None:
    sys.path[:] = without_spark_zips(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
