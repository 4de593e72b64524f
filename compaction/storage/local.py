"""A store in a local directory: key `a/b/c` is the file `<root>/a/b/c`.

Create-only writes go to a temporary file in the target's directory, are fsynced, then published with
`os.link`, which fails atomically if the name exists: two concurrent writers of one key cannot both
win, and readers never see a partial file. Inside `deferred_sync` the fsyncs wait until the block is left, and are
then made together (a writer that reports its objects only then, such as a rewrite task before its commit); so are
those of one `put_many`. Made together, `SYNCFS_MIN` files and directories or more are made durable by one
`syncfs(2)` of their file system instead of an fsync each (`make_durable`).
Temporary names start with `TEMP_PREFIX` and are never listed. Empty directories left by `delete` stay; they hold no
object and are not listed.

Unlike S3, a directory cannot hold both an object `a` and an object `a/b`; kcompact's layout never
needs that. The root directory is created on the first write.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import re
import shutil
import stat
import sys
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import IO, TYPE_CHECKING

from compaction.errors import MissingObjectError, ObjectExistsError
from compaction.storage.base import (
    TEMP_PREFIX,
    MiB,
    ObjectInfo,
    ObjectStore,
    StoreSpec,
    check_key,
    check_prefix,
    check_range,
    put_pool,
)

if TYPE_CHECKING:
    from os import PathLike

_COPY_CHUNK = 1 * MiB

SYNCFS_MIN = 16
"""Files and directories made durable together from which one `syncfs(2)` of their file system replaces an fsync of
each (Linux 5.8 or later, where `syncfs` reports a failed writeback as `fsync` does; elsewhere each is fsynced).
A metadata commit of 1,000 partitions puts 1,000 files in 1,000 new directories: 2,000 fsyncs took 0.30-0.45 s here
on 8 threads, one `syncfs` after them 0.01-0.02 s (ext4; docs/operating.md). It also writes back whatever else
is dirty on that file system, which a writer of many objects at once pays once rather than per object."""


def _copy(src: IO[bytes], out: IO[bytes]) -> int:
    """Copy `src` to `out` from their current positions, in the kernel where it can (`os.sendfile`: the bytes
    never pass through this process); bytes copied."""
    total = 0
    try:
        while True:
            sent = os.sendfile(out.fileno(), src.fileno(), None, _COPY_CHUNK * 8)
            if sent == 0:
                return total
            total += sent
    except OSError:  # no sendfile between these two (not Linux, or a file system without it)
        if total:
            raise
        shutil.copyfileobj(src, out, _COPY_CHUNK)
        return out.tell()


class LocalStore(ObjectStore):
    """The `file://` backend. See `compaction.storage.base` for the contract."""

    def __init__(self, spec: StoreSpec) -> None:
        if spec.scheme != "file":
            raise ValueError(f"LocalStore needs a file:// spec, got {spec.uri!r}")
        super().__init__(spec)
        self._root = Path(spec.uri[len("file://") :])
        self._deferred: tuple[set[Path], set[Path]] | None = None  # within `deferred_sync`: files, directories
        self._deferred_lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The absolute directory holding the objects."""
        return self._root

    def put(self, key: str, data: bytes) -> None:
        self._create(key, lambda out: out.write(data))
        self._count(puts=1, bytes_written=len(data))

    def put_many(self, objects: Mapping[str, bytes], copied_from: Mapping[str, str] | None = None) -> None:
        """As `put` for each, but every new directory entry is made durable once per directory, after all are linked
        (a segment's objects share a directory: one directory fsync instead of one per object), and a copy is a
        hard link to its source (an object is never rewritten in place: no bytes move, no data to fsync)."""
        copies = dict(copied_from or {})
        if not copies and len(objects) < 2:
            super().put_many(objects)
            return
        together = len(objects) + len(copies) >= SYNCFS_MIN and _syncfs() is not None
        puts: dict[str, Future[object]] = {
            key: put_pool().submit(self._create, key, _writing(data), sync_parent=False, sync=not together)
            for key, data in objects.items()}
        links: dict[str, Future[object]] = {
            key: put_pool().submit(self._link, source, key) for key, source in copies.items()}
        created = [key for key, put in {**puts, **links}.items() if put.exception() is None]
        parents = {self._path(key).parent for key in created}
        if together:  # one syncfs, whether or not a `deferred_sync` is active (its exit then syncs them again)
            make_durable([self._path(key) for key in created if key in puts], parents)
        else:
            self._sync_dirs(parents)  # durable before anything is reported
        self._count(puts=len(created), bytes_written=sum(len(objects[key]) for key in created if key in objects))
        for put in [*puts.values(), *links.values()]:
            put.result()

    def put_then(self, objects: Mapping[str, bytes], key: str, data: bytes) -> None:
        """As `ObjectStore.put_then`, waiting for the disk twice instead of three or four times: the objects are
        written and linked, `data` is written to a temporary file beside `key`, and all of them and the objects'
        directories are made durable at once; then that file is linked as `key` (create-only) and its directory
        fsynced. (`put_many` then `put` waited for the objects' fsyncs, their directories', the file of `key`'s and
        its directory's in turn: a metadata commit's four waits, each of which takes tens of milliseconds at p99
        while a broker writes to the same disk, BENCHMARKS.md P11b.)"""
        with self._deferred_lock:
            deferred = self._deferred is not None
        if deferred or not objects:
            super().put_then(objects, key, data)
            return
        target = self._path(key)
        puts = {k: put_pool().submit(self._create, k, _writing(d), sync_parent=False, sync=False)
                for k, d in objects.items()}
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(staged, "xb") as out:
                out.write(data)
            created = [k for k, put in puts.items() if put.exception() is None]
            files = [self._path(k) for k in created]
            make_durable([*files, staged], {f.parent for f in files}, together=len(objects) >= SYNCFS_MIN)
            self._count(puts=len(created), bytes_written=sum(len(objects[k]) for k in created))
            for put in puts.values():
                put.result()
            self._link_new(staged, key)
        finally:
            staged.unlink(missing_ok=True)
        _fsync_dir(target.parent)
        self._count(puts=1, bytes_written=len(data))

    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Within it, `put`, `put_many` and `put_file` skip their fsyncs; on leaving it (normally or not), every file
        and directory they wrote is fsynced, many at once (`put_pool`): objects are durable when it returns, for a
        writer that reports them only then (a rewrite task, to the commit after it). A segment's half dozen small
        objects cost six to eight fsyncs one after the other when each put syncs itself, ~7 ms a segment here."""
        with self._deferred_lock:
            if self._deferred is not None:
                raise RuntimeError(f"{self!r}: deferred_sync is already active")
            self._deferred = (set(), set())
        try:
            yield
        finally:
            with self._deferred_lock:
                (files, dirs), self._deferred = self._deferred, None
            make_durable(files, dirs)

    def _defer(self, path: Path, *, directory: bool = False) -> bool:
        """Record the file (or `directory`) `path` for the active `deferred_sync`; False when none is active (sync it
        now)."""
        with self._deferred_lock:
            if self._deferred is None:
                return False
            files, dirs = self._deferred
            (dirs if directory else files).add(path)
            return True

    def _sync_dirs(self, dirs: set[Path]) -> None:
        for parent in dirs:
            if not self._defer(parent, directory=True):
                _fsync_dir(parent)

    def _link_new(self, path: Path, key: str) -> None:
        """`path`'s file as the object `key`, create-only: a hard link, which fails when the name exists."""
        try:
            os.link(path, self._path(key))
        except FileExistsError:
            raise ObjectExistsError(self.object_uri(key)) from None

    def _link(self, source: str, key: str) -> None:
        """`key` as a second name of the file of `source` (create-only, as `_create`); its directory not synced."""
        target, origin = self._path(key), self._path(source)
        if not origin.is_file():
            raise MissingObjectError("object does not exist", obj=self.object_uri(source))
        target.parent.mkdir(parents=True, exist_ok=True)
        self._link_new(origin, key)

    def put_file(self, key: str, path: str | PathLike[str]) -> None:
        with open(path, "rb") as src:
            written = self._create(key, lambda out: _copy(src, out))
        self._count(puts=1, bytes_written=written)

    def put_pieces(self, key: str, pieces: Iterable[bytes | memoryview]) -> int:
        """Each piece written into the object's temporary file as it comes; linked as `key` after the last."""
        written = self._create(key, functools.partial(_write_each, pieces))
        self._count(puts=1, bytes_written=written)
        return written

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        with self._open(key) as src:
            src.seek(start)
            data = src.read() if end is None else src.read(end - start)
        self._count(gets=1, bytes_read=len(data))
        return data

    def view(self, key: str, start: int = 0) -> bytes | memoryview:
        """The file mapped read-only (no copy: the pages come from the page cache as they are read). Objects are
        never rewritten in place, and a file deleted while mapped stays readable until unmapped."""
        check_range(start, None)
        with self._open(key) as src:
            size = os.fstat(src.fileno()).st_size
            if start >= size:  # mmap cannot map an empty file or nothing of one
                data = memoryview(b"")
            else:
                data = memoryview(mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ))[start:]
        self._count(gets=1, bytes_read=len(data))
        return data

    def get_to_file(self, key: str, path: str | PathLike[str]) -> int:
        dest = Path(path)
        tmp = dest.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        with self._open(key) as src:
            try:
                with open(tmp, "xb") as out:
                    size = _copy(src, out)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
        self._count(gets=1, bytes_read=size)
        return size

    def link_to_file(self, key: str, path: str | PathLike[str]) -> int | None:
        st = self._stat(key)
        if st is None:
            raise MissingObjectError("object does not exist", obj=self.object_uri(key))
        size = st.st_size
        dest = Path(path)
        tmp = dest.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            os.link(self._path(key), tmp)
        except FileNotFoundError:
            raise MissingObjectError("object does not exist", obj=self.object_uri(key)) from None
        except OSError:  # another file system, or links refused (fs.protected_hardlinks): the caller copies
            return None
        try:
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        self._count(gets=1, bytes_read=size)
        return size

    def size(self, key: str) -> int:
        self._count(gets=1)
        st = self._stat(key)
        if st is None:
            raise MissingObjectError("object does not exist", obj=self.object_uri(key))
        return st.st_size

    def exists(self, key: str) -> bool:
        self._count(gets=1)
        return self._stat(key) is not None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        self._count(lists=1)
        for key in sorted(self._walk(prefix)):
            st = self._stat(key)
            if st is not None:  # else deleted since the walk
                yield ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)

    def delete(self, key: str) -> None:
        self._count(deletes=1)
        with contextlib.suppress(IsADirectoryError):  # a directory is not an object: nothing to delete
            self._path(key).unlink(missing_ok=True)

    def delta_uri(self, name: str) -> str:
        return str(self._path(name))

    def delta_storage_options(self) -> dict[str, str]:
        return {}

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))

    def _stat(self, key: str) -> os.stat_result | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st if stat.S_ISREG(st.st_mode) else None

    def _open(self, key: str) -> IO[bytes]:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise MissingObjectError("object does not exist", obj=self.object_uri(key)) from None

    def _create(self, key: str, write: Callable[[IO[bytes]], object], sync_parent: bool = True,
                sync: bool = True) -> int:
        """Write a temp file with `write`, then link it to `key` unless `key` exists; returns its size.
        `sync_parent`: fsync the directory now (else the caller does, before it reports the object written).
        `sync`: fsync the file (else the caller does, or the active `deferred_sync`)."""
        target = self._path(key)
        if target.exists():
            raise ObjectExistsError(self.object_uri(key))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            deferred = self._defer(target)
            with open(tmp, "xb") as out:
                write(out)
                out.flush()
                if sync and not deferred:
                    os.fsync(out.fileno())
                size = out.tell()
            self._link_new(tmp, key)
        finally:
            tmp.unlink(missing_ok=True)
        if sync_parent:
            self._sync_dirs({target.parent})
        return size

    def _walk(self, prefix: str) -> Iterator[str]:
        base_key = prefix.rpartition("/")[0]
        base = self._root.joinpath(*base_key.split("/")) if base_key else self._root
        for dirpath, dirnames, filenames in os.walk(base):
            rel = Path(dirpath).relative_to(self._root).as_posix()
            dir_key = "" if rel == "." else rel + "/"
            dirnames[:] = [d for d in dirnames if _may_match(dir_key + d + "/", prefix)]
            for name in filenames:
                key = dir_key + name
                if key.startswith(prefix) and not name.startswith(TEMP_PREFIX):
                    yield key


