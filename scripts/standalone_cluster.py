"""A Spark standalone cluster on 127.0.0.1 from the venv's own pyspark: a master and N workers, each its own JVM.

    .venv/bin/python scripts/standalone_cluster.py start --dir /tmp/kcompact-cluster   # prints the master URL
    .venv/bin/python scripts/standalone_cluster.py stop --dir /tmp/kcompact-cluster

pip's pyspark ships `bin/spark-class` but not `sbin/start-master.sh`, so the daemons are started here with
`spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker`, on free ports, each in a process group
of its own whose id goes to `<dir>/pids`; `stop` ends exactly those groups. `start` returns once every worker has
registered (the master's /json/ page), and fails (stopping what it started) if that takes over a minute.

The daemons get a plain environment: no AWS_*, PYSPARK_*, PYTHONPATH or NUMBA_* variable of the caller's reaches
them, so executors see only what an application gives them (`spark.executorEnv.*`, `spark.archives`), as on a
real cluster. Logs: `<dir>/master.log`, `<dir>/worker-<i>.log`; executors' work dirs under `<dir>/work-<i>/`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

STARTUP_TIMEOUT_S = 60.0
KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "JAVA_HOME", "TMPDIR", "USER")


def spark_home() -> Path:
    """The pyspark package of the interpreter running this script (pip installs Spark's launchers there)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV}
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    return env


def launch(directory: Path, name: str, args: list[str]) -> int:
    log = (directory / f"{name}.log").open("wb")
    process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=log,
                               stderr=subprocess.STDOUT, env=daemon_env(), cwd=directory, start_new_session=True)
    with (directory / "pids").open("a") as pids:
        pids.write(f"{process.pid}\n")
    return process.pid


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as reply:
            return int(json.load(reply).get("aliveworkers", 0))
    except (OSError, ValueError):  # not listening yet, or a page still being set up (not JSON yet)
        return 0


def start(directory: Path, workers: int, cores: int, memory: str) -> dict[str, object]:
    """Start the master and `workers` workers; wait until all registered. Returns the master and UI URLs."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "pids").exists():
        raise SystemExit(f"{directory}/pids exists: a cluster may be running there (stop it first)")
    port, ui_port = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    try:
        launch(directory, "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                     "--port", str(port), "--webui-port", str(ui_port)])
        for i in range(workers):
            work = directory / f"work-{i}"
            work.mkdir(exist_ok=True)
            launch(directory, f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
                                              "--cores", str(cores), "--memory", memory, "--work-dir", str(work),
                                              "--webui-port", str(free_port())])
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while alive_workers(ui_port) < workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"{workers} workers did not register within {STARTUP_TIMEOUT_S:.0f} s "
                                 f"(see {directory}/*.log)")
            time.sleep(0.5)
    except BaseException:
        stop(directory)
        raise
    info: dict[str, object] = {"master": master, "ui": f"http://127.0.0.1:{ui_port}", "workers": workers}
    (directory / "cluster.json").write_text(json.dumps(info))
    return info


def stop(directory: Path) -> None:
    """End the process groups `start` recorded in `<dir>/pids` (SIGTERM, then SIGKILL after 10 s)."""
    pids_file = directory / "pids"
    if not pids_file.exists():
        return
    pids = [int(line) for line in pids_file.read_text().split()]
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)
    pids_file.unlink()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)  # the group `launch` created for this daemon: the JVM and anything it started


def _running(pid: int) -> bool:
    try:
        reaped, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (stop from another process): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return reaped == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, required=True, help="pids, logs and the workers' work dirs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker (default: %(default)s)")
    parser.add_argument("--memory", default="1g", help="memory per worker (default: %(default)s)")
    args = parser.parse_args()
    if args.action == "start":
        info = start(args.dir, args.workers, args.cores, args.memory)
        print(info["master"])
    else:
        stop(args.dir)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
