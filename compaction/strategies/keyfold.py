"""The best rank per key over any number of rows, in one pass: a hash table of the keys' bytes (numba).

A scan task folds every candidate record of its segments of a partition into a `KeyFold` and hands Spark one row
per distinct key (`compaction.spark.scan`). Rows come in as parallel columns (key bytes, the rank
(has_version, version, offset) of `compaction.strategies.ranking`, dirty) and each key keeps the greatest rank,
compared left to right, and whether any of its rows was dirty: the winner rule, as Spark's aggregate applies it
over the whole run (`tests/unit/test_ranking.py` holds the fold equal to the reference).

Keys are compared by their full bytes: a 64-bit hash (FNV-1a, then a 64-bit finaliser) picks the slot and tells
two unequal keys apart quickly, and a key is taken for another only when their bytes are equal. The table holds
each distinct key once, its bytes copied into one growing buffer in first-seen order (so the result's key column
is that buffer, no copy), plus ~50 bytes a key; the rows folded in are not kept.

It replaces an Arrow `group_by` per segment and again over a task's segments, which cost more than the fold and
the decoding together (BENCHMARKS.md). The table is far larger than the caches, so every lookup waits on memory:
see `_BATCH`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from compaction.format.scan import binary_buffers
from compaction.kernels import kernel

_EMPTY = -1
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_BINARY_LIMIT = 2**31 - 1


@kernel(nogil=True)
def _hash(data: np.ndarray, start: int, end: int) -> Any:
    """The slot hash of `data[start:end]`. Not `compaction.bloom.hashing`'s XXH64: numba's cache of `_fold` and
    `_rehash` is invalidated when this file changes, not when another module's kernel they call does, and both
    must hash alike."""
    h = _FNV_OFFSET
    for p in range(start, end):
        h = (h ^ np.uint64(data[p])) * _FNV_PRIME
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


# An entry's columns in the table (one row of int64 per distinct key: one cache line holds two entries).
_START, _META, _VERSION, _OFFSET = range(4)  # _META: key length << 16 | has_version << 8 | dirty
_TAG_SHIFT = np.uint64(33)  # a slot holds (hash >> 33) << 32 | entry: the tag spares a look at most entries


_BATCH = 64
"""Rows hashed and looked up ahead at a time: the table is far larger than the caches, so each lookup waits on
memory; loading the slots, then the entries, then the key bytes of a batch's rows one after the other lets those
waits overlap before the rows are folded in order."""


@kernel(nogil=True)
def _touch(slots: np.ndarray, entries: np.ndarray, arena: np.ndarray, hashes: np.ndarray, found: np.ndarray,
           count: int, mask: Any) -> Any:
    """Load, for `count` hashed rows, their first slot, the entry it names and that entry's first key byte
    (independent loads, so they are in flight together); returns a sum of them so that none is left out."""
    total = np.int64(0)
    for i in range(count):
        slot = slots[np.int64(hashes[i] & mask)]
        found[i] = slot
    for i in range(count):
        slot = found[i]
        if slot != _EMPTY:
            found[i] = entries[slot & 0xFFFFFFFF, _START]
            total += entries[slot & 0xFFFFFFFF, _META]
        else:
            found[i] = -1
    for i in range(count):
        if 0 <= found[i] < len(arena):  # an empty key may start at the buffer's end
            total += arena[found[i]]
    return total


@kernel(nogil=True)
def _fold(slots: np.ndarray, entries: np.ndarray, arena: np.ndarray, n: int, used: int,
          key_offsets: np.ndarray, key_data: np.ndarray, has_version: np.ndarray, version: np.ndarray,
          offset: np.ndarray, dirty: np.ndarray, row: int) -> Any:
    """Fold rows `row`.. into the table; stops before a row that would need a new key while the entries, the
    slots (kept at most half full) or the key buffer are full. Returns (next row, keys, key bytes, and a sum
    of the loads `_touch` made, which the caller drops: returned, they cannot be optimised away)."""
    mask = np.uint64(len(slots) - 1)
    rows = len(offset)
    hashes = np.empty(_BATCH, np.uint64)
    found = np.empty(_BATCH, np.int64)
    sink = np.int64(0)
    batch_end = row
    while row < rows:
        if row == batch_end:  # hash the next rows, then touch what they will compare with, row by row
            batch_end = min(rows, row + _BATCH)
            for i in range(row, batch_end):
                hashes[i - row] = _hash(key_data, key_offsets[i], key_offsets[i + 1])
            sink += _touch(slots, entries, arena, hashes, found, batch_end - row, mask)
            batch_start = row
        a = key_offsets[row]
        b = key_offsets[row + 1]
        length = b - a
        h = hashes[row - batch_start]
        tag = np.int64(h >> _TAG_SHIFT) << 32
        j = np.int64(h & mask)
        while True:
            slot = slots[j]
            if slot == _EMPTY:
                if n == len(entries) or 2 * (n + 1) > len(slots) or used + length > len(arena):
                    return row, n, used, sink
                arena[used:used + length] = key_data[a:b]
                entries[n, _START] = used
                entries[n, _META] = (length << 16) | (np.int64(has_version[row]) << 8) | np.int64(dirty[row])
                entries[n, _VERSION] = version[row]
                entries[n, _OFFSET] = offset[row]
                slots[j] = tag | n
                used += length
                n += 1
                break
            if (slot >> 32) << 32 == tag:
                e = slot & 0xFFFFFFFF
                meta = entries[e, _META]
                if meta >> 16 == length:
                    s = entries[e, _START]
                    same = True
                    for p in range(length):
                        if arena[s + p] != key_data[a + p]:
                            same = False
                            break
                    if same:
                        hv = (meta >> 8) & 0xFF
                        v = entries[e, _VERSION]
                        if (has_version[row] > hv or (has_version[row] == hv and (
                                version[row] > v or (version[row] == v and offset[row] > entries[e, _OFFSET])))):
                            meta = (meta & ~np.int64(0xFF00)) | (np.int64(has_version[row]) << 8)
                            entries[e, _VERSION] = version[row]
                            entries[e, _OFFSET] = offset[row]
                        entries[e, _META] = meta | np.int64(dirty[row])
                        break
            j = np.int64((np.uint64(j) + np.uint64(1)) & mask)
        row += 1
    return row, n, used, sink


@kernel(nogil=True)
def _rehash(slots: np.ndarray, entries: np.ndarray, arena: np.ndarray, n: int) -> None:
    """Slot the first `n` entries into (empty) `slots`, their hashes computed again from the key bytes."""
    mask = np.uint64(len(slots) - 1)
    for e in range(n):
        s = entries[e, _START]
        h = _hash(arena, s, s + (entries[e, _META] >> 16))
        j = np.int64(h & mask)
        while slots[j] != _EMPTY:
            j = np.int64((np.uint64(j) + np.uint64(1)) & mask)
        slots[j] = (np.int64(h >> _TAG_SHIFT) << 32) | e


_QUADRUPLE_FROM = 1 << 20
"""Keys from which a full table grows four times instead of twice. Growing slots every key again, from its
bytes, into a table larger than the caches, so large folds grow fewer times; smaller folds keep doubling, since a
table that few keys leave sparse is slower to fold into (figures: BENCHMARKS.md)."""


class KeyFold:
    """Per distinct key the greatest rank (has_version, version, offset) and whether any row was dirty, over the
    rows of every `add`; `result` gives them as columns, keys in first-seen order."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        capacity = max(16, capacity)
        self._slots = np.full(_pow2(2 * capacity), _EMPTY, np.int64)
        self._entries = np.empty((capacity, 4), np.int64)
        self._arena = np.empty(16 * capacity, np.uint8)
        self.keys = 0
        self._used = 0

    def add(self, keys: pa.Array, has_version: np.ndarray, version: np.ndarray, offset: np.ndarray,
            dirty: np.ndarray | bool) -> None:
        """Fold rows in: `keys` (binary, no nulls) with their rank columns and dirty flags (one for all)."""
        if keys.null_count:
            raise ValueError("a key column to fold holds nulls")
        key_offsets, key_data = binary_buffers(keys)
        rows = len(offset)
        flags = np.full(rows, dirty, np.bool_) if isinstance(dirty, (bool, np.bool_)) else np.asarray(dirty, np.bool_)
        hv, ver, off = (np.ascontiguousarray(has_version, np.int8), np.ascontiguousarray(version, np.int64),
                        np.ascontiguousarray(offset, np.int64))
        row = 0
        while row < rows:
            row, self.keys, self._used, _sink = _fold(self._slots, self._entries, self._arena, self.keys, self._used,
                                               key_offsets, key_data, hv, ver, off, flags, row)
            if row < rows:
                self._grow(int(key_offsets[row + 1] - key_offsets[row]))

    def _grow(self, key_length: int) -> None:
        """Room for at least one more key of `key_length` bytes: whatever is full doubles (the entries and slots
        quadruple from `_QUADRUPLE_FROM` keys on)."""
        n = self.keys
        factor = 2 if n < _QUADRUPLE_FROM else 4
        self._resize(factor * n if n == len(self._entries) else 0,
                     factor * len(self._slots) if 2 * (n + 1) > len(self._slots) else 0,
                     max(2 * len(self._arena), self._used + key_length)
                     if self._used + key_length > len(self._arena) else 0)

    def reserve(self, keys: int) -> None:
        """Room for `keys` distinct keys in all (and their bytes, at the mean length of those folded so far), made
        at once: a fold that knows roughly how many keys are coming skips the growths in between, each of which
        copies the entries and slots every key again into a new table (the largest a table four times the size
        the fold ends at, filled with empty slots). Nothing when the table holds `keys` already."""
        n = self.keys
        if keys <= len(self._entries) or keys <= n:
            return
        self._resize(keys, _pow2(2 * keys), -(-self._used * keys // n) if n else 16 * keys)

    def _resize(self, entries: int, slots: int, arena: int) -> None:
        """The entries grown to `entries` rows, the slots to `slots` (a power of two; every key slotted again) and
        the key bytes to `arena`, each only where that is more than it has."""
        n = self.keys
        if entries > len(self._entries):
            grown = np.empty((entries, 4), np.int64)
            grown[:n] = self._entries[:n]
            self._entries = grown
        if slots > len(self._slots):
            self._slots = np.full(slots, _EMPTY, np.int64)
            _rehash(self._slots, self._entries, self._arena, n)
        if arena > len(self._arena):
            grown_arena = np.empty(arena, np.uint8)
            grown_arena[:self._used] = self._arena[:self._used]
            self._arena = grown_arena

    def offsets(self) -> np.ndarray:
        """Each distinct key's best offset, in first-seen order (`result`'s offsets alone)."""
        return self._entries[:self.keys, _OFFSET].copy()

    def result(self) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys, has_version, version, offset, dirty), a row per distinct key in first-seen order; keys are
        binary (large_binary past 2 GiB of key bytes)."""
        n, used = self.keys, self._used
        entries = self._entries[:n]
        meta = entries[:, _META]
        starts = np.empty(n + 1, np.int64)
        starts[:n] = entries[:, _START]
        starts[n] = used
        data = pa.py_buffer(self._arena[:used])
        if used <= _BINARY_LIMIT:
            keys = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(starts.astype(np.int32)), data])
        else:
            keys = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(starts), data])
        return (keys, ((meta >> 8) & 0xFF).astype(np.int8), entries[:, _VERSION].copy(),
                entries[:, _OFFSET].copy(), (meta & 1).astype(np.bool_))


def _pow2(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


__all__ = ["KeyFold"]