def _writing(data: bytes) -> Callable[[IO[bytes]], object]:
    return lambda out: out.write(data)


def _write_each(pieces: Iterable[bytes | memoryview], out: IO[bytes]) -> None:
    for piece in pieces:
        out.write(piece)


def _may_match(dir_key: str, prefix: str) -> bool:
    return dir_key.startswith(prefix) or prefix.startswith(dir_key)


def make_durable(files: Collection[Path], dirs: Collection[Path], *, together: bool | None = None) -> None:
    """Make `files` (their data and inodes) and the entries of `dirs` durable: one `syncfs` of each file system they
    are on when `together` (by default: when they are `SYNCFS_MIN` or more) and the kernel has it, else an fsync of
    each, all at once (`put_pool`'s threads). A file deleted since needs nothing.

    Raises:
        OSError: the kernel reported a failed write-back.
    """
    if together is None:
        together = len(files) + len(dirs) >= SYNCFS_MIN
    syncfs = _syncfs() if together else None
    if syncfs is not None:
        devices: dict[int, Path] = {}
        for d in {*dirs, *(f.parent for f in files)}:
            with contextlib.suppress(FileNotFoundError):
                devices.setdefault(os.stat(d).st_dev, d)
        for d in devices.values():
            syncfs(d)
        return
    for done in [*(put_pool().submit(_fsync, p) for p in files), *(put_pool().submit(_fsync_dir, p) for p in dirs)]:
        done.result()


@functools.cache
def _syncfs() -> Callable[[Path], None] | None:
    """`syncfs(2)` of the file system holding a directory, where it reports write-back errors (Linux 5.8 or later);
    None elsewhere."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release) if sys.platform == "linux" else None
    if release is None or (int(release[1]), int(release[2])) < (5, 8):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None

    def syncfs(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            if call(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs: {os.strerror(err)}", str(directory))
        finally:
            os.close(fd)

    return syncfs


def _fsync(path: Path) -> None:
    """fsync a file written earlier (its data and inode); nothing when it was deleted since."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make a new directory entry durable, so a crash cannot lose an object already reported written."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
