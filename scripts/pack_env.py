"""`make dist`: the executors' Python environment, packed for `spark.archives` (dist/kcompact-env.tar.gz).

A virtual environment with kcompact installed from a wheel (not editable: venv-pack refuses editable installs, and
an executor has no checkout to point at) and kcompact's runtime dependencies from pyproject.toml, except pyspark and
delta-spark (`LEFT_OUT`): executors import the cluster's own pyspark (Spark puts
`$SPARK_HOME/python/lib/pyspark.zip` on their PYTHONPATH), which must be the driver's version anyway, and leaving it
out saves ~450 MB per executor. venv-pack then packs it with relative paths, so it works wherever Spark unpacks it
(`#env` -> ./env/bin/python). The kernels are compiled into the environment's `compaction/**/__pycache__` before
packing (`compaction.prebuild.kernels`, for the build machine's CPU and a generic one), so that executors load them
instead of compiling them in every application.

venv-pack does not copy the interpreter itself: `bin/python` links to the base Python the environment was made
from (this machine's `python3.11`), which must exist at the same path on every executor host (same image).

Packages are installed by the project venv's uv (`make packages` puts it there), bytecode compiled as pip would, so that
an executor does not compile kcompact's dependencies' modules in every application.

Cached under .dist-cache/ (git-ignored): the environment is rebuilt only when the dependency list changes; the
kcompact wheel is rebuilt and reinstalled on every call. Run with the project venv's python:

    .venv/bin/python scripts/pack_env.py [--python python3.11] [--output dist/kcompact-env.tar.gz]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".dist-cache"
VENV_PACK = "venv-pack==0.2.0"
LEFT_OUT = {"pyspark", "delta-spark"}
"""pyspark is the cluster's Spark installation's (see the module docstring); delta-spark's Python package is the
driver's API only (executors run Delta's JVM code, from the jars the job ships), and installing it would pull pyspark
in."""
UV = Path(sys.executable).parent / "uv"
SMOKE = ("import numba, pyarrow, deltalake, boto3, compaction.format.scan, compaction.rewrite.group, "
         "compaction.metadata, compaction.storage.s3")


def runtime_requirements(pyproject: Path) -> list[str]:
    """kcompact's pinned runtime dependencies, less those the cluster provides."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return sorted(d for d in deps if d.split("==")[0].strip().lower() not in LEFT_OUT)


def run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def fresh_venv(path: Path, python: str, requirements: list[str]) -> None:
    """`path` as a venv holding `requirements`, rebuilt only when they changed since the last build."""
    stamp = path / ".requirements"
    wanted = "\n".join(requirements) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    shutil.rmtree(path, ignore_errors=True)
    run(python, "-m", "venv", path)
    install(path, *requirements)
    stamp.write_text(wanted)


def install(venv: Path, *args: str | Path) -> None:
    run(UV, "pip", "install", "--quiet", "--compile-bytecode", "--python", venv / "bin" / "python", *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.11", help="the base interpreter (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=REPO / "dist" / "kcompact-env.tar.gz")
    args = parser.parse_args()

    env, tools, wheels = CACHE / "env", CACHE / "tools", CACHE / "wheel"
    fresh_venv(env, args.python, runtime_requirements(REPO / "pyproject.toml"))
    fresh_venv(tools, args.python, [VENV_PACK])
    shutil.rmtree(wheels, ignore_errors=True)
    run(env / "bin" / "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, REPO)
    (wheel,) = wheels.glob("kcompact-*.whl")
    install(env, "--no-deps", "--reinstall", wheel)
    run(env / "bin" / "python", "-I", "-c", SMOKE)  # -I: no PYTHONPATH, no checkout: what an executor sees
    run(env / "bin" / "python", "-I", "-m", "compaction.prebuild.kernels")  # compiled kernels, shipped in the archive
    args.output.parent.mkdir(parents=True, exist_ok=True)
    run(tools / "bin" / "venv-pack", "--prefix", env, "--output", args.output, "--force", "--quiet")
    print(f"{args.output} ({args.output.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
