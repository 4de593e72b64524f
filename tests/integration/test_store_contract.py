"""The object-store contract, run against every backend; then what only S3 can get wrong.

The `store` fixture yields a local store and an S3 store on a moto server (127.0.0.1), so each
contract test runs twice. S3-only tests break the store on purpose: a server that ignores
If-None-Match, throttling, lost responses, refused access.
"""

from __future__ import annotations

import errno
import os
import pickle
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError
from deltalake import DeltaTable, write_deltalake

from compaction.errors import (
    ConfigError,
    MissingObjectError,
    ObjectExistsError,
    StoreAccessError,
    TransientStoreError,
)
from compaction.rewrite.cache import SegmentCache
from compaction.storage import DEFAULT_STORE_URI, ObjectInfo, ObjectStore, StoreSpec, StoreStats, open_store
from compaction.storage import local as local_module
from compaction.storage import s3 as s3_module
from compaction.storage.base import TEMP_PREFIX, MiB
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key
from compaction.storage.local import LocalStore
from compaction.storage.s3 import S3Store
from tests.moto_s3 import BUCKET, FAST_RETRY, REGION, TEST_PART_SIZE, make_bucket

SEGMENT_KEY = segment_object_key(
    "orders.v2-eu", "MWJ6FHTfRYy67jzwZdeqSQ", 3, 1234, new_segment_id(), Suffix.LOG
)
PAYLOAD = bytes(range(256)) * 40


# --- the contract, every backend ------------------------------------------------------------------


def test_put_then_get_round_trips(store: ObjectStore) -> None:
    store.put(SEGMENT_KEY, PAYLOAD)
    store.put("empty", b"")
    assert store.get(SEGMENT_KEY) == PAYLOAD
    assert store.get("empty") == b""
    assert store.size(SEGMENT_KEY) == len(PAYLOAD)
    assert store.exists(SEGMENT_KEY) and store.exists("empty")


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, 1),
        (1, 17),
        (100, None),
        (0, len(PAYLOAD)),
        (5000, len(PAYLOAD) + 1000),
        (7, 7),
        (len(PAYLOAD), None),
    ],
)
def test_ranged_get_behaves_like_a_slice(store: ObjectStore, start: int, end: int | None) -> None:
    store.put("seg.log", PAYLOAD)
    assert store.get("seg.log", start, end) == PAYLOAD[start:end]


@pytest.mark.parametrize("start", [0, 1, 4000, len(PAYLOAD) - 1, len(PAYLOAD), len(PAYLOAD) + 7])
def test_a_view_holds_the_bytes_get_returns(store: ObjectStore, start: int) -> None:
    store.put("seg.log", PAYLOAD)
    store.put("empty", b"")
    store.stats = StoreStats()
    assert bytes(store.view("seg.log", start)) == PAYLOAD[start:]
    assert bytes(store.view("empty")) == b""
    assert store.stats.gets == 2 and store.stats.bytes_read == len(PAYLOAD[start:])
    with pytest.raises(ValueError, match="invalid byte range"):
        store.view("seg.log", -1)


def test_a_view_outlives_the_deletion_of_its_object(store: ObjectStore) -> None:
    """gc deletes replaced objects while a reader may still hold them (a local store's view maps the file)."""
    store.put("seg.log", PAYLOAD)
    held = store.view("seg.log", 5)
    store.delete("seg.log")
    assert not store.exists("seg.log")
    assert bytes(held) == PAYLOAD[5:]


def test_ranged_get_past_the_end_is_empty(store: ObjectStore) -> None:
    store.put("seg.log", PAYLOAD)
    store.put("empty", b"")
    assert store.get("seg.log", len(PAYLOAD) + 10, len(PAYLOAD) + 20) == b""
    assert store.get("empty", 0, 10) == b""


@pytest.mark.parametrize(("start", "end"), [(-1, None), (5, 4)])
def test_invalid_ranges_are_refused(store: ObjectStore, start: int, end: int | None) -> None:
    store.put("seg.log", PAYLOAD)
    with pytest.raises(ValueError, match="invalid byte range"):
        store.get("seg.log", start, end)


def test_put_never_overwrites(store: ObjectStore) -> None:
    store.put(SEGMENT_KEY, b"first")
    with pytest.raises(ObjectExistsError) as refused:
        store.put(SEGMENT_KEY, b"second")
    assert refused.value.uri == store.object_uri(SEGMENT_KEY)
    assert store.object_uri(SEGMENT_KEY) in str(refused.value)
    assert store.get(SEGMENT_KEY) == b"first"


def test_put_many_creates_every_object_and_never_overwrites(store: ObjectStore) -> None:
    objects = {f"t/0/{i:020d}-seg.{suffix}": bytes([i]) * (i + 1) for i, suffix in enumerate(("log", "index", "bloom"))}
    store.put_many(objects)
    assert {k: store.get(k) for k in objects} == objects
    before = store.stats.puts
    with pytest.raises(ObjectExistsError) as refused:
        store.put_many({"t/0/new.log": b"new", next(iter(objects)): b"second"})
    assert refused.value.uri == store.object_uri(next(iter(objects)))
    assert store.get(next(iter(objects))) == bytes([0])
    assert store.get("t/0/new.log") == b"new"  # the others of the call were created, and counted
    assert store.stats.puts >= before + 1  # (S3 also counts its refused conditional PUT: a request was made)


