"""The object-store interface every backend implements, and the picklable spec that reopens a store.

The contract, shared by `LocalStore` and `S3Store` and checked by one test suite against both:

- Keys are `/`-separated relative names (`topic-id/0/00000000000000000000-id.log`): no leading or
  trailing `/`, no empty, `.` or `..` segments, no backslash. A key names one object; there are no
  directories, and `list(prefix)` matches on the plain string prefix, as S3 does.
- Writes are create-only. `put`, `put_many`, `put_file` and `put_pieces` never overwrite: if the key exists they raise
  `ObjectExistsError`, and two concurrent writers of one key cannot both succeed. A reader never sees a
  partly written object. This is what lets a rerun after a crash stay safe, and it is the same
  conditional-PUT guarantee delta-rs relies on for its commits (`probe_conditional_put` checks it).
- Reads of a missing object (`get`, `get_to_file`, `size`) raise `MissingObjectError` naming the
  object's full URI. `exists` answers without raising; `delete` and `delete_many` (a batch: S3's DeleteObjects)
  are idempotent.
- Failures that may pass are retried inside the backend; when retries run out, `TransientStoreError`
  (rerun the job). Access and configuration problems raise `StoreAccessError`.

A store is opened from a `StoreSpec`: a small frozen value (URI plus S3 options) that crosses the Spark
boundary; each executor calls `spec.open()` and gets its own store with its own lazily created client.
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from compaction.counters import Counters
from compaction.errors import ConfigError, KcompactError, ObjectExistsError

if TYPE_CHECKING:
    from os import PathLike

DEFAULT_STORE_URI = "./kcompact-store"
"""Where kcompact keeps its objects when no store is configured: a local directory, created on demand."""

MiB = 1024 * 1024

TEMP_PREFIX = ".kcompact-tmp-"
"""Names of in-flight local files start with this; such names are not valid keys and never listed."""

PROBE_PREFIX = "_kcompact/conditional-put-probe-"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key relative to the store, its size in bytes and its mtime in epoch ms."""

    key: str
    size: int
    mtime_ms: int


@dataclass
class StoreStats(Counters):
    """Requests a store instance has issued and the bytes it moved, for reports.

    `gets` counts GET-class requests (GET and HEAD), `puts` PUT-class ones (each multipart part counts).
    Every attempt is a request, so retried attempts are counted too; bytes count once, on success.
    """

    gets: int = 0
    puts: int = 0
    deletes: int = 0
    lists: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient store failures.

    Attempt `n` (1-based) that fails transiently is followed by a sleep drawn uniformly from
    `[0, min(max_delay_ms, base_delay_ms * 2**(n-1)))`; after `max_attempts` attempts the error surfaces.
    """

    max_attempts: int = 8
    base_delay_ms: int = 100
    max_delay_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_delay_ms < 0 or self.max_delay_ms < self.base_delay_ms:
            raise ConfigError(f"invalid retry policy {self}: need max_attempts >= 1, 0 <= base <= max delay")

    def delay_s(self, attempt: int, jitter: float) -> float:
        """Seconds to sleep after failed attempt `attempt`, given `jitter` drawn uniformly from [0, 1)."""
        ceiling_ms = min(self.max_delay_ms, self.base_delay_ms * 2 ** (attempt - 1))
        return jitter * ceiling_ms / 1000.0


@dataclass(frozen=True)
class StoreSpec:
    """Everything needed to reopen a store in another process: small, frozen and picklable.

    Build it with `StoreSpec.parse`, which normalizes the URI (a relative local path becomes an absolute
    `file://` URI, so executors with another working directory reach the same place).

    `endpoint_url` and `region` apply to S3 only; when unset, boto3 resolves them from the usual AWS
    environment and config files (including `AWS_ENDPOINT_URL`). `part_size` is both the largest object
    `put_file` sends in one PUT and the multipart part size above that.
    """

    uri: str
    endpoint_url: str | None = None
    region: str | None = None
    retry: RetryPolicy = RetryPolicy()
    part_size: int = 64 * MiB

    def __post_init__(self) -> None:
        if self.scheme not in ("file", "s3"):
            raise ConfigError(f"store URI {self.uri!r} is not normalized: build specs with StoreSpec.parse")
        if self.part_size < 5 * MiB:
            raise ConfigError(f"part_size {self.part_size} is below S3's 5 MiB minimum multipart part size")

    @classmethod
    def parse(
        cls,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        part_size: int = 64 * MiB,
    ) -> StoreSpec:
        """Validate and normalize `uri`: a local directory path, `file:///abs/dir` or `s3://bucket/prefix`.

        Raises:
            ConfigError: unknown scheme, missing bucket, or S3 options given for a local store.
        """
        retry = retry if retry is not None else RetryPolicy()
        match = _SCHEME.match(uri)
        scheme = match.group(1).lower() if match else ""
        if scheme in ("", "file"):
            if endpoint_url is not None or region is not None:
                raise ConfigError(f"store {uri!r} is local: endpoint_url and region apply to s3:// only")
            return cls(_local_uri(uri, scheme), retry=retry, part_size=part_size)
        if scheme == "s3":
            bucket, _, prefix = uri[len("s3://") :].partition("/")
            if not bucket or "?" in uri or "#" in uri:
                raise ConfigError(f"invalid S3 store URI {uri!r}: expected s3://bucket[/prefix]")
            prefix = prefix.strip("/")
            normalized = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
            return cls(normalized, endpoint_url=endpoint_url, region=region, retry=retry, part_size=part_size)
        raise ConfigError(
            f"unsupported store URI {uri!r}: expected a local directory, file:///abs/dir or s3://bucket/prefix"
        )

    @property
    def scheme(self) -> str:
        """`file` or `s3`."""
        return self.uri.partition("://")[0]

    def open(self) -> ObjectStore:
        """A new store for this spec. Cheap: S3 clients are created on first use."""
        return _BACKENDS[self.scheme](self)


Backend = Callable[[StoreSpec], "ObjectStore"]
"""Opens a store of one URI scheme from its spec: a backend's class, or a function that imports it first."""

