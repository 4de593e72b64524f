"""The metadata table's checkpoints, written by a child process at a lower CPU priority.

The broker's metadata process (`compaction.remote_log_metadata`) follows the table, and writes the checkpoint due
every `delta.checkpointInterval` commits itself (`follower.TableFollower`), off its calls' path. On a background
thread of that process, delta-rs's checkpoint (the table opened at the version: its last checkpoint and the commits
after it, then an action for every live file written out) still ran on the cores the broker's copier threads and
the process's own commits wait for, at their priority: at 1,000 tiered partitions on 2 cores (BENCHMARKS.md, P11b),
with the checkpoints the broker copied ~10% fewer segments, and a COPY_SEGMENT_FINISHED update took 77-86 ms at p50
against 58-61 ms without them. Here the checkpoint runs in a child Python process (`serve`), which lowers its own
priority (`NICENESS`) before it imports delta-rs, so its threads use the cores the broker and the commit path leave
idle. A checkpoint only makes a fresh reader's open shorter: one that waits longer is written later, never wrong.

One child per process (`checkpointer`), started on the first checkpoint and again after it died, one request at a
time: a JSON line `{"uri", "version", "options"}` on its stdin, a JSON line back, `{"ok": true}` or `{"ok": false,
"error": "<one line>"}`. It ignores SIGTERM and SIGINT as its parent does (a broker's stop may signal its process
group), and ends when its stdin closes: its parent ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

NICENESS = 10
"""What the child adds to its niceness (Linux: 0 to 19, higher yields more): at 10 a busy thread of the broker gets
about ten times its share of a core when both want it."""

_START = ("import os, sys; os.nice(int(sys.argv[1])); "
          "from compaction.metadata.checkpointer import serve; serve()")


class CheckpointError(Exception):
    """A checkpoint was not written (delta-rs refused, or the child died): the next due version's will be."""


class Checkpointer:
    """Writes checkpoints through one child process, one at a time (thread-safe)."""

    def __init__(self, niceness: int = NICENESS) -> None:
        self.niceness = niceness
        self._child: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def write(self, uri: str, version: int, options: Mapping[str, str] | None) -> None:
        """Write the checkpoint of `version` of the Delta table at `uri` (delta-rs's `storage_options`).

        Raises:
            CheckpointError: it was not written.
        """
        request = json.dumps({"uri": uri, "version": int(version), "options": dict(options or {})})
        with self._lock:
            child = self._started()
            assert child.stdin is not None and child.stdout is not None
            error: OSError | None = None
            try:
                child.stdin.write(request + "\n")
                child.stdin.flush()
                line = child.stdout.readline()
            except OSError as e:
                line, error = "", e
            if not line:
                self._stop()
                raise CheckpointError(f"the checkpoint process ended (exit status {child.poll()}"
                                      f"{f', {error}' if error else ''})")
        answer = json.loads(line)
        if not answer["ok"]:
            raise CheckpointError(answer["error"])

    def close(self) -> None:
        """End the child (it ends by itself when this process does)."""
        with self._lock:
            self._stop()

    def _started(self) -> subprocess.Popen[str]:
        if self._child is None or self._child.poll() is not None:
            package_root = str(Path(__file__).resolve().parents[2])
            path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
            self._child = subprocess.Popen(
                [sys.executable, "-c", _START, str(self.niceness)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, bufsize=1, env={**os.environ, "PYTHONPATH": path})
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


_shared: Checkpointer | None = None
_shared_lock = threading.Lock()


def checkpointer() -> Checkpointer:
    """The process's checkpointer, shared by its followers."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Checkpointer()
        return _shared


def serve() -> None:
    """The child: write the checkpoint of each request read on stdin, until stdin closes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from deltalake import DeltaTable  # after os.nice: delta-rs's threads inherit the priority

    from compaction.errors import plain_text

    for line in sys.stdin:
        request = json.loads(line)
        try:
            DeltaTable(request["uri"], version=request["version"],
                       storage_options=request["options"] or None).create_checkpoint()
            answer: dict[str, object] = {"ok": True}
        except Exception as e:  # every failure is the parent's to report
            answer = {"ok": False, "error": next(iter(plain_text(e).splitlines()), type(e).__name__)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


__all__ = ["NICENESS", "CheckpointError", "Checkpointer", "checkpointer", "serve"]
