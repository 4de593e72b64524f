"""S3 that misbehaves on the wire: a flaky HTTP proxy on 127.0.0.1 in front of the moto server.

The contract tests break the boto3 client in-process; here every fault is a real HTTP answer that boto3
(and, for the metadata table, delta-rs) has to parse and survive: 503 SlowDown, 500 InternalError, a
reply lost after the request landed, 403 AccessDenied. At the store and tier level:

- throttling and transient 5xx are retried until they pass, for every kind of request; when retries run out,
  `TransientStoreError` (exit 4) names the object;
- an object write whose reply was lost after it landed is recognised on retry (same bytes), not duplicated;
- a metadata commit whose reply was lost is reported by delta-rs as a conflict although it landed (the
  "outcome unknown" case `cleaner.commit_partition` reconciles), and a blind retry cannot land it twice;
- one tier run through a hostile store: the partition that is only throttled (its commits too, one of them
  losing its reply) is tiered exactly; the one refused with 403 and the one whose metadata writes keep
  failing fail alone, each with its typed error and exit code, nothing of them live; without the faults a
  rerun converges and gc leaves no orphan.

The proxy is `tests/s3_proxy.py`. Compaction through it, a fault on one partition failing that partition alone,
is `tests/spark/test_partition_faults.py`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from compaction.errors import CommitConflictError, TransientStoreError
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import (
    ChangeSet,
    acquire_fencing_epoch,
    commit,
    new_kafka_uuid,
    table_in_store,
)
from compaction.reader import consumer_records, segment_ref
from compaction.storage import ObjectStore, StoreSpec
from compaction.tier import tier_logdir
from tests.latest_view import store_problems
from tests.moto_s3 import FAST_RETRY
from tests.s3_proxy import (
    FlakyProxy,
    commit_entry,
    direct,
    fast_delta_retries,
    is_segment_object,
    spec_through,
)

NOW = 1_800_000_000_000
DAY = 86_400_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 2), TopicSpec("users", 1)), records_per_partition=150, keys=40,
                    segment_bytes=8 * 1024, seed=17)
PARTITIONS = [("orders", 0), ("orders", 1), ("users", 0)]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-faults-logdir")
    generate_logdir(root, SPEC)
    return root


def read_back(store: ObjectStore) -> dict[tuple[str, int], list[tuple]]:
    """Every partition as a consumer reads it (read_uncommitted: offset, key, value), from one snapshot."""
    snapshot = table_in_store(store).snapshot()
    out = {}
    for tp in PARTITIONS:
        refs = [segment_ref(s) for s in snapshot.live_segments(*tp)]
        out[tp] = [(r.offset, r.key, r.value) for r in consumer_records(store, refs)]
    return out


@pytest.fixture(scope="module")
def expected(generated: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], list[tuple]]:
    """What a fault-free tier run reads back (a local store): the reference for the faulty ones."""
    store = StoreSpec.parse(str(tmp_path_factory.mktemp("reference") / "store")).open()
    tier_logdir(generated, store, table_in_store(store, create=True), NOW)
    return read_back(store)


@pytest.mark.s3
def test_every_kind_of_request_survives_throttling_and_5xx(proxy: FlakyProxy, fake_aws_env: None,
                                                         tmp_path: Path) -> None:
    # Every distinct request is refused twice (SlowDown, then InternalError) and passes on its third attempt.
    proxy.fault = lambda method, path, seen: [(503, "SlowDown"), (500, "InternalError")][seen] if seen < 2 else None
    store = spec_through(proxy).open()
    payload = bytes(range(256)) * 64
    store.put("a/k1", payload)
    (tmp_path / "f").write_bytes(payload[:1000])
    store.put_file("a/k2", tmp_path / "f")
    assert store.get("a/k1", 10, 20) == payload[10:20]
    assert store.get("a/k1") == payload
    assert store.get_to_file("a/k2", tmp_path / "g") == 1000
    assert [o.key for o in store.list("a/")] == ["a/k1", "a/k2"]
    assert store.size("a/k1") == len(payload) and store.exists("a/k2")
    store.delete("a/k1")
    assert not store.exists("a/k1")
    codes = {code for _m, _p, code in proxy.injected}
    assert codes == {"SlowDown", "InternalError"}
    assert {m for m, _p, _c in proxy.injected} >= {"PUT", "GET", "HEAD", "DELETE"}
    assert store.stats.puts >= 3 * 2, "every attempt is counted as a request"


@pytest.mark.s3
def test_a_write_whose_reply_was_lost_is_not_written_twice(proxy: FlakyProxy, fake_aws_env: None) -> None:
    proxy.fault = lambda method, path, seen: "lose" if method == "PUT" and "k-lost" in path and seen == 0 else None
    store = spec_through(proxy).open()
    store.put("k-lost", b"ours")  # landed, reply lost; the retry meets 412 and finds exactly our bytes
    assert store.get("k-lost") == b"ours"
    assert [(m, c) for m, p, c in proxy.injected] == [("PUT", "lose")]


@pytest.mark.s3
def test_retries_that_run_out_raise_transient_store_error(proxy: FlakyProxy, fake_aws_env: None) -> None:
    proxy.fault = lambda method, path, seen: (503, "SlowDown") if "k-hot" in path else None
    store = spec_through(proxy).open()
    with pytest.raises(TransientStoreError, match=f"still failing after {FAST_RETRY.max_attempts} attempts") as e:
        store.put("k-hot", b"x")
    assert store.object_uri("k-hot") in str(e.value)
    assert len(proxy.injected) == FAST_RETRY.max_attempts


@pytest.mark.s3
def test_a_metadata_commit_whose_reply_was_lost_landed_once(proxy: FlakyProxy, fake_aws_env: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Iceberg's CommitStateUnknown, for real: the conditional PUT of the log entry lands and its reply is lost. The
    store retries the PUT, is refused (the entry exists), and finds the entry is its own (same ETag): the commit
    reports that it landed, once. (delta-rs, which wrote these commits before, reported a conflict here.) A blind
    retry of the change set is refused (commit_seq moved), so it can never land twice."""
    store = spec_through(proxy).open()
    fast_delta_retries(store, monkeypatch)
    table = table_in_store(store, create=True)
    epoch = acquire_fencing_epoch(table, "orders", 0, "test", NOW, topic_id=new_kafka_uuid())
    current = table.partition_snapshot("orders", 0)
    change = ChangeSet.planned_from(current, fencing_epoch=epoch, writer="test", cleaner_offset=0, run_id="r1")
    landing = table.version() + 1
    proxy.fault = lambda method, path, seen: "lose" if method == "PUT" and commit_entry(path) == landing and seen == 0 \
        else None
    assert commit(table, change, NOW).version == landing
    after = table.partition_snapshot("orders", 0)
    assert (after.version, after.commit_seq, after.state and after.state.run_id) == (landing, current.commit_seq + 1,
                                                                                   "r1"), "it landed, once"
    with pytest.raises(CommitConflictError, match="commit_seq"):
        commit(table, change, NOW)
    assert table.version() == landing


