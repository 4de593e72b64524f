"""The scan's per-key fold (`compaction.strategies.keyfold.KeyFold`) against Arrow's own group-by: many keys
(every growth and rehash on the way), keys that are prefixes of each other or empty, sliced and 32/64-bit
offset inputs (`compaction.format.scan.binary_buffers`), and the winner rule over rows that arrive in any order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from compaction.format.scan import binary_buffers
from compaction.strategies.keyfold import KeyFold


def reference(keys: pa.Array, offsets: np.ndarray, dirty: np.ndarray) -> dict[bytes, tuple[int, bool]]:
    table = pa.table({"key": keys.cast(pa.large_binary()), "offset": offsets, "dirty": dirty})
    best = table.group_by("key").aggregate([("offset", "max"), ("dirty", "any")])
    return {k: (o, d) for k, o, d in zip(best["key"].to_pylist(), best["offset_max"].to_pylist(),
                                         best["dirty_any"].to_pylist(), strict=True)}


def folded(fold: KeyFold) -> dict[bytes, tuple[int, bool]]:
    keys, _hv, _version, offsets, dirty = fold.result()
    out = {k: (int(o), bool(d)) for k, o, d in zip(keys.to_pylist(), offsets, dirty, strict=True)}
    assert len(out) == len(keys) == fold.keys, "a key appears once"
    return out


@pytest.mark.parametrize("quadruple_from", [1 << 20, 64])
def test_a_quarter_million_keys_in_random_order_match_arrow_group_by(quadruple_from: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing twice at a time, and four times from 64 keys on (as large folds do from a million)."""
    monkeypatch.setattr("compaction.strategies.keyfold._QUADRUPLE_FROM", quadruple_from)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 250_000, 600_000)
    lengths = ids % 23  # keys of 0..22 bytes: some are prefixes of others, one length is empty
    keys = pa.array([(b"%d:" % i * 3)[:n] + bytes([i % 251]) * (n > 20) for i, n in
                     zip(ids.tolist(), lengths.tolist(), strict=True)], pa.binary())
    offsets = rng.permutation(len(ids)).astype(np.int64)  # the best is not the last row seen
    dirty = rng.random(len(ids)) < 0.01
    fold = KeyFold(16)  # grows from 16 entries: entries, slots and key bytes all double many times
    for at in range(0, len(ids), 100_000):  # six adds, as six segments would
        fold.add(keys.slice(at, 100_000), np.zeros(100_000, np.int8), np.zeros(100_000, np.int64),
                 offsets[at:at + 100_000], dirty[at:at + 100_000])
    assert folded(fold) == reference(keys, offsets, dirty)


@pytest.mark.parametrize("reserves", [(0,), (1,), (5_000,), (300_000,), (40_000, 10, 90_000, 260_000)])
def test_reserved_room_changes_nothing_but_the_growths(reserves: tuple[int, ...]) -> None:
    """`reserve` between adds, for fewer keys than held, about as many as come, and more: the same result as
    growing as the keys come, and no growth when the room reserved was enough."""
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 200_000, 400_000)
    keys = pa.array([b"k%d" % i + b"x" * (i % 9) for i in ids.tolist()], pa.binary())
    offsets = rng.permutation(len(ids)).astype(np.int64)
    dirty = rng.random(len(ids)) < 0.01
    fold, grown = KeyFold(16), KeyFold(16)
    adds = range(0, len(ids), 400_000 // len(reserves))
    for at, room in zip(adds, reserves, strict=True):
        fold.reserve(room)
        rows = slice(at, at + 400_000 // len(reserves))
        for f in (fold, grown):
            f.add(keys[rows], np.zeros(len(ids[rows]), np.int8), np.zeros(len(ids[rows]), np.int64), offsets[rows],
                  dirty[rows])
    assert folded(fold) == folded(grown) == reference(keys, offsets, dirty)
    if reserves == (300_000,):  # room for every key from the start: the table never grew
        assert len(fold._entries) == 300_000 and len(fold._slots) == 1 << 20


def test_empty_and_prefix_keys_are_different_keys() -> None:
    fold = KeyFold()
    keys = pa.array([b"", b"a", b"aa", b"", b"a\x00", b"a"], pa.large_binary())
    fold.add(keys, np.zeros(6, np.int8), np.zeros(6, np.int64), np.arange(6, dtype=np.int64), False)
    assert folded(fold) == {b"": (3, False), b"a": (5, False), b"aa": (2, False), b"a\x00": (4, False)}


def test_rank_is_compared_left_to_right_and_dirty_is_any() -> None:
    fold = KeyFold()
    keys = pa.array([b"k"] * 4, pa.binary())
    fold.add(keys.slice(0, 2), np.array([1, 0], np.int8), np.array([5, 99], np.int64), np.array([0, 1], np.int64),
             False)  # a version beats none, however large
    fold.add(keys.slice(2, 2), np.array([1, 1], np.int8), np.array([5, 4], np.int64), np.array([2, 3], np.int64),
             True)  # equal versions go to the higher offset; a lower version loses
    got_keys, has_version, version, offsets, dirty = fold.result()
    assert got_keys.to_pylist() == [b"k"]
    assert (int(has_version[0]), int(version[0]), int(offsets[0]), bool(dirty[0])) == (1, 5, 2, True)


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_binary_buffers_of_a_sliced_array(kind: pa.DataType) -> None:
    arr = pa.array([b"xx", b"abc", b"", b"de"], kind).slice(1, 3)
    offsets, data = binary_buffers(arr)
    assert offsets.dtype == np.int64
    assert [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(3)] == [b"abc", b"", b"de"]


def test_null_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="nulls"):
        KeyFold().add(pa.array([b"a", None], pa.binary()), np.zeros(2, np.int8), np.zeros(2, np.int64),
                      np.arange(2, dtype=np.int64), False)


def test_no_rows_give_no_keys() -> None:
    fold = KeyFold()
    fold.add(pa.array([], pa.large_binary()), np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0, np.int64),
             True)
    keys, *_rest = fold.result()
    assert len(keys) == 0 and keys.type == pa.binary()