def test_put_then_creates_the_objects_then_the_key_only_if_absent(store: ObjectStore) -> None:
    """A commit's shape: data files, then a commit file that must not overwrite another writer's."""
    objects = {f"t/{i}/part-{i}.parquet": bytes([i]) * 10 for i in range(3)}
    store.put_then(objects, "_log/00000000000000000001.json", b"commit 1")
    assert {k: store.get(k) for k in objects} == objects and store.get("_log/00000000000000000001.json") == b"commit 1"
    more = {"t/9/part-9.parquet": b"nine"}
    with pytest.raises(ObjectExistsError) as refused:
        store.put_then(more, "_log/00000000000000000001.json", b"commit 2")
    assert refused.value.uri == store.object_uri("_log/00000000000000000001.json")
    assert store.get("_log/00000000000000000001.json") == b"commit 1"
    assert store.get("t/9/part-9.parquet") == b"nine"  # the objects were put (the caller deletes what it orphans)
    store.put_then({}, "_log/00000000000000000002.json", b"commit 2")  # no objects: a put
    assert store.get("_log/00000000000000000002.json") == b"commit 2"
    assert not [o.key for o in store.list("") if TEMP_PREFIX in o.key]


def test_put_many_copies_objects(store: ObjectStore) -> None:
    store.put("t/0/a.snapshot", b"state")
    store.put_many({"t/0/b.log": b"log"}, {"t/0/b.snapshot": "t/0/a.snapshot"})
    store.delete("t/0/a.snapshot")  # the copy is an object of its own
    assert (store.get("t/0/b.snapshot"), store.get("t/0/b.log")) == (b"state", b"log")
    with pytest.raises(ObjectExistsError):
        store.put_many({}, {"t/0/b.log": "t/0/b.snapshot"})
    with pytest.raises(MissingObjectError):
        store.put_many({}, {"t/0/c.snapshot": "t/0/a.snapshot"})
    assert store.get("t/0/b.log") == b"log" and not store.exists("t/0/c.snapshot")


