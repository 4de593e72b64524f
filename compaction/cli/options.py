"""What several commands share: the store and partition options, the clock, the output, usage errors.

The CLI is the edge: it reads the wall clock (once per command, in `now_ms`) and the environment; everything
it calls takes `now_ms` and an open store.
"""

from __future__ import annotations

import argparse
import json
import os
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
    from pyspark.sql import SparkSession as Session

    from compaction.spark.session import build_session

    started_here = Session.getActiveSession() is None
    began = time.monotonic()
    spark = build_session(master)
    if progress is not None and started_here:
        sc = spark.sparkContext
        progress.phase(f"spark: session started in {time.monotonic() - began:.1f} s "
                       f"({sc.master}, {sc.defaultParallelism} task slots)")
    try:
        yield spark
    finally:
        if started_here:
            spark.stop()