_BACKENDS: dict[str, Backend] = {}


def register_backend(scheme: str, backend: Backend) -> None:
    """Make `StoreSpec.open` open `scheme`'s stores with `backend`. `compaction.storage` registers the local and
    S3 backends when it is imported (which any import of this module does first): the interface names no
    backend, and each backend imports the interface."""
    _BACKENDS[scheme] = backend


def _local_uri(uri: str, scheme: str) -> str:
    raw = uri[len("file://") :] if scheme == "file" else uri
    if scheme == "file":
        if raw.startswith("localhost/"):
            raw = raw[len("localhost") :]
        if not raw.startswith("/"):
            raise ConfigError(f"invalid file URI {uri!r}: expected file:///absolute/path")
    if not raw:
        raise ConfigError("empty store path")
    return "file://" + str(Path(raw).expanduser().resolve())


def open_store(
    uri: str = DEFAULT_STORE_URI, *, endpoint_url: str | None = None, region: str | None = None
) -> ObjectStore:
    """Open the store at `uri`: a local directory path or `file://` URI, or `s3://bucket/prefix`.

    Raises:
        ConfigError: the URI has an unknown scheme or is malformed.
    """
    return StoreSpec.parse(uri, endpoint_url=endpoint_url, region=region).open()


def check_key(key: str) -> str:
    """Return `key` if it is a valid object key (see the module docstring), else raise ValueError."""
    segments = key.split("/")
    if (
        not key
        or "\\" in key
        or "\x00" in key
        or any(s in ("", ".", "..") for s in segments)
        or segments[-1].startswith(TEMP_PREFIX)
    ):
        raise ValueError(f"invalid object key {key!r}: need non-empty '/'-separated names, no '.' or '..'")
    return key


def check_prefix(prefix: str) -> str:
    """Return `prefix` if it can begin a valid key (it may be empty or end in '/'), else raise ValueError."""
    if prefix:
        check_key(prefix + "x")
    return prefix


def check_range(start: int, end: int | None) -> None:
    """Raise ValueError unless `0 <= start` and `end` is None or `start <= end`."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"invalid byte range [{start}, {end}): need 0 <= start <= end")


PUT_THREADS = 8
"""Puts of one `put_many` in flight at once; the pool is the process's, shared by every store and caller (a pool
started per call cost a thread start per object: 6% of a 1,000-partition compaction's samples)."""
DELETE_BATCH = 1000
"""The most keys S3's DeleteObjects takes in one request."""

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def shared_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The process's pool `name` of `threads` threads, started on first use and kept for the process's life: a pool
    started per call starts its threads each time, each waiting for the interpreter lock to start (a compaction of
    1,000 small partitions started 2,000 of them for the rewrite alone). Callers of one pool share its threads."""
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=f"kcompact-{name}")
        return _pools[name]


def put_pool(threads: int = PUT_THREADS) -> ThreadPoolExecutor:
    """The process's pool of `threads` threads for `put_many` (one pool for each size a store asks for)."""
    return shared_pool("put" if threads == PUT_THREADS else f"put-{threads}", threads)


