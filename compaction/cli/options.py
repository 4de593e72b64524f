"""What several commands share: the store and partition options, the clock, the output, usage errors.

The CLI is the edge: it reads the wall clock (once per command, in `now_ms`) and the environment; everything
it calls takes `now_ms` and an open store.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compaction.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from compaction.progress import Progress
    from compaction.storage import ObjectStore

Subcommands = argparse._SubParsersAction
STORE_HELP = "object store: a local directory (default ./kcompact-store) or s3://bucket/prefix"


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum`. Anything else is a usage error naming the option and
    the value (exit 2), before any store is opened: a negative offset, version or partition means nothing to Kafka."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


NON_NEGATIVE = at_least(0)
POSITIVE = at_least(1)


def add_command(sub: Subcommands, name: str, run: Callable[[argparse.Namespace], int], summary: str,
                description: str) -> argparse.ArgumentParser:
    """A sub-command whose parsed arguments go to `run`. argparse refills the description's whitespace."""
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(func=run)
    return p


def add_store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default="./kcompact-store", help=STORE_HELP + " (default: %(default)s)")
    p.add_argument("--endpoint-url", default=None,
                   help="S3 endpoint (default: AWS_ENDPOINT_URL or the AWS default)")


def add_partition_options(p: argparse.ArgumentParser) -> None:
    add_store_options(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", required=True, type=NON_NEGATIVE)


def add_topic_scope(p: argparse.ArgumentParser) -> None:
    """`--topic` (repeatable) and `--partition` (with --topic): the partitions a run covers (`topic_scope`)."""
    p.add_argument("--topic", action="append", default=None, help="only this topic (repeatable)")
    p.add_argument("--partition", type=NON_NEGATIVE, default=None, help="only this partition (with --topic)")


def topic_scope(args: argparse.Namespace) -> dict[str, Any]:
    """`topics=` and `partition=` for the run functions, from `add_topic_scope`'s options."""
    if args.partition is not None and not args.topic:
        raise usage("--partition needs --topic")
    return {"topics": args.topic, "partition": args.partition}


def add_now_option(p: argparse.ArgumentParser, what: str = "clock") -> None:
    p.add_argument("--now", type=NON_NEGATIVE, default=None, help=f"{what} in epoch ms (default: the wall clock)")


def add_json_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=what)


def open_store(args: argparse.Namespace) -> ObjectStore:
    from compaction.storage import open_store as open_uri

    return open_uri(args.store, endpoint_url=args.endpoint_url)


def now_ms(args: argparse.Namespace) -> int:
    """`--now`, or the wall clock read here: the only clock a command uses."""
    return args.now if args.now is not None else int(time.time() * 1000)


def print_result(as_json: bool, doc: Any, text: Iterable[str]) -> None:
    """A command's result on stdout: `doc` as indented JSON with --json, else the lines of `text`."""
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for line in text:
        print(line)


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def option_name(dest: str) -> str:
    """The flag of an argparse destination: `key_order` -> `--key-order`."""
    return "--" + dest.replace("_", "-")


def usage(message: str) -> ConfigError:
    """A usage error: exit code 2, the message printed as `kcompact COMMAND: ConfigError: message`."""
    return ConfigError(message)


@contextmanager
def spark_session(master: str | None, progress: Progress | None = None) -> Iterator[SparkSession]:
    """The Spark session of a command: built here (and stopped after) unless a notebook's or test's is active.
    With `progress`, a session started here says how long its start took, so that time is not read as the first
    partitions' work."""
    with CommandSession(master, progress) as session:
        yield session.get()


