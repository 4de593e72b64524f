"""Faults that reach Spark executors: a store spec whose stores fail an upload, shipped like any `StoreSpec`.

A monkeypatch in the driver does not reach Python workers, so the fault travels with the data: the run's
`StoreSpec` is swapped for a `FailingUploadSpec` (`dataclasses.replace(run, store=failing_uploads(...))`).
Every store opened from it, on the driver or in a task, counts its own create-only writes of keys containing
`match` and fails the `fail_at`-th one. The driver never uploads during a run, so only executors trip it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from os import PathLike

from pyspark import cloudpickle

from compaction.errors import TransientStoreError
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.storage.local import LocalStore

# Pickled by value: Python workers need not be able to import `tests` (they may run from another directory).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class SimulatedCrash(RuntimeError):
    """Stands for the process dying: no kcompact error, nothing catches it."""


@dataclass(frozen=True)
class FailingUploadSpec(StoreSpec):
    """A local store spec whose stores fail their `fail_at`-th upload (1-based) of a key containing `match`.

    `transient`: raise `TransientStoreError` (the store's retries ran out) instead of `SimulatedCrash`.
    """

    fail_at: int = 1
    match: str = ""
    transient: bool = False

    def open(self) -> ObjectStore:
        return FailingUploadStore(self)


class FailingUploadStore(LocalStore):
    def __init__(self, spec: FailingUploadSpec) -> None:
        super().__init__(spec)
        self._fault = spec
        self._uploads = 0
        self._inside = threading.local()

    def _count_upload(self, key: str) -> None:
        if self._fault.match not in key:
            return
        self._uploads += 1
        if self._uploads == self._fault.fail_at:
            message = f"simulated fault on upload {self._uploads} ({self.object_uri(key)})"
            raise TransientStoreError(message) if self._fault.transient else SimulatedCrash(message)

    def put(self, key: str, data: bytes) -> None:
        if not getattr(self._inside, "put_many", False):
            self._count_upload(key)
        super().put(key, data)

    def put_many(self, objects: Mapping[str, bytes], copied_from: Mapping[str, str] | None = None) -> None:
        """Each key counts as an upload, in order (objects, then copies); at the failing one, the ones before it are
        written (as a process dying mid-call leaves the puts it had finished) and the call fails."""
        copies = dict(copied_from or {})
        keys = [*objects, *copies]
        for i, key in enumerate(keys):
            try:
                self._count_upload(key)
            except BaseException:
                self._put_many_uncounted({k: objects[k] for k in keys[:i] if k in objects},
                                         {k: copies[k] for k in keys[:i] if k in copies})
                raise
        self._put_many_uncounted(objects, copies)

    def _put_many_uncounted(self, objects: Mapping[str, bytes], copied_from: Mapping[str, str]) -> None:
        self._inside.put_many = True  # a one-object call goes through `put`: counted in put_many already
        try:
            super().put_many(objects, copied_from)
        finally:
            self._inside.put_many = False

    def put_then(self, objects: Mapping[str, bytes], key: str, data: bytes) -> None:
        ObjectStore.put_then(self, objects, key, data)  # through put_many and put: every key counts

    def put_file(self, key: str, path: str | PathLike[str]) -> None:
        self._count_upload(key)
        super().put_file(key, path)

    def put_pieces(self, key: str, pieces: Iterable[bytes | memoryview]) -> int:
        """Counted as an upload; the failing one fails after its first piece is written (a write cut off midway)."""
        def counted() -> Iterator[bytes | memoryview]:
            taken = 0
            for piece in pieces:
                if taken == 1:
                    self._count_upload(key)
                taken += 1
                yield piece
            if taken < 2:
                self._count_upload(key)
        return super().put_pieces(key, counted())


def failing_uploads(
    spec: StoreSpec, *, fail_at: int = 1, match: str = "", transient: bool = False
) -> FailingUploadSpec:
    """`spec` (a local store) with an upload fault."""
    return FailingUploadSpec(spec.uri, spec.endpoint_url, spec.region, spec.retry, spec.part_size,
                             fail_at=fail_at, match=match, transient=transient)
