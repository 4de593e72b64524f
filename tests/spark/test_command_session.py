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
    def build(master: str | None) -> _Started:
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

    def build(master: str | None) -> _Started:
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
