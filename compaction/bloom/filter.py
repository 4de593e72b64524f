"""A segment's key filter: a bloom filter over every key the segment holds, stored in its `.indexes` object or as
its `.bloom`.

Why a bloom filter at all: a cleaned segment below the first dirty offset holds each key at most
once, and its records can only be superseded by records of the run's *dirty keys*. A filter answers "may
this segment hold any of these keys?" from ~10 bits per key instead of the segment's bytes; "no" is
certain, so such a segment need not be downloaded or rewritten (`compaction.bloom.skipping`).

## Implementation: numba over Arrow buffers

Keys arrive as Arrow binary columns (the columnar scan's output, Spark's `mapInArrow` batches), so the
compiled path hashes a whole column in one call with no Python object per key, and one 64-bit hash per key
(XXH64, seed 0: stable across processes and versions) is all a filter test ships across the Spark boundary.
The libraries weighed against it need a Python call per key (rbloom) or hash in Python (pybloom-live, also
unmaintained), and store filters in layouts of their own; the measured costs are in BENCHMARKS.md (P4). The
readable reference path (`reference_filter`, `xxhash` + Python ints) is kept beside the kernels and tested
against them bit for bit.

## Format (version 1), big-endian like Kafka's own formats

    offset  size  field
         0     4  magic            b"KCBF"
         4     1  version          1
         5     1  hash             1 = XXH64 seed 0 + double hashing (`compaction.bloom.hashing`)
         6     2  k                probes per key, 1..64
         8     8  m                bits, a multiple of 64, >= 64
        16     8  n                keys inserted
        24     8  horizon_ms       earliest delete horizon of the segment's batches (KIP-534), -1 if none
        32     4  flags            bit 0: the segment holds transactional or control batches
        36     4  crc              CRC-32C of bytes [0, 36) followed by bytes [40, end)
        40   m/8  bits             bit i is bit (i mod 8) of byte (i div 8), least significant first

`horizon_ms` and `flags` are facts about the segment that decide whether it may be kept unread
(`skipping.py`); they ride in the filter so that the decision needs no other object. A reader refuses
(`FilterFormatError`) an unknown magic, version or hash and a CRC mismatch: the caller then treats the
segment as having no filter (it is read, never wrongly skipped).

Sizing (the usual optimum): m = ceil(-n ln p / ln(2)^2) rounded up to 64 bits, k = round(m/n ln 2), for
`bloom.filter.fpp` p. Note what p means: the chance that *one* absent key tests positive. A segment holding
none of D dirty keys tests positive with probability 1 - (1 - p)^D ~ D p, so p must be well below 1/D for
skipping to pay off (1% skips few segments once a partition has more than ~100 dirty keys per run).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

from compaction.bloom.hashing import key_hashes, mix64, reference_hash, reference_positions
from compaction.errors import CorruptInputError
from compaction.kernels import kernel

MAGIC = b"KCBF"
VERSION = 1
HASH_XXH64_DOUBLE = 1
NO_HORIZON = -1
FLAG_TRANSACTIONAL = 0x1

MAGIC_OFFSET = 0
MAGIC_LENGTH = 4
VERSION_OFFSET = MAGIC_OFFSET + MAGIC_LENGTH
VERSION_LENGTH = 1
HASH_OFFSET = VERSION_OFFSET + VERSION_LENGTH
HASH_LENGTH = 1
K_OFFSET = HASH_OFFSET + HASH_LENGTH
K_LENGTH = 2
M_OFFSET = K_OFFSET + K_LENGTH
M_LENGTH = 8
N_OFFSET = M_OFFSET + M_LENGTH
N_LENGTH = 8
HORIZON_OFFSET = N_OFFSET + N_LENGTH
HORIZON_LENGTH = 8
FLAGS_OFFSET = HORIZON_OFFSET + HORIZON_LENGTH
FLAGS_LENGTH = 4
CRC_OFFSET = FLAGS_OFFSET + FLAGS_LENGTH
CRC_LENGTH = 4
BITS_OFFSET = CRC_OFFSET + CRC_LENGTH  # 40
HEADER_SIZE = BITS_OFFSET

_HEADER = struct.Struct(">4sBBHQQqI")  # everything before the CRC
MIN_BITS = 64
MAX_K = 64


class FilterFormatError(CorruptInputError):
    """A `.bloom` object is not a filter this version reads (magic, version, hash, size or CRC)."""


@dataclass(frozen=True)
class FilterFacts:
    """What a filter records about its segment besides its keys (see the module docstring)."""

    horizon_ms: int = NO_HORIZON
    transactional: bool = False


def _crc(head: bytes | memoryview, body: bytes | memoryview) -> int:
    return int(crc32c.crc32c(body, crc32c.crc32c(head)))


def filter_shape(n: int, fpp: float) -> tuple[int, int]:
    """(m bits, k probes) for n keys at false-positive rate `fpp` (0 < fpp < 1)."""
    if not 0.0 < fpp < 1.0:
        raise ValueError(f"bloom.filter.fpp must be in (0, 1), got {fpp}")
    if n <= 0:
        return MIN_BITS, 1
    bits = math.ceil(-n * math.log(fpp) / math.log(2) ** 2)
    m = max(MIN_BITS, -(-bits // 64) * 64)
    k = min(MAX_K, max(1, round(m / n * math.log(2))))
    return m, k


INSERT_KEYS = 1 << 17
"""Keys whose probe bits the bucketed insert places at once (`_insert_bucketed`): their positions, 8 bytes each, k
per key (25 MiB of positions twice at k = 24), bucketed by the region of the filter they fall in before any bit is
set."""

INSERT_BUCKETS = 512
"""The most regions the insert buckets positions into (each at least `MIN_REGION_BITS`): few enough write streams
for the bucketing pass, and a region small enough (128 KiB of bits for a 64 MiB filter) to stay in a core's L2
while its bits are set."""

MIN_REGION_BITS = 1 << 17


def _region_shift(m: int) -> int:
    """log2 of the bits per region of a filter of `m` bits (`INSERT_BUCKETS`, `MIN_REGION_BITS`). Pure."""
    shift = MIN_REGION_BITS.bit_length() - 1
    while (m >> shift) >= INSERT_BUCKETS:
        shift += 1
    return shift


BUCKETED_BYTES = 4 << 20
"""A filter larger than this has its bits set a region at a time (`_insert_bucketed`); a smaller one stays in a
core's caches while each probe's bit is set where it falls (`_insert_each`)."""


def _insert(bits: np.ndarray, m: int, k: int, hashes: np.ndarray) -> None:
    """Set the `k` probe bits of each of `hashes` in the filter `bits` of `m` bits: the bits of standard double
    hashing (probe i of hash h1 at (h1 + i * h2) mod m, h2 = mix64(h1) | 1). In a filter above `BUCKETED_BYTES`
    they are placed a region at a time (`_insert_bucketed`): setting each probe's bit where it falls touched a
    random cache line and page per probe, and a 32 MiB filter of 7.8 M keys (k = 24) took 2.7-3.5 s on a 2-core
    AMD EPYC VM, against 1.3-1.5 s bucketed (BENCHMARKS.md, P10 overflow), the same bits."""
    n = hashes.shape[0]
    if m // 8 <= BUCKETED_BYTES or n == 0:
        _insert_each(bits, m, k, hashes)
        return
    batch, shift = min(n, INSERT_KEYS), _region_shift(m)
    _insert_bucketed(bits, m, k, hashes, shift, batch, np.empty(batch * k, np.uint64), np.empty(batch * k, np.uint64))


@kernel(nogil=True)
def _insert_each(bits: np.ndarray, m: int, k: int, hashes: np.ndarray) -> None:
    mm = np.uint64(m)
    for j in range(hashes.shape[0]):
        h1 = hashes[j]
        h2 = mix64(h1) | np.uint64(1)
        g = h1
        for _ in range(k):
            pos = g % mm
            bits[pos >> np.uint64(3)] |= np.uint8(1) << np.uint8(pos & np.uint64(7))
            g = g + h2


@kernel(nogil=True)
def _insert_bucketed(bits: np.ndarray, m: int, k: int, hashes: np.ndarray, shift: int, batch: int,
                     positions: np.ndarray, bucketed: np.ndarray) -> None:
    """`_insert` for `batch` keys at a time: their probe positions into `positions`, counted per region of
    2^`shift` bits, moved into `bucketed` region by region, then set in that order. (Two threads setting half the
    regions each, every position computed by both, were no faster than one: a 32 MiB filter of 7.8 M keys in
    1.4-1.9 s against 1.3-1.4 s in a Spark task.)"""
    mm = np.uint64(m)
    sh = np.uint64(shift)
    regions = (m >> shift) + 1
    counts = np.zeros(regions + 1, np.int64)
    for start in range(0, hashes.shape[0], batch):
        end = min(hashes.shape[0], start + batch)
        counts[:] = 0
        c = 0
        for j in range(start, end):
            h1 = hashes[j]
            h2 = mix64(h1) | np.uint64(1)
            g = h1
            for _ in range(k):
                pos = g % mm
                positions[c] = pos
                counts[np.int64(pos >> sh) + 1] += 1
                c += 1
                g = g + h2
        for r in range(1, regions + 1):
            counts[r] += counts[r - 1]
        for i in range(c):
            pos = positions[i]
            region = np.int64(pos >> sh)
            bucketed[counts[region]] = pos
            counts[region] += 1
        for i in range(c):
            pos = bucketed[i]
            bits[pos >> np.uint64(3)] |= np.uint8(1) << np.uint8(pos & np.uint64(7))


@kernel(nogil=True)
def _positives(bits: np.ndarray, m: int, k: int, hashes: np.ndarray) -> int:
    """How many of `hashes` test positive (every probe bit set)."""
    return int(_positive_mask(bits, m, k, hashes).sum())


@kernel(nogil=True)
def _positive_mask(bits: np.ndarray, m: int, k: int, hashes: np.ndarray) -> np.ndarray:
    mm = np.uint64(m)
    out = np.zeros(hashes.shape[0], np.bool_)
    for j in range(hashes.shape[0]):
        h1 = hashes[j]
        h2 = mix64(h1) | np.uint64(1)
        g = h1
        hit = True
        for _ in range(k):
            pos = g % mm
            if (bits[pos >> np.uint64(3)] >> np.uint8(pos & np.uint64(7))) & np.uint8(1) == 0:
                hit = False
                break
            g = g + h2
        out[j] = hit
    return out


@dataclass(frozen=True)
class KeyFilter:
    """A bloom filter over a segment's keys, with the segment facts of its header. Immutable once built."""

    m: int
    k: int
    n: int
    bits: np.ndarray  # uint8, m / 8 bytes
    facts: FilterFacts = FilterFacts()

    @classmethod
    def build(cls, hashes: np.ndarray, fpp: float, facts: FilterFacts = FilterFacts()) -> KeyFilter:
        """A filter holding `hashes` (uint64 XXH64 values, duplicates allowed), sized for its distinct count."""
        ordered = np.sort(np.asarray(hashes, dtype=np.uint64))  # the count needs only the sort, not np.unique
        n = int(ordered.size and 1 + np.count_nonzero(ordered[1:] != ordered[:-1]))
        m, k = filter_shape(n, fpp)
        bits = np.zeros(m // 8, np.uint8)
        _insert(bits, m, k, ordered)  # inserting a duplicate again changes nothing
        return cls(m, k, n, bits, facts)

    @classmethod
    def of_keys(cls, keys: pa.Array | pa.ChunkedArray, fpp: float, facts: FilterFacts = FilterFacts()) -> KeyFilter:
        """A filter holding every non-null key of a binary column."""
        return cls.build(key_hashes(keys), fpp, facts)

    def positives(self, hashes: np.ndarray) -> int:
        """How many of `hashes` the filter may hold (0 means: certainly none of them)."""
        if hashes.size == 0 or self.n == 0:
            return 0
        return int(_positives(self.bits, self.m, self.k, np.asarray(hashes, dtype=np.uint64)))

    def may_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash, whether the filter may hold it (False is certain)."""
        if self.n == 0:
            return np.zeros(len(hashes), np.bool_)
        return np.asarray(_positive_mask(self.bits, self.m, self.k, np.asarray(hashes, dtype=np.uint64)))

    def to_bytes(self) -> bytes:
        """The stored form (see the module docstring)."""
        flags = FLAG_TRANSACTIONAL if self.facts.transactional else 0
        head = _HEADER.pack(MAGIC, VERSION, HASH_XXH64_DOUBLE, self.k, self.m, self.n, self.facts.horizon_ms, flags)
        body = self.bits.tobytes()
        crc = _crc(head, body)
        return head + struct.pack(">I", crc) + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, obj: str = "<filter>") -> KeyFilter:
        """Parse a stored filter. Raises `FilterFormatError` naming `obj` and the byte position."""
        mv = memoryview(data)
        if len(mv) < HEADER_SIZE:
            raise FilterFormatError(f"{len(mv)} bytes, shorter than the {HEADER_SIZE}-byte header", obj=obj, position=0)
        magic, version, hash_id, k, m, n, horizon, flags = _HEADER.unpack_from(mv, 0)
        if magic != MAGIC:
            raise FilterFormatError(f"expected magic {MAGIC!r}, found {bytes(magic)!r}", obj=obj, position=MAGIC_OFFSET)
        if version != VERSION:
            raise FilterFormatError(f"expected version {VERSION}, found {version}", obj=obj, position=VERSION_OFFSET)
        if hash_id != HASH_XXH64_DOUBLE:
            raise FilterFormatError(f"expected hash {HASH_XXH64_DOUBLE}, found {hash_id}", obj=obj,
                                    position=HASH_OFFSET)
        if m < MIN_BITS or m % 64 or not 1 <= k <= MAX_K or len(mv) != HEADER_SIZE + m // 8:
            raise FilterFormatError(f"inconsistent shape: m={m} bits, k={k}, {len(mv)} bytes", obj=obj,
                                    position=K_OFFSET)
        (stored,) = struct.unpack_from(">I", mv, CRC_OFFSET)
        computed = _crc(mv[:CRC_OFFSET], mv[BITS_OFFSET:])
        if stored != computed:
            raise FilterFormatError(f"CRC-32C mismatch: stored {stored}, computed {computed}", obj=obj,
                                    position=CRC_OFFSET)
        bits = np.frombuffer(mv[BITS_OFFSET:], dtype=np.uint8).copy()
        return cls(m, k, n, bits, FilterFacts(horizon, bool(flags & FLAG_TRANSACTIONAL)))


def reference_filter(keys: Iterable[bytes], fpp: float, facts: FilterFacts = FilterFacts()) -> KeyFilter:
    """The readable path of `KeyFilter.of_keys`: the same bits, one Python key at a time."""
    hashes = sorted({reference_hash(key) for key in keys})
    m, k = filter_shape(len(hashes), fpp)
    bits = bytearray(m // 8)
    for h in hashes:
        for pos in reference_positions(h, k, m):
            bits[pos // 8] |= 1 << (pos % 8)
    return KeyFilter(m, k, len(hashes), np.frombuffer(bytes(bits), dtype=np.uint8).copy(), facts)


def reference_may_contain(f: KeyFilter, key: bytes) -> bool:
    """The readable path of `KeyFilter.may_contain` for one key."""
    raw = f.bits.tobytes()
    return f.n > 0 and all(raw[p // 8] >> (p % 8) & 1 for p in reference_positions(reference_hash(key), f.k, f.m))

