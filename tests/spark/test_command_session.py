"""`CommandSession`: a command's Spark session started in a thread while the driver works, and stopped in one while
it commits. The session's own behaviour is Spark's (tests/spark/test_session.py starts real ones); what is checked
here is the hand-over between the threads: the start runs beside the caller, its failure reaches the caller, a
session that is never asked for is still stopped, and an active (notebook or test) session is used and left alone.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pyspark.sql import SparkSession

import compaction.spark.session as spark_session
from compaction.cli.options import CommandSession


class _Started:
    """What `build_session` returned: records the thread it was built and stopped on."""

    def __init__(self, built_on: str) -> None:
        self.built_on = built_on
        self.stopped_on: str | None = None

    def stop(self) -> None:
        self.stopped_on = threading.current_thread().name


@pytest.fixture
def no_active_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))


def _builder(release: threading.Event | None = None, fail: BaseException | None = None) -> Any:
    def build(master: str | None, driver_options: str = "") -> _Started:
        if release is not None:
            assert release.wait(10), "the caller never went on while the session started"
        if fail is not None:
            raise fail
        return _Started(threading.current_thread().name)
    return build


@pytest.mark.usefixtures("no_active_session")
def test_the_start_runs_beside_the_caller_and_the_stop_too(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(spark_session, "build_session", _builder(release))
    with CommandSession(None, background=True) as session:
        release.set()  # the start waits for this: had it run on this thread, the constructor would not return
        spark = session.get()
        assert spark.built_on == "kcompact-spark-start"
        session.stop(wait=False)
    assert spark.stopped_on == "kcompact-spark-stop"  # leaving the block waited for the stop


@pytest.mark.usefixtures("no_active_session")
def test_a_failed_start_is_raised_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_session, "build_session", _builder(fail=FileNotFoundError("java")))
    with CommandSession(None, background=True) as session, pytest.raises(FileNotFoundError, match="java"):
        session.get()


@pytest.mark.usefixtures("no_active_session")
def test_a_session_never_asked_for_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[_Started] = []

    def build(master: str | None, driver_options: str = "") -> _Started:
        built.append(_Started(threading.current_thread().name))
        return built[-1]

    monkeypatch.setattr(spark_session, "build_session", build)
    with CommandSession(None, background=True):
        pass  # e.g. every partition refused its fencing epoch: no Spark job
    assert [s.stopped_on for s in built] == ["kcompact-spark-stop"]


def test_an_active_session_is_used_and_left_running(spark: SparkSession) -> None:
    with CommandSession(None, background=True) as session:
        assert session.get().sparkContext is spark.sparkContext
        session.stop(wait=False)
    assert not spark.sparkContext._jsc.sc().isStopped()


STOP_PROBE = """
import json, sys, threading, time
from compaction.cli.options import stop_session
from compaction.spark.session import build_session

spark = build_session("local[1]")
spark.range(0, 2, 1, 2).mapInArrow(lambda batches: batches, "id long").collect()  # the JVM connects to the server
sc = spark.sparkContext
server = sc._accumulatorServer
ran_on = []
pyspark_shutdown = type(server).shutdown

def recorded(self):
    ran_on.append(threading.current_thread().name)
    pyspark_shutdown(self)

type(server).shutdown = recorded
began = time.monotonic()
stop_session(spark)
took = time.monotonic() - began
deadline = time.monotonic() + 10
while server.socket.fileno() != -1 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"took": took, "ran_on": ran_on, "closed": server.socket.fileno() == -1,
                  "stopped": sc._jsc is None and spark.getActiveSession() is None}))
"""


def test_a_stop_does_not_wait_for_the_accumulator_server_which_still_ends() -> None:
    """`stop_session` returns once the JVM's context stopped; pyspark's accumulator server, which polls its
    connection once a second, is shut down on a thread of its own and still closes its socket (a fresh process: the
    test session's Spark is shared)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STOP_PROBE], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"stop_session took {result['took']:.2f} s")
    assert result["stopped"]
    assert result["ran_on"] == ["kcompact-accumulators-stop"]
    assert result["closed"], "the accumulator server never closed its socket"


JIT_PROBE = """
import json
from compaction.cli.options import CommandSession

with CommandSession("local[1]", background=True, quick_jit=True) as session:
    spark = session.get()
    args = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    session.stop(wait=False)
print(json.dumps(args))
"""


def test_a_quick_jit_session_starts_its_driver_jvm_with_c1_alone() -> None:
    """What `kcompact compact` asks of its session (`QUICK_JIT`), as the JVM it launched reports its own arguments
    (a fresh process: the test session's JVM runs already)."""
    import json
    import subprocess
    import sys

    from compaction.spark.session import QUICK_JIT

    done = subprocess.run([sys.executable, "-c", JIT_PROBE], capture_output=True, text=True, timeout=300, check=True)
    assert QUICK_JIT in json.loads(done.stdout.strip().splitlines()[-1])