def test_put_file_never_overwrites(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "segment.log"
    source.write_bytes(b"second")
    store.put("k", b"first")
    with pytest.raises(ObjectExistsError):
        store.put_file("k", source)
    assert store.get("k") == b"first"


def test_concurrent_creates_of_one_key_have_one_winner(store: ObjectStore) -> None:
    store.probe_conditional_put()  # S3 probes before its first write; keep that out of the race
    writers = 8
    barrier = threading.Barrier(writers)
    outcomes: dict[int, str] = {}

    def write(n: int) -> None:
        barrier.wait()
        try:
            store.put("contended", f"writer {n}".encode())
            outcomes[n] = "won"
        except ObjectExistsError:
            outcomes[n] = "refused"

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [n for n, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == writers and len(winners) == 1
    assert store.get("contended") == f"writer {winners[0]}".encode()


@pytest.mark.parametrize(
    "read",
    [
        lambda s, k, p: s.get(k),
        lambda s, k, p: s.get(k, 3, 9),
        lambda s, k, p: s.get(k, 4, 4),
        lambda s, k, p: s.size(k),
        lambda s, k, p: s.get_to_file(k, p),
        lambda s, k, p: s.view(k),
    ],
    ids=["get", "ranged-get", "empty-range", "size", "get_to_file", "view"],
)
def test_missing_object_raises_naming_its_uri(
    store: ObjectStore, tmp_path: Path, read: Callable[[ObjectStore, str, Path], object]
) -> None:
    store.put("other", b"x")  # the store exists; only the object is missing
    dest = tmp_path / "dest"
    with pytest.raises(MissingObjectError) as missing:
        read(store, SEGMENT_KEY, dest)
    assert missing.value.obj == store.object_uri(SEGMENT_KEY)
    assert str(missing.value).startswith(f"{store.uri}/{SEGMENT_KEY}: ")
    assert not dest.exists()
    assert not store.exists(SEGMENT_KEY)


def test_a_key_that_is_only_a_prefix_of_others_is_not_an_object(store: ObjectStore) -> None:
    store.put("topic/0/seg.log", b"x")
    assert not store.exists("topic/0")
    with pytest.raises(MissingObjectError):
        store.get("topic")
    store.delete("topic/0")
    assert store.exists("topic/0/seg.log")


def test_list_by_prefix_in_key_order_with_sizes(store: ObjectStore) -> None:
    objects = {"a/b/c": 3, "a/bc": 2, "a/b-": 1, "a/b/d/e": 4, "ab": 5, "b/x": 6}
    for key, size in objects.items():
        store.put(key, b"z" * size)

    def listed(prefix: str) -> list[tuple[str, int]]:
        infos = list(store.list(prefix))
        assert all(isinstance(info, ObjectInfo) and info.mtime_ms > 1_600_000_000_000 for info in infos)
        return [(info.key, info.size) for info in infos]

    assert listed("") == sorted(objects.items())
    assert listed("a/") == [("a/b-", 1), ("a/b/c", 3), ("a/b/d/e", 4), ("a/bc", 2)]
    assert listed("a/b") == [("a/b-", 1), ("a/b/c", 3), ("a/b/d/e", 4), ("a/bc", 2)]
    assert listed("a/b/") == [("a/b/c", 3), ("a/b/d/e", 4)]
    assert listed("a") == [("a/b-", 1), ("a/b/c", 3), ("a/b/d/e", 4), ("a/bc", 2), ("ab", 5)]
    assert listed("a/b/c") == [("a/b/c", 3)]
    assert listed("nothing/") == []


def test_list_of_a_store_never_written_is_empty(store: ObjectStore) -> None:
    assert list(store.list()) == []


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("k", b"v")
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")
    store.delete("never/written")
    store.put("k", b"again")  # a deleted key can be created anew
    assert store.get("k") == b"again"


def test_delete_many_deletes_each_key_once_and_nothing_else(store: ObjectStore, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 10)  # S3's is 1,000: three batches of 27 keys cost less to set up
    keys = [f"seg/{i:05d}.log" for i in range(2 * 10 + 7)]
    store.put_many({k: b"x" for k in keys})
    store.put("seg/kept", b"y")
    store.stats = StoreStats()
    assert store.delete_many([*keys, keys[0], "never/written"]) == len(keys) + 1
    assert [o.key for o in store.list("seg/")] == ["seg/kept"]
    assert store.delete_many(keys) == len(keys)  # idempotent
    assert store.delete_many([]) == 0 and store.delete_many(iter(["seg/kept"])) == 1
    assert not any(o.key.startswith("seg/") for o in store.list())
    # a request per key on a local directory; on S3 a DeleteObjects per batch of keys, a DeleteObject for one key
    n = len(keys)
    assert store.stats.deletes == ((n + 1) + n + 1 if isinstance(store, LocalStore) else 3 + 3 + 1)


def test_put_file_then_get_to_file_round_trips(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "in.log"
    source.write_bytes(PAYLOAD)
    store.put_file(SEGMENT_KEY, source)
    dest = tmp_path / "out.log"
    dest.write_bytes(b"stale content is replaced")
    assert store.get_to_file(SEGMENT_KEY, dest) == len(PAYLOAD)
    assert dest.read_bytes() == PAYLOAD
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)] == []


@pytest.mark.parametrize("size", [0, 1, 2 * TEST_PART_SIZE + 12345])
def test_the_run_cache_fetches_an_object_whole(store: ObjectStore, tmp_path: Path, size: int) -> None:
    """`SegmentCache.fetch`: one GET, the file in the cache and the bytes returned are the object's."""
    data = os.urandom(size)
    store.put(SEGMENT_KEY, data)
    before = store.stats.gets
    got = SegmentCache(str(tmp_path / "cache")).fetch(store, SEGMENT_KEY, "seg")
    assert bytes(got) == data and (tmp_path / "cache" / "seg.log").read_bytes() == data
    assert store.stats.gets == before + 1
    if isinstance(store, LocalStore):  # linked, not copied: the object's inode, its bytes mapped
        assert (tmp_path / "cache" / "seg.log").stat().st_ino == (store.root / SEGMENT_KEY).stat().st_ino


@pytest.mark.parametrize("size", [0, 1, 2 * TEST_PART_SIZE + 12345])
def test_link_to_file_links_a_local_object_and_copies_nothing_elsewhere(store: ObjectStore, tmp_path: Path,
                                                                       size: int) -> None:
    """A local store links the file (the object's own inode, counted as one GET of its bytes, a stale file
    replaced, no temporary left); S3 cannot: None, nothing counted, the destination untouched."""
    data = os.urandom(size)
    store.put(SEGMENT_KEY, data)
    dest = tmp_path / "linked.log"
    dest.write_bytes(b"stale")
    before = replace(store.stats)
    got = store.link_to_file(SEGMENT_KEY, dest)
    if isinstance(store, LocalStore):
        assert got == size and dest.read_bytes() == data
        assert dest.stat().st_ino == (store.root / SEGMENT_KEY).stat().st_ino
        assert (store.stats.gets, store.stats.bytes_read) == (before.gets + 1, before.bytes_read + size)
        dest.unlink()  # the caller's file goes; the object stays
        assert store.get(SEGMENT_KEY) == data
        with pytest.raises(MissingObjectError) as missing:
            store.link_to_file("absent.log", dest)
        assert store.object_uri("absent.log") in str(missing.value) and not dest.exists()
    else:
        assert got is None and dest.read_bytes() == b"stale" and store.stats == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)] == []