@pytest.mark.s3
def test_tier_through_a_hostile_store_fails_only_what_cannot_pass_and_a_rerun_converges(
    proxy: FlakyProxy, moto_endpoint: str, fake_aws_env: None, generated: Path, tmp_path: Path,
    expected: dict[tuple[str, int], list[tuple]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One tier run, three partitions, three fates:

    - orders-0: every request for its segment objects is refused once (SlowDown); its metadata commit is
      throttled once, then lands but loses its reply (the store's retry finds its own entry). It is tiered
      exactly.
    - orders-1: every write of its metadata rows answers 503 until the store's retries run out:
      TransientStoreError, exit 4 (retries running out on a segment upload take the same path, see
      test_retries_that_run_out_raise_transient_store_error). The batch's one commit, of the two partitions
      whose uploads passed, fails with it, and is split until orders-1 fails alone.
    - users-0: every segment upload is refused with 403 AccessDenied (permanent): StoreAccessError, exit 2; it
      never reaches the commit.

    Nothing of a failed partition is live; without the faults a rerun converges and gc leaves no orphan.
    """
    # The commit of [orders-0, orders-1] fails on orders-1's rows; its halves: orders-0 lands as v1 (its entry's
    # first PUT throttled, the second landing with its reply lost), orders-1 fails alone.
    commits = {1: [(503, "SlowDown"), "lose"]}

    def fault(method: str, path: str, seen: int) -> tuple[int, str] | str | None:
        if "/orders-" in path and "/0/" in path and seen == 0:
            return (503, "SlowDown")
        if method == "PUT" and "/users-" in path:
            return (403, "AccessDenied")
        if method == "PUT" and "_kcompact_metadata/topic%3Dorders/partition%3D1/" in path:
            return (503, "SlowDown")
        version = commit_entry(path)
        faults = commits.get(version, []) if method == "PUT" and version is not None else []
        return faults[seen] if seen < len(faults) else None

    proxy.fault = fault
    store = spec_through(proxy).open()
    fast_delta_retries(store, monkeypatch)
    table = table_in_store(store, create=True)
    logdir = Path(shutil.copytree(generated, tmp_path / "logdir"))
    results = {(r.topic, r.partition): r for r in tier_logdir(logdir, store, table, NOW)}
    assert {tp: (r.error_type, r.exit_code) for tp, r in results.items()} == {
        ("orders", 0): (None, 0), ("orders", 1): ("TransientStoreError", 4), ("users", 0): ("StoreAccessError", 2)}
    assert "/users-" in (results[("users", 0)].error or "") and "AccessDenied" in (results[("users", 0)].error or "")
    assert "SlowDown" in (results[("orders", 1)].error or "")
    injected = {("segment" if is_segment_object(p) else "commit" if commit_entry(p) is not None else "rows", c)
                for _m, p, c in proxy.injected}
    assert injected == {("segment", "SlowDown"), ("segment", "AccessDenied"), ("commit", "lose"),
                        ("commit", "SlowDown"), ("rows", "SlowDown")}
    clean = direct(store, moto_endpoint)
    snapshot = table_in_store(clean).snapshot()
    assert snapshot.live_segments("users", 0) == () and snapshot.live_segments("orders", 1) == ()
    assert snapshot.partition("users", 0).segments == ()
    assert read_back(clean)[("orders", 0)] == expected[("orders", 0)]

    proxy.fault = lambda method, path, seen: None  # the faults are gone: a rerun converges
    again = tier_logdir(logdir, store, table, NOW + 1)
    assert [r.error for r in again] == [None, None, None]
    assert read_back(clean) == expected
    collect_garbage(store, table, max(NOW, int(time.time() * 1000)) + 2 * DAY)
    assert store_problems(clean) == []
    assert read_back(clean) == expected
