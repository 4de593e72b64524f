"""P0c (issue 27 a): a fresh clone's first `kcompact compact` against its second, and the shipped kernels' speed.

What a new user does: clone, the documented setup (`make venv java cds`, docs/operating.md), then run `kcompact
compact` on a schedule, each run a fresh process. Nothing may compile at run time, so the first process must cost
what the second does. The clone is of this checkout's HEAD (committed code only) into a temporary directory, set up
with its own class archive directory (`KCOMPACT_CACHE_DIR`) and without this process's NUMBA_CACHE_DIR or
PYTHONPATH, as a user's shell would be. One clone per shape, so that each shape's first process is a first run.

The kernels' speed with and without the code compiled for this CPU: `make venv` compiles every kernel for the host
CPU and for a generic one of the architecture (what an executor on another CPU loads). Both are timed on the same
segment files, each in a fresh process with `KCOMPACT_PREBUILT_KERNELS_ONLY=1` (a missing entry fails instead of
compiling), best of three scans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_measure import SMALL_SCALE, cli_processes
from bench_workloads import ROOT, bulk, e2e_args, kafka_workload, rolled_logs, tiered

SETTINGS = {"min.cleanable.dirty.ratio": "0.01"}
USER_ENV_DROPS = ("NUMBA_CACHE_DIR", "PYTHONPATH", "KCOMPACT_CACHE_DIR", "VIRTUAL_ENV")


def _user_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV_DROPS}
    return {**env, "KCOMPACT_CACHE_DIR": str(cache)}


def fresh_clone_runs(pristine: Path, workload: str, runs: int = 3) -> dict[str, Any]:
    """Clone HEAD, run the documented setup in it, then `runs` fresh `kcompact compact` processes on copies of
    `pristine` (a tiered store): the first against the second."""
    with tempfile.TemporaryDirectory(prefix="kcompact-clone-") as tmp:
        clone, env = Path(tmp) / "kcompact", _user_env(Path(tmp) / "cache")
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        started = time.perf_counter()
        subprocess.run(["make", "-C", str(clone), "venv", "java", "cds"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        setup = time.perf_counter() - started
        cli = cli_processes(pristine, SETTINGS, runs=runs, env=env, kcompact=clone / ".venv" / "bin" / "kcompact")
    seconds = cli["seconds"]
    return {"workload": workload, "commit": head, "setup_seconds": setup, "seconds": seconds,
            "first_over_second": seconds[0] / seconds[1], "command": cli["command"], "bytes_read": cli["bytes_read"],
            "load": os.getloadavg()}


SCAN = """
import json, sys, time
from pathlib import Path
from compaction.format.scan import scan_segment
files = [Path(p) for p in sys.argv[1:]]
scan_segment(files[0].read_bytes())
def once():
    started = time.perf_counter()
    for f in files:
        scan_segment(f.read_bytes(), obj=str(f))
    return time.perf_counter() - started
print(json.dumps({"seconds": min(once() for _ in range(3)), "bytes": sum(f.stat().st_size for f in files)}))
"""


def kernel_speeds(files: list[Path], workload: str) -> dict[str, Any]:
    """The scan's MB/s over `files` with the host CPU's compiled kernels and with the generic CPU's, alternated."""
    out: dict[str, list[float]] = {"host": [], "generic": []}
    size = 0
    for _ in range(2):
        for cpu in out:
            env = {**os.environ, "KCOMPACT_PREBUILT_KERNELS_ONLY": "1"}
            env.pop("NUMBA_CPU_NAME", None)
            if cpu == "generic":
                env["NUMBA_CPU_NAME"] = "generic"
            done = subprocess.run([sys.executable, "-c", SCAN, *map(str, files)], check=True, env=env,
                                  capture_output=True, text=True)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            size = figures["bytes"]
            out[cpu].append(size / figures["seconds"] / 1e6)
    return {"workload": workload, "bytes": size, "host_mb_s": max(out["host"]), "generic_mb_s": max(out["generic"]),
            "load": os.getloadavg()}


def bench_fresh(scale: float = 1.0) -> dict[str, Any]:
    """P0c on P0's two small shapes (one fresh clone each), and the kernels' speeds on P2's and P2K's segments."""
    bulk_args = e2e_args(SMALL_SCALE * scale, "none")
    kp_logdir, kp_args, _seconds = kafka_workload(SMALL_SCALE * scale)
    small = [("kcompact generate --bulk " + " ".join(bulk_args), bulk(f"small-{bulk_args[3]}", *bulk_args)),
             ("python scripts/kafka_workload.py " + " ".join(kp_args), kp_logdir)]
    clones = [fresh_clone_runs(tiered(logdir, logdir.name), workload) for workload, logdir in small]
    p2_args = e2e_args(scale, "none")
    p2 = bulk(f"e2e-none-{p2_args[3]}", *p2_args)
    kp_full, kp_full_args, _ = kafka_workload(scale)
    kernels = [kernel_speeds(rolled_logs(p2), "kcompact generate --bulk " + " ".join(p2_args)),
               kernel_speeds(rolled_logs(kp_full), "python scripts/kafka_workload.py " + " ".join(kp_full_args))]
    return {"clones": clones, "kernels": kernels}