def stop_session(spark: SparkSession) -> None:
    """`spark.stop()`, returning once its JVM has stopped, without waiting on pyspark's accumulator server.

    pyspark's `SparkContext.stop` stops the JVM's context (~0.1 s), then shuts down the driver's accumulator server
    and waits for it: that server's handler of the JVM's connection polls its socket once a second and its loop
    every half second, so the wait was 0.9 s of every fresh command's stop (docs/operating.md, "Bytecode": the
    measured difference).
    Here that shutdown runs in a daemon thread of its own: the server still ends and closes its socket, a moment
    later, and a command that exits first loses nothing (every accumulator update arrived with its job's end)."""
    server = getattr(getattr(spark, "sparkContext", None), "_accumulatorServer", None)
    blocking = getattr(server, "shutdown", None)
    if server is not None and callable(blocking):
        def shutdown() -> None:
            threading.Thread(target=blocking, name="kcompact-accumulators-stop", daemon=True).start()

        server.shutdown = shutdown
    spark.stop()


class CommandSession:
    """The Spark session of a command, built here and stopped when the command is done with it, unless a notebook's
    or test's session is active (then that one is used and left running).

    `background=True` starts it in a thread: the JVM's start (3 s or more on a small machine) then overlaps what the
    driver does before its first Spark job (a compaction's retention and fencing-epoch commits, which at 1,000
    partitions take about a second), and `get` waits for it. `stop(wait=False)` stops it in a thread too, so the
    run's commit overlaps the JVM's shutdown; leaving the `with` block waits for that stop. A session started in a
    thread has no SIGINT handler of Spark's (pyspark installs one only from the main thread): Ctrl-C still ends
    the command, without asking the JVM to cancel its jobs first. `quick_jit=True`: a driver JVM started here
    compiles with C1 alone (`compaction.spark.session.QUICK_JIT`, what `kcompact compact` asks)."""

    def __init__(self, master: str | None, progress: Progress | None = None, *, background: bool = False,
                 quick_jit: bool = False) -> None:
        from pyspark.sql import SparkSession as Session

        self._master, self._progress, self._quick_jit = master, progress, quick_jit
        self.started_here = Session.getActiveSession() is None
        self._spark: SparkSession | None = None
        self._failure: BaseException | None = None
        self._seconds = 0.0
        self._reported = False
        self._stopper: threading.Thread | None = None
        self._starter: threading.Thread | None = None
        if background and self.started_here:
            self._starter = threading.Thread(target=self._start, name="kcompact-spark-start", daemon=True)
            self._starter.start()

    def _start(self) -> None:
        from compaction.spark.session import QUICK_JIT, build_session

        began = time.monotonic()
        try:
            self._spark = build_session(self._master, driver_options=QUICK_JIT if self._quick_jit else "")
        except BaseException as exc:  # handed to the caller of `get`, on its own thread
            self._failure = exc
        self._seconds = time.monotonic() - began

    def get(self) -> SparkSession:
        """The session, waiting for its start when it runs in a thread (its failure is raised here)."""
        if self._starter is not None:
            self._starter.join()
            self._starter = None
        elif self._spark is None:
            self._start()
        if self._failure is not None:
            raise self._failure
        assert self._spark is not None
        if self._progress is not None and self.started_here and not self._reported:
            self._reported = True
            sc = self._spark.sparkContext
            self._progress.phase(f"spark: session started in {self._seconds:.1f} s "
                                 f"({sc.master}, {sc.defaultParallelism} task slots)")
        return self._spark

    def stop(self, *, wait: bool = True) -> None:
        """Stop a session started here (once; nothing for an active one that was not); `wait=False` stops it in a
        thread, which leaving the `with` block joins."""
        if self._starter is not None:  # never used: wait for its start, so that it is stopped below
            self._starter.join()
            self._starter = None
        spark, self._spark = self._spark, None
        if spark is not None and self.started_here and self._stopper is None:
            self._stopper = threading.Thread(target=stop_session, args=(spark,), name="kcompact-spark-stop",
                                             daemon=True)
            self._stopper.start()
        if wait and self._stopper is not None:
            self._stopper.join()

    def __enter__(self) -> CommandSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(wait=True)