def test_a_local_store_refused_a_link_leaves_the_copy_to_the_caller(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses the link (another file system: EXDEV; `fs.protected_hardlinks`: EPERM),
    `link_to_file` is None and counts nothing; the run's cache then copies, as from S3."""
    store = open_store(f"file://{tmp_path / 'store'}")
    store.put(SEGMENT_KEY, PAYLOAD)

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    before = replace(store.stats)
    assert store.link_to_file(SEGMENT_KEY, tmp_path / "dest") is None and store.stats == before
    assert not (tmp_path / "dest").exists()
    got = SegmentCache(str(tmp_path / "cache")).fetch(store, SEGMENT_KEY, "seg")
    assert bytes(got) == PAYLOAD and (tmp_path / "cache" / "seg.log").stat().st_nlink == 1
    assert store.stats.gets == before.gets + 1


def test_objects_put_under_deferred_sync_are_objects(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "in.log"
    source.write_bytes(PAYLOAD)
    with store.deferred_sync():
        store.put("t/0/a.log", b"a")
        store.put_many({"t/0/b.log": b"b", "t/0/b.index": b"i"}, {"t/0/b.snapshot": "t/0/a.log"})
        store.put_file("t/1/c.log", source)
        assert store.get("t/0/b.index") == b"i"  # readable at once; durable when the block is left
        with pytest.raises(ObjectExistsError):
            store.put("t/0/a.log", b"again")
    assert [o.key for o in store.list("t/")] == ["t/0/a.log", "t/0/b.index", "t/0/b.log", "t/0/b.snapshot",
                                                 "t/1/c.log"]


def test_the_local_store_fsyncs_deferred_objects_on_leaving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `deferred_sync` no put waits on an fsync; leaving it fsyncs every file written and every directory
    that got a new entry, once each."""
    store = open_store(str(tmp_path / "store"))
    store.put("t/0/old.log", b"old")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr("compaction.storage.local.os.fsync", fsync)
    root = tmp_path / "store"
    with store.deferred_sync():
        store.put("t/0/a.log", b"a")
        store.put_many({"t/1/b.log": b"b", "t/1/b.index": b"i"}, {"t/1/b.snapshot": "t/0/old.log"})
        assert synced == []
    assert sorted(synced) == sorted(str(p) for p in (root / "t/0/a.log", root / "t/1/b.log", root / "t/1/b.index",
                                                     root / "t/0", root / "t/1"))
    with pytest.raises(RuntimeError, match="already active"), store.deferred_sync(), store.deferred_sync():
        pass


def _recording_syncfs(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> tuple[list[str], list[str]]:
    """The paths the local store fsyncs and the directories it `syncfs`es from now on (the real calls still made,
    or a syncfs failing with EIO when `fail`)."""
    real_syncfs = local_module._syncfs()
    assert real_syncfs is not None, "this test needs Linux 5.8 or later (syncfs that reports write-back errors)"
    fsynced: list[str] = []
    syncfsed: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def syncfs(directory: Path) -> None:
        syncfsed.append(str(directory))
        if fail:
            raise OSError(5, "syncfs: Input/output error", str(directory))
        real_syncfs(directory)

    monkeypatch.setattr("compaction.storage.local.os.fsync", fsync)
    monkeypatch.setattr(local_module, "_syncfs", lambda: syncfs)
    return fsynced, syncfsed


def test_the_local_store_syncs_many_objects_with_one_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`SYNCFS_MIN` objects or more put together (one `put_many`, or one `deferred_sync` block) are made durable by
    one `syncfs` of their file system instead of an fsync of each file and directory; fewer are fsynced each."""
    store = open_store(str(tmp_path / "store"))
    fsynced, syncfsed = _recording_syncfs(monkeypatch)
    many = {f"t/{i}/a.log": b"%d" % i for i in range(local_module.SYNCFS_MIN)}
    store.put_many(many)
    assert fsynced == [] and len(syncfsed) == 1  # one file system
    assert {o.key for o in store.list("t/")} == set(many)
    with store.deferred_sync():
        for i in range(local_module.SYNCFS_MIN):
            store.put(f"u/{i}/b.log", b"b")
    assert fsynced == [] and len(syncfsed) == 2
    store.put_many({"v/0/c.log": b"c", "v/0/c.index": b"i"})  # below SYNCFS_MIN: each file and the directory
    directory = str(tmp_path / "store" / "v/0")
    assert len(fsynced) == 3 and directory in fsynced  # (a file is fsynced under its temporary name, then linked)
    assert all(p.startswith(directory) for p in fsynced) and len(syncfsed) == 2


def test_a_failed_syncfs_fails_the_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's report of a failed write-back reaches the writer, which then reports nothing written."""
    store = open_store(str(tmp_path / "store"))
    _recording_syncfs(monkeypatch, fail=True)
    with pytest.raises(OSError, match="Input/output error"):
        store.put_many({f"t/{i}/a.log": b"a" for i in range(local_module.SYNCFS_MIN)})
    with pytest.raises(OSError, match="Input/output error"), store.deferred_sync():
        for i in range(local_module.SYNCFS_MIN):
            store.put(f"u/{i}/b.log", b"b")


def test_without_syncfs_many_objects_are_fsynced_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel has no `syncfs` that reports write-back errors, every file and directory is fsynced."""
    store = open_store(str(tmp_path / "store"))
    fsynced, _ = _recording_syncfs(monkeypatch)
    monkeypatch.setattr(local_module, "_syncfs", lambda: None)
    many = {f"t/{i}/a.log": b"a" for i in range(local_module.SYNCFS_MIN)}
    store.put_many(many)
    directories = {str(tmp_path / "store" / f"t/{i}") for i in range(local_module.SYNCFS_MIN)}
    assert len(fsynced) == 2 * len(many) and directories <= set(fsynced)  # each file (its temporary name) and dir


def test_the_local_put_then_links_the_key_after_everything_else_is_durable_and_waits_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's file is linked only once the objects, their directories and the key's own bytes are fsynced, and
    its directory after it; and those fsyncs are made at once (one wait for the disk before the link, one after),
    not one kind after another as `put_many` then `put` would."""
    store = open_store(str(tmp_path / "store"))
    root = tmp_path / "store"
    events: list[tuple[str, str]] = []
    at_once = threading.Barrier(5, timeout=10)  # 2 files, 2 directories, the key's bytes: all in flight together
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if ("link", str(root / "_log/1.json")) not in events:
            at_once.wait()
        events.append(("fsync", path))
        real_fsync(fd)

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("link", str(dst)))
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr("compaction.storage.local.os.fsync", fsync)
    monkeypatch.setattr("compaction.storage.local.os.link", link)
    store.put_then({"t/0/a.parquet": b"a", "t/1/b.parquet": b"b"}, "_log/1.json", b"commit")
    key_link = events.index(("link", str(root / "_log/1.json")))
    before, after = {p for _e, p in events[:key_link]}, [e for e in events[key_link + 1:]]
    assert {str(root / "t/0"), str(root / "t/1")} <= before  # the objects' directories
    assert sum(p.startswith(str(root / "_log/")) for e, p in events[:key_link] if e == "fsync") == 1  # its bytes
    assert after == [("fsync", str(root / "_log"))]
    assert store.get("_log/1.json") == b"commit" and store.get("t/1/b.parquet") == b"b"


def test_local_copies_without_sendfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel cannot `sendfile` between two files, the local store copies in user space."""
    def refuse(*_a: object) -> int:
        raise OSError("sendfile: not supported here")

    store = open_store(str(tmp_path / "store"))
    source = tmp_path / "in.log"
    source.write_bytes(PAYLOAD)
    monkeypatch.setattr("compaction.storage.local.os.sendfile", refuse)
    store.put_file(SEGMENT_KEY, source)
    assert store.get_to_file(SEGMENT_KEY, tmp_path / "out.log") == len(PAYLOAD)
    assert (tmp_path / "out.log").read_bytes() == PAYLOAD == store.get(SEGMENT_KEY)


def test_large_files_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    """Above `part_size` S3 switches to a multipart upload; the contract stays the same."""
    source = tmp_path / "big.log"
    big = os.urandom(2 * TEST_PART_SIZE + 12345)
    source.write_bytes(big)
    store.put_file("big.log", source)
    assert store.size("big.log") == len(big)
    assert (
        store.get("big.log", TEST_PART_SIZE - 10, TEST_PART_SIZE + 10)
        == big[TEST_PART_SIZE - 10 : TEST_PART_SIZE + 10]
    )
    assert store.get_to_file("big.log", tmp_path / "copy") == len(big)
    assert (tmp_path / "copy").read_bytes() == big
    with pytest.raises(ObjectExistsError):
        store.put_file("big.log", source)


@pytest.mark.parametrize("sizes", [[], [0], [7, 0, 4000], [TEST_PART_SIZE], [TEST_PART_SIZE, 1],
                                   [3 * MiB, 3 * MiB, 3 * MiB, 3 * MiB + 17], [2 * TEST_PART_SIZE + 5]])
def test_put_pieces_creates_the_concatenation(store: ObjectStore, sizes: list[int]) -> None:
    """Pieces of any sizes, across S3's part size (a multipart upload whose parts are cut from the pieces)."""
    pieces = [os.urandom(n) for n in sizes]
    store.put("first", b"")  # S3's conditional-put probe, run by a store's first write, counted apart
    before = store.stats.puts
    assert store.put_pieces("streamed.log", iter(pieces)) == sum(sizes)
    assert store.get("streamed.log") == b"".join(pieces)
    parts = -(-sum(sizes) // TEST_PART_SIZE)
    # one PUT, or a multipart upload's start, parts and completion (local: one object)
    assert store.stats.puts - before == (parts + 2 if isinstance(store, S3Store) and parts > 1 else 1)
    with pytest.raises(ObjectExistsError):
        store.put_pieces("streamed.log", iter([b"second"]))
    assert store.get("streamed.log") == b"".join(pieces)


@pytest.mark.parametrize("before_failing", [1, 2 * TEST_PART_SIZE + 1])
def test_put_pieces_whose_pieces_fail_creates_nothing(store: ObjectStore, before_failing: int) -> None:
    """The error taking a piece raises propagates, and neither the object nor a temporary file nor an S3 upload
    is left (after the part sent, in the second case)."""
    def pieces() -> Any:
        yield b"\x01" * before_failing
        raise RuntimeError("the rewrite failed")
    with pytest.raises(RuntimeError, match="the rewrite failed"):
        store.put_pieces("streamed.log", pieces())
    assert not store.exists("streamed.log")
    assert [o.key for o in store.list()] == []
    if isinstance(store, S3Store):
        uploads = store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        assert [u for u in uploads if u["Key"].startswith(store.uri.split("/", 3)[3])] == []
    else:
        assert not [f for f in cast(LocalStore, store).root.rglob("*") if f.is_file()]


@pytest.mark.parametrize(
    "key", ["", "/abs", "trailing/", "a//b", "../escape", "a/./b", "a/../b", "back\\slash"]
)
def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x")
    with pytest.raises(ValueError, match="invalid object key"):
        store.get(key)


def test_spec_survives_pickling_and_reopens_an_equivalent_store(store: ObjectStore) -> None:
    store.put(SEGMENT_KEY, PAYLOAD)
    spec = pickle.loads(pickle.dumps(store.spec))
    assert spec == store.spec
    reopened = spec.open()
    assert type(reopened) is type(store) and reopened.uri == store.uri
    assert reopened.get(SEGMENT_KEY, 10, 20) == PAYLOAD[10:20]
    with pytest.raises(TypeError, match=r"send store\.spec"):
        pickle.dumps(store)


def test_stats_count_requests_and_bytes(store: ObjectStore) -> None:
    store.probe_conditional_put()
    store.stats = StoreStats()
    store.put("a/1", b"12345")
    store.put("a/2", b"678")
    assert store.get("a/1") == b"12345"
    assert store.get("a/2", 1, 2) == b"7"
    assert store.size("a/1") == 5 and store.exists("a/2")
    assert len(list(store.list("a/"))) == 2
    store.delete("a/1")
    assert store.stats == StoreStats(gets=4, puts=2, deletes=1, lists=1, bytes_read=6, bytes_written=8)
    assert store.stats + store.stats == StoreStats(8, 4, 2, 2, 12, 16)


def test_conditional_put_probe_passes_and_cleans_up(store: ObjectStore) -> None:
    store.probe_conditional_put()
    assert list(store.list()) == []


def test_delta_table_lives_inside_the_store(store: ObjectStore) -> None:
    uri, options = store.delta_uri("tables/segments"), store.delta_storage_options()
    write_deltalake(uri, pa.table({"offset": [1, 2]}), storage_options=options)
    write_deltalake(uri, pa.table({"offset": [3]}), mode="append", storage_options=options)
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["offset"].to_pylist()) == [1, 2, 3]
    log = [info.key for info in store.list("tables/segments/_delta_log/")]
    assert log[:2] == [f"tables/segments/_delta_log/{v:020d}.json" for v in (0, 1)]


# --- opening stores ----------------------------------------------------------------------------------


def test_local_paths_and_file_uris_open_local_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = open_store()
    assert isinstance(default, LocalStore)
    assert default.uri == f"file://{tmp_path.resolve() / 'kcompact-store'}"
    assert not (tmp_path / "kcompact-store").exists()  # created on demand
    default.put("k", b"v")
    assert (tmp_path / DEFAULT_STORE_URI / "k").read_bytes() == b"v"
    assert open_store(default.uri).get("k") == b"v"
    assert open_store("kcompact-store/").uri == default.uri


def test_s3_uris_are_normalized(fake_aws_env: None) -> None:
    assert isinstance(open_store("s3://bucket"), S3Store)
    assert StoreSpec.parse("s3://bucket/").uri == "s3://bucket"
    assert StoreSpec.parse("s3://bucket//a/b/").uri == "s3://bucket/a/b"
    store = open_store("s3://bucket/a/b", endpoint_url="http://127.0.0.1:1", region="eu-west-1")
    assert store.delta_uri("meta") == "s3://bucket/a/b/meta"
    assert store.object_uri("x/y") == "s3://bucket/a/b/x/y"


@pytest.mark.parametrize(
    "uri", ["gs://bucket/x", "s3://", "s3:///prefix", "s3://b/p?versionId=1", "file://relative"]
)
def test_unusable_uris_are_config_errors(uri: str) -> None:
    with pytest.raises(ConfigError):
        open_store(uri)


def test_specs_not_built_by_parse_are_refused() -> None:
    with pytest.raises(ConfigError, match="not normalized"):
        StoreSpec("relative/dir")
    with pytest.raises(ConfigError, match="5 MiB"):
        StoreSpec("s3://bucket", part_size=MiB)


def test_s3_options_on_a_local_store_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="apply to s3:// only"):
        open_store(str(tmp_path), endpoint_url="http://127.0.0.1:9000")


