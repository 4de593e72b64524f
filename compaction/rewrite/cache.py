"""Segments fetched once per run: the scan keeps what it downloaded on local disk, the rewrite takes it.

A run reads a segment twice: the scan ranks its keys, the rewrite (after every winner is known) copies its
batches. Downloading it twice would double a run's GET bytes, so the scan writes the segment into the run's
cache directory (`<temp dir>/kcompact-cache-<run id>/`) and the rewrite chunk that needs it moves the file
into its own directory instead of fetching it again. The driver turns the cache on only when the segments it
would hold plus the chunks being rewritten fit in the disk budget (`cache_fits`); without it, the rewrite
fetches again (the report's `fetch_ratio` then shows it).

On a local store the cache file is a hard link to the object's own file (`ObjectStore.link_to_file`): no byte is
copied and both reads map the page cache. A copy wrote every segment into new pages twice, the cache file's and
the scan's buffer, which on a VM whose memory the host hands back lazily cost more than the scan (BENCHMARKS.md
P10). Where the link is refused (another file system), the object is copied as from S3.

On one machine (Spark local mode, or a task that lands on the executor that scanned) every cached segment is
found. On a cluster a rewrite task may run on another node: it then fetches the segment itself. A file is
written under a temporary name and renamed, so a reader never sees a partial segment; the rewrite deletes
what it used, and the driver deletes the directory when the run's stage ends.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from compaction.storage.base import ObjectStore


def cache_dir(temp_dir: str | None, run_id: str) -> str:
    """The run's cache directory (the same path on every executor)."""
    return str(Path(temp_dir or tempfile.gettempdir()) / f"kcompact-cache-{run_id}")


def cache_fits(cached_bytes: int, largest_chunk: int, concurrent_chunks: int, budget: int | None) -> bool:
    """Whether caching `cached_bytes` still leaves room for `concurrent_chunks` chunks of `largest_chunk`."""
    return budget is None or cached_bytes + concurrent_chunks * largest_chunk <= budget


def read_file(path: Path) -> memoryview:
    """A file's bytes in one numpy buffer, read into in place (`Path.read_bytes` builds a bytes object of the
    size, and a caller that needs a writable or numpy buffer copies it again)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        view = memoryview(np.empty(size, np.uint8).data)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"{path} ended at byte {got} of {size} while it was read")
            got += n
    return view


def map_file(path: Path) -> memoryview:
    """A file's bytes mapped read-only (the page cache's pages; valid after the file is moved or deleted)."""
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size == 0:  # mmap cannot map an empty file
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


class SegmentCache:
    """The `.log` objects of one run, by segment id, in `directory`."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def path(self, segment_id: str) -> Path:
        return self.directory / f"{segment_id}.log"

    def fetch(self, store: ObjectStore, key: str, segment_id: str) -> memoryview:
        """Download `key` into the cache (one GET) and return its bytes. A local store's object is linked into the
        cache instead (`ObjectStore.link_to_file`) and its bytes mapped: no byte copied, no memory of the task's
        filled (the page cache's pages, where a copy wrote every byte into new pages twice: the cache file's and
        the task's buffer)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(segment_id)
        if store.link_to_file(key, path) is not None:
            return map_file(path)
        store.get_to_file(key, path)
        return read_file(path)

    def take(self, segment_id: str, dest: Path) -> int | None:
        """Move the cached segment to `dest`; its size, or None when it is not cached here."""
        path = self.path(segment_id)
        try:
            size = path.stat().st_size
            try:
                os.replace(path, dest)
            except OSError:  # another file system: copy under a temporary name, then rename
                tmp = dest.with_name(f".{uuid.uuid4().hex}")
                shutil.copyfile(path, tmp)
                os.replace(tmp, dest)
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            return None
        return size

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["SegmentCache", "cache_dir", "cache_fits"]
