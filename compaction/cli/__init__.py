"""The `kcompact` command line. It parses arguments, reads the clock and the environment, and calls one function.

One module per command family (`generate`, `dump`, `tier`, `wal`, `segments` and `read`, `plan` and `compact`,
`expire`, `gc`, `verify`, `table`), each with a `register` that adds its sub-commands; `options` holds what they share.

Exit codes (see `compaction.errors.ExitCode`): 0 success or nothing to do, 1 internal error, 2 configuration
or usage error, 3 corrupt input, 4 fenced or conflicting commit or transient store failure (a rerun is safe), 5
verification failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from compaction.cli import compact, dump, expire, gc, generate, options, segments, table, tier, verify, wal
from compaction.errors import ExitCode, KcompactError, TransientStoreError, plain_text

__all__ = ["build_parser", "main", "run"]

EPILOG = """exit codes:
  0  success (or nothing to do)
  1  internal error (a bug: please report it with the traceback)
  2  configuration or usage error: fix the config or the command line
  3  corrupt input: the named object is malformed (the partition is quarantined)
  4  fenced or conflicting commit, or a store that kept failing in a way that may pass: nothing of it was
     committed, rerunning is safe (a missing bucket, refused credentials or an endpoint that does not
     resolve is 2)
  5  verification failed (`kcompact verify`): a key was lost or changed; alert, keep the store as it is
"""
COMMAND_FAMILIES = (generate, dump, tier, wal, segments, compact, expire, gc, verify, table)
"""In the order `kcompact --help` lists their commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcompact",
        description="Log compaction for Kafka topics whose segments live in object storage, as a Spark batch job.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in COMMAND_FAMILIES:
        family.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kcompact` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KcompactError as exc:
        exc = _diagnosed(args, exc)
        print(f"kcompact {args.command}: {type(exc).__name__}: {plain_text(exc, limit=2000)}", file=sys.stderr)
        return int(exc.exit_code)
    except BrokenPipeError:
        return ExitCode.OK


def _diagnosed(args: argparse.Namespace, exc: KcompactError) -> KcompactError:
    """A store failure that "may pass" (exit 4), checked against the store: when the bucket is missing, the
    credentials are refused or the endpoint does not resolve, a rerun never passes, so that error (exit 2) is
    the one reported. Reads through delta-rs (the metadata, WAL and topic tables) reach here only as the former.
    """
    if not isinstance(exc, TransientStoreError) or not getattr(args, "store", None):
        return exc
    try:
        found = options.open_store(args).diagnose()
    except KcompactError as e:
        found = e
    return found if found is not None else exc


def run(argv: Sequence[str] | None = None) -> None:
    """The console script: `main`, then leave without running interpreter teardown.

    A native library's fault at interpreter exit would turn a finished run into exit 134 for an orchestrator.
    The one found (an Arrow thread releasing delta-rs's Python filesystem after finalization began,
    docs/upstream.md) is avoided where kcompact reads tables (`compaction.metadata.table.read_rows`); this exit
    keeps any other from deciding a run's outcome. Everything is flushed first; Spark was stopped by the command
    that started it.
    """
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