# --- S3 only: a store that breaks ----------------------------------------------------------------------


def drop_if_none_match(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `client` behave like an S3 clone that silently ignores If-None-Match on PutObject."""
    real = client.put_object

    def put_object(**kwargs: Any) -> Any:
        kwargs.pop("IfNoneMatch", None)
        return real(**kwargs)

    monkeypatch.setattr(client, "put_object", put_object)


def client_error(code: str, status: int, operation: str = "GetObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


def failing(real: Callable[..., Any], errors: list[Exception], calls: list[int]) -> Callable[..., Any]:
    """A client method that raises `errors` in turn on its first calls, then behaves as `real`."""

    def method(**kwargs: Any) -> Any:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return real(**kwargs)

    return method


@pytest.mark.s3
def test_probe_refuses_a_store_that_ignores_if_none_match(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_if_none_match(s3_store.client, monkeypatch)
    with pytest.raises(ConfigError, match="does not enforce conditional PUT"):
        s3_store.probe_conditional_put()
    assert list(s3_store.list()) == []  # the probe object is gone


@pytest.mark.s3
def test_first_write_to_a_store_that_ignores_if_none_match_is_refused(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_if_none_match(s3_store.client, monkeypatch)
    for _ in range(2):  # a refused probe is not remembered as passed
        with pytest.raises(ConfigError, match="does not enforce conditional PUT"):
            s3_store.put(SEGMENT_KEY, PAYLOAD)
    assert not s3_store.exists(SEGMENT_KEY)


@pytest.mark.s3
def test_the_probe_runs_once_per_store(s3_store: S3Store) -> None:
    s3_store.put("a", b"1")
    s3_store.put("b", b"2")
    assert s3_store.stats.puts == 4  # probe (2) + two writes
    assert s3_store.stats.deletes == 1
    fresh = s3_store.spec.open()
    fresh.probe_conditional_put()  # called directly, it counts as the first-write probe too
    fresh.put("c", b"3")
    assert (fresh.stats.puts, fresh.stats.deletes) == (3, 1)


@pytest.mark.s3
def test_ranged_get_from_a_clone_that_ignores_range(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put("k", PAYLOAD)
    real = s3_store.client.get_object

    def get_object(**kwargs: Any) -> Any:
        kwargs.pop("Range", None)
        return real(**kwargs)

    monkeypatch.setattr(s3_store.client, "get_object", get_object)
    assert s3_store.get("k", 10, 20) == PAYLOAD[10:20]
    assert s3_store.get("k", 100) == PAYLOAD[100:]


@pytest.mark.s3
def test_throttling_is_retried_until_it_passes(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_store.put("k", PAYLOAD)
    calls: list[int] = []
    errors: list[Exception] = [client_error("SlowDown", 503), client_error("InternalError", 500)]
    monkeypatch.setattr(s3_store.client, "get_object", failing(s3_store.client.get_object, errors, calls))
    gets_before = s3_store.stats.gets
    assert s3_store.get("k", 0, 100) == PAYLOAD[:100]
    assert len(calls) == 3
    assert s3_store.stats.gets - gets_before == 3  # every attempt is a request


@pytest.mark.s3
def test_connection_errors_are_retried(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    errors: list[Exception] = [ConnectionClosedError(endpoint_url="http://127.0.0.1")]
    monkeypatch.setattr(
        s3_store.client, "list_objects_v2", failing(s3_store.client.list_objects_v2, errors, calls)
    )
    assert list(s3_store.list()) == []
    assert len(calls) == 2


@pytest.mark.s3
def test_exhausted_retries_raise_transient_store_error(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put("k", PAYLOAD)
    calls: list[int] = []
    errors: list[Exception] = [client_error("SlowDown", 503) for _ in range(10)]
    monkeypatch.setattr(s3_store.client, "get_object", failing(s3_store.client.get_object, errors, calls))
    with pytest.raises(TransientStoreError, match="still failing after 4 attempts") as exhausted:
        s3_store.get("k")
    assert s3_store.object_uri("k") in str(exhausted.value)
    assert len(calls) == FAST_RETRY.max_attempts


@pytest.mark.s3
def test_permanent_errors_raise_at_once(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_store.put("k", PAYLOAD)
    calls: list[int] = []
    errors: list[Exception] = [client_error("AccessDenied", 403)]
    monkeypatch.setattr(s3_store.client, "get_object", failing(s3_store.client.get_object, errors, calls))
    with pytest.raises(StoreAccessError, match="AccessDenied") as refused:
        s3_store.get("k")
    assert s3_store.object_uri("k") in str(refused.value)
    assert len(calls) == 1


@pytest.mark.s3
def test_delete_many_sends_a_batch_again_when_s3_fails_some_keys_transiently(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteObjects answers 200 with per-key errors; a transient one (InternalError, SlowDown) sends the batch again
    under the retry policy, a permanent one is raised naming the refused key."""
    keys = [f"k{i}" for i in range(5)]
    s3_store.put_many({k: b"v" for k in keys})
    real, calls = s3_store.client.delete_objects, []

    def partly_failing(**request: Any) -> dict[str, Any]:
        calls.append(len(request["Delete"]["Objects"]))
        answer = dict(real(**request))
        if len(calls) == 1:  # S3 deleted the others; it says which it did not
            answer["Errors"] = [{"Key": request["Delete"]["Objects"][2]["Key"], "Code": "InternalError",
                                 "Message": "We encountered an internal error. Please try again."}]
        return answer

    monkeypatch.setattr(s3_store.client, "delete_objects", partly_failing)
    assert s3_store.delete_many(keys) == 5
    assert calls == [5, 5] and not any(s3_store.exists(k) for k in keys)

    s3_store.put_many({k: b"v" for k in keys})

    def refusing(**request: Any) -> dict[str, Any]:
        calls.append(len(request["Delete"]["Objects"]))
        return {"Errors": [{"Key": request["Delete"]["Objects"][3]["Key"], "Code": "AccessDenied",
                            "Message": "Access Denied"}]}

    monkeypatch.setattr(s3_store.client, "delete_objects", refusing)
    with pytest.raises(StoreAccessError, match="AccessDenied") as refused:
        s3_store.delete_many(keys)
    assert s3_store.object_uri("k3") in str(refused.value) and len(calls) == 3  # refused once, not retried


@pytest.mark.s3
def test_missing_bucket_is_an_access_error(moto_endpoint: str, fake_aws_env: None) -> None:
    store = open_store("s3://kcompact-no-such-bucket/p", endpoint_url=moto_endpoint, region=REGION)
    with pytest.raises(StoreAccessError, match="NoSuchBucket"):
        store.get("k")
    with pytest.raises(StoreAccessError, match="does not exist"):
        store.exists("k")  # HEAD cannot tell a missing bucket from a missing key; the store asks


@pytest.mark.s3
def test_unreachable_endpoint_is_transient(fake_aws_env: None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    spec = StoreSpec.parse(
        f"s3://{BUCKET}/p", endpoint_url=f"http://127.0.0.1:{port}", region=REGION, retry=FAST_RETRY
    )
    with pytest.raises(TransientStoreError, match="still failing"):
        spec.open().get("k")


@pytest.mark.s3
def test_a_put_whose_response_was_lost_succeeds_on_retry(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.probe_conditional_put()
    real = s3_store.client.put_object
    lost: list[int] = []

    def put_then_lose_response(**kwargs: Any) -> Any:
        response = real(**kwargs)
        if not lost:
            lost.append(1)
            raise ConnectionClosedError(endpoint_url="http://127.0.0.1")
        return response

    monkeypatch.setattr(s3_store.client, "put_object", put_then_lose_response)
    s3_store.put("k", PAYLOAD)  # the retry meets 412, but the object holds exactly our bytes
    assert s3_store.get("k") == PAYLOAD
    with pytest.raises(ObjectExistsError):
        s3_store.put("k", PAYLOAD)  # no ambiguous attempt: a plain refusal, same bytes or not


@pytest.mark.s3
def test_a_retried_put_still_refuses_someone_elses_object(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put("k", b"theirs")
    calls: list[int] = []
    errors: list[Exception] = [ConnectionClosedError(endpoint_url="http://127.0.0.1")]
    monkeypatch.setattr(s3_store.client, "put_object", failing(s3_store.client.put_object, errors, calls))
    with pytest.raises(ObjectExistsError):
        s3_store.put("k", b"ours")
    assert s3_store.get("k") == b"theirs"


@pytest.mark.s3
def test_multipart_completion_refuses_a_key_created_meanwhile(
    s3_store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "big.log"
    source.write_bytes(b"\x01" * (TEST_PART_SIZE + 1))
    s3_store.put("big.log", b"theirs")
    monkeypatch.setattr(s3_store, "exists", lambda key: False)  # the key appears after the early check
    with pytest.raises(ObjectExistsError):
        s3_store.put_file("big.log", source)
    assert s3_store.get("big.log") == b"theirs"
    uploads = s3_store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
    assert [u for u in uploads if u["Key"].startswith(s3_store.uri.split("/", 3)[3])] == []


@pytest.mark.s3
def test_delta_storage_options_name_endpoint_region_and_credentials(
    s3_store: S3Store, moto_endpoint: str
) -> None:
    assert s3_store.delta_storage_options() == {
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


@pytest.mark.s3
def test_store_at_bucket_root_lists_the_whole_bucket(moto_endpoint: str, fake_aws_env: None) -> None:
    make_bucket(moto_endpoint, "kcompact-root")
    spec = StoreSpec.parse("s3://kcompact-root", endpoint_url=moto_endpoint, region=REGION, part_size=MiB * 5)
    store = spec.open()
    store.put("x/y", b"1")
    assert [info.key for info in store.list()] == ["x/y"]
    assert store.delta_uri("t") == "s3://kcompact-root/t"


def test_an_s3_stores_put_many_has_as_many_requests_in_flight_as_its_client_has_connections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each put on S3 is a round trip: one `put_many` (a metadata commit's data file per partition) keeps
    `S3_PUT_THREADS` of them in flight, as many as the client's connections, and `delete_many` its batches too."""
    from compaction.storage.s3_client import MAX_POOL_CONNECTIONS, S3_PUT_THREADS

    store = StoreSpec.parse("s3://bucket/prefix").open()  # no request is made: the puts are stood in for
    assert isinstance(store, S3Store) and store.put_threads == S3_PUT_THREADS == MAX_POOL_CONNECTIONS
    in_flight, peak, lock = [0], [0], threading.Lock()

    def put(key: str, data: bytes) -> None:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        threading.Event().wait(0.05)
        with lock:
            in_flight[0] -= 1

    monkeypatch.setattr(store, "put", put)
    store.put_many({f"k/{i}": b"x" for i in range(3 * S3_PUT_THREADS)})
    assert peak[0] == S3_PUT_THREADS
    local = open_store(DEFAULT_STORE_URI)
    assert local.put_threads == 8 < S3_PUT_THREADS  # a local put is a file create (and an fsync below SYNCFS_MIN)