def run_at_once(calls: Sequence[Callable[[], object]], threads: int = PUT_THREADS) -> None:
    """Run every call, on `put_pool(threads)` when there are two or more (in this thread otherwise), and wait for
    all; raises the first failing call's error. Never call it from a `put_pool` thread."""
    if len(calls) < 2:
        for call in calls:
            call()
        return
    for done in [put_pool(threads).submit(call) for call in calls]:
        done.result()


class ObjectStore(ABC):
    """A flat namespace of immutable objects, in the spirit of pyiceberg's FileIO.

    See the module docstring for the contract. Instances are not picklable on purpose: ship `spec`.
    """

    put_threads: int = PUT_THREADS
    """Requests of one `put_many` or `delete_many` in flight at once."""

    def __init__(self, spec: StoreSpec) -> None:
        self._spec = spec
        self.stats = StoreStats()
        self._stats_lock = threading.Lock()

    @property
    def spec(self) -> StoreSpec:
        """The picklable spec that reopens an equivalent store (`spec.open()`)."""
        return self._spec

    @property
    def uri(self) -> str:
        """The normalized store URI, e.g. `file:///data/kcompact-store` or `s3://bucket/prefix`."""
        return self._spec.uri

    def object_uri(self, key: str) -> str:
        """The full URI of the object at `key`, as error messages name it."""
        return f"{self.uri}/{check_key(key)}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def fork(self) -> ObjectStore:
        """A store of the same spec with counters of its own (`stats`), for a thread whose requests are counted
        apart from the others', sharing what this one learns of the store (S3's conditional-PUT probe: run once, by
        the first write of either, in its requests)."""
        return self._spec.open()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(f"{self!r} is not picklable: send store.spec and call spec.open() on the other side")

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create the object `key` holding `data`.

        Raises:
            ObjectExistsError: `key` already exists; nothing was written.
            TransientStoreError: the store kept failing transiently.
        """

    def put_many(self, objects: Mapping[str, bytes], copied_from: Mapping[str, str] | None = None) -> None:
        """`put` every object of `objects`, and every key of `copied_from` as a copy of the object its value names,
        at once (`put_threads`; each put waits on the store: an S3 round trip, a local fsync): for a writer whose
        objects are referenced by nothing before a later commit, so their order does not matter. Some may have
        been created when it raises. Never call it from a `put_pool` thread.

        Raises:
            the first failing put's error (`ObjectExistsError`, `MissingObjectError` for a copy's source,
            `TransientStoreError`, ...).
        """
        run_at_once([partial(self.put, key, data) for key, data in objects.items()]
                    + [partial(self._copy, source, key) for key, source in (copied_from or {}).items()],
                    self.put_threads)

    def put_then(self, objects: Mapping[str, bytes], key: str, data: bytes) -> None:
        """`put_many(objects)`, then `put(key, data)`: `key` is created, only if absent, once every object is durable,
        so whoever reads `key` finds them (a Delta commit file and the data files it adds). A store that can make
        `data` durable together with the objects before it creates `key` does (`LocalStore`).

        Raises:
            ObjectExistsError: `key` exists (the objects were put); for the objects, what `put_many` raises.
        """
        self.put_many(objects)
        self.put(key, data)

    def deferred_sync(self) -> contextlib.AbstractContextManager[None]:
        """Within it, puts may defer making their objects durable until it is left (a local store fsyncs them then,
        together); every object put inside is durable when it returns. A store whose puts are durable when they
        return (S3) does nothing."""
        return contextlib.nullcontext()

    def _copy(self, source: str, key: str) -> None:
        self.put(key, self.get(source))

    @abstractmethod
    def put_file(self, key: str, path: str | PathLike[str]) -> None:
        """Create the object `key` from the local file `path`, with the same create-only rule as `put`."""

    def put_pieces(self, key: str, pieces: Iterable[bytes | memoryview]) -> int:
        """Create the object `key` holding the concatenation of `pieces`, taken as they come: a writer that produces
        an object piece by piece sends each while it makes the next (a local store writes them into the object's
        temporary file, S3 sends them as a multipart upload's parts), and the object exists only once the last
        is in, under the create-only rule of `put`. If iterating `pieces` raises, nothing is created and that error
        propagates. This default joins them and `put`s. Returns the object's size."""
        data = b"".join(pieces)
        self.put(key, data)
        return len(data)

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The bytes `[start, end)` of object `key` (all of it by default).

        Like a slice, a range reaching past the end is cut short, and one starting at or past the end
        is empty.

        Raises:
            MissingObjectError: `key` does not exist.
            ValueError: `start < 0` or `end < start`.
        """

    def view(self, key: str, start: int = 0) -> bytes | memoryview:
        """The bytes of object `key` from `start` to its end, read-only, for a reader that keeps them no longer
        than it needs them: `get`'s bytes here; a local store maps the file instead of copying it.

        Raises:
            MissingObjectError: `key` does not exist.
            ValueError: `start < 0`.
        """
        return self.get(key, start)

    def link_to_file(self, key: str, path: str | PathLike[str]) -> int | None:
        """As `get_to_file`, without copying a byte where the store can: a store of files on this machine links
        `path` to the object's file (objects are never rewritten in place) and returns its size, counted as
        `get_to_file` counts; None where it cannot (here: always; a local store on another file system than
        `path`'s, or refused the link), and then nothing is counted and `path` is untouched."""
        return None

    @abstractmethod
    def get_to_file(self, key: str, path: str | PathLike[str]) -> int:
        """Download object `key` to the local file `path` (replaced atomically); returns the byte count.

        Raises:
            MissingObjectError: `key` does not exist; `path` is left untouched.
        """

    @abstractmethod
    def size(self, key: str) -> int:
        """The size of object `key` in bytes. Raises `MissingObjectError` if it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether object `key` exists."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The objects whose key starts with `prefix`, in ascending key order, fetched lazily."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove object `key`. Idempotent: deleting a missing object succeeds."""

    def delete_many(self, keys: Iterable[str]) -> int:
        """`delete` every key of `keys` (each once, however often it is named), at once: `put_threads` deletes in
        flight, where S3 takes up to `DELETE_BATCH` keys a request (DeleteObjects). Idempotent like `delete`; some
        may be gone when it raises. Returns how many keys it was given, repeats counted once. Never call it from a
        `put_pool` thread.

        Raises:
            the first failing delete's error (`TransientStoreError`, `StoreAccessError`, ...).
        """
        todo = list(dict.fromkeys(keys))
        run_at_once([partial(self.delete, key) for key in todo], self.put_threads)
        return len(todo)

    @abstractmethod
    def delta_uri(self, name: str) -> str:
        """The table URI `deltalake.DeltaTable`/`write_deltalake` take for a Delta table stored at `name`."""

    @abstractmethod
    def delta_storage_options(self) -> dict[str, str]:
        """The `storage_options` delta-rs needs to reach tables in this store (may hold credentials)."""

    def diagnose(self) -> KcompactError | None:
        """Why this store cannot be used, when the cause is one a rerun cannot fix (a missing bucket, refused
        credentials, an endpoint whose host does not resolve), else None.

        Called after a request through another client (delta-rs) failed, to tell a configuration problem from
        a passing one: the other client's error says only that it failed after its retries. A local store
        creates what it lacks, so it has nothing to say.
        """
        return None

    def probe_conditional_put(self) -> None:
        """Check that the store refuses a second create of one key, then delete the probe object.

        Costs three or four requests under `_kcompact/`. delta-rs commits and kcompact's create-only
        writes are only safe on a store that enforces this.

        Raises:
            ConfigError: the second create was not refused.
        """
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            self.put(key, b"first")
            try:
                self.put(key, b"second")
            except ObjectExistsError:
                return
            raise ConfigError(
                f"store {self.uri} does not enforce conditional PUT (If-None-Match: *): a second create of "
                f"{self.object_uri(key)} was not refused. kcompact and delta-rs need a store with "
                "conditional writes (AWS S3, MinIO, Cloudflare R2, ...)"
            )
        finally:
            self.delete(key)

    def _count(
        self,
        *,
        gets: int = 0,
        puts: int = 0,
        deletes: int = 0,
        lists: int = 0,
        bytes_read: int = 0,
        bytes_written: int = 0,
    ) -> None:
        with self._stats_lock:
            s = self.stats
            s.gets += gets
            s.puts += puts
            s.deletes += deletes
            s.lists += lists
            s.bytes_read += bytes_read
            s.bytes_written += bytes_written
