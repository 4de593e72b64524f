"""`make venv` leaves the modules a run imports compiled to bytecode (Makefile, docs/operating.md "Bytecode"): where a
process may not write `__pycache__` (PYTHONDONTWRITEBYTECODE, a read-only install), each process, every Spark Python
worker included, would otherwise compile them from source, 1.3-1.9 s of CPU each time."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

IMPORTED_BY_A_WORKER = ("pandas.core.frame", "pyspark.worker", "numba.core.dispatcher", "pyarrow.pandas_compat",
                        "deltalake.table", "compaction.spark.fused", "compaction.format.scan")
"""Modules of each package a fused task's Python worker imports (pyarrow imports pandas at its first `pa.array`)."""


@pytest.mark.parametrize("name", IMPORTED_BY_A_WORKER)
def test_what_a_worker_imports_has_its_bytecode_beside_it(name: str) -> None:
    source = importlib.import_module(name).__file__
    assert source is not None and source.endswith(".py")
    cached = importlib.util.cache_from_source(source)
    assert Path(cached).is_file(), f"{name} has no bytecode at {cached}: run `make venv` (Makefile: bytecode)"


def test_a_fresh_process_compiles_nothing_a_worker_imports() -> None:
    """No module of the packages above is compiled from source by a fresh interpreter that may not write bytecode
    (the source's own edits aside: a module changed since `make kernels` compiled it is compiled in memory)."""
    probe = (
        "import _frozen_importlib_external as m\n"
        "compiled = []\n"
        "original = m.SourceLoader.source_to_code\n"
        "def counting(self, data, path, *a, **k):\n"
        "    compiled.append(path)\n"
        "    return original(self, data, path, *a, **k)\n"
        "m.SourceLoader.source_to_code = counting\n"
        f"for name in {IMPORTED_BY_A_WORKER!r}:\n"
        "    __import__(name)\n"
        "print('\\n'.join(p for p in compiled if '/site-packages/' in p))\n"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [], f"compiled from source in a fresh process:\n{done.stdout}"
