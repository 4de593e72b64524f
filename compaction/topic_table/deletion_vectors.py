"""Delta deletion vectors as kcompact writes and reads them (the Delta protocol's "Deletion Vector Format").

An update marks the rows of the keys it changes as deleted instead of rewriting the files that hold them. Every
Delta reader with the `deletionVectors` reader feature (delta-spark, delta-rs's `DeltaTable.scan` and `QueryBuilder`,
DuckDB's delta extension, Trino, Databricks) skips those rows.

- **A DV file** is `deletion_vector_<uuid>.bin` at the table's root. It starts with its format version, the byte 1.
  Each vector in it sits at its `offset`: the vector's size (4 bytes, big-endian), then the vector, then the
  vector's CRC-32 (4 bytes, big-endian).
- **A vector** is the magic 1681511377 (4 bytes, little-endian), then a `RoaringBitmapArray`: Roaring's portable
  serialization of 64-bit row positions (pyroaring's `BitMap64`, the C library's "portable" format).
- **A descriptor** (an `add`'s `deletionVector`) names the file by storage type `u` and the UUID in Z85
  (`pathOrInlineDv`), with the vector's `offset`, `sizeInBytes` and `cardinality` (rows deleted).
  - kcompact writes `u` only: delta-kernel-rs (DuckDB, delta-rs) reads no inline (`i`) vectors.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64

from compaction.errors import CorruptInputError

MAGIC = 1681511377
FORMAT_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
UUID_CHARS = 20
"""A UUID's 16 bytes in Z85: the last 20 characters of a `u` descriptor's `pathOrInlineDv`."""


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 (RFC 32), as Delta names a DV file's UUID; `data` is a multiple of 4 bytes long."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes multiples of 4 bytes, not {len(data)}")
    out: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(_Z85[digit])
        out.extend(reversed(digits))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes `z85_encode` made `text` of; ValueError for a length not a multiple of 5 or a foreign character."""
    if len(text) % 5:
        raise ValueError(f"Z85 text is a multiple of 5 characters long, not {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            if c not in _Z85_VALUE:
                raise ValueError(f"{c!r} is not a Z85 character")
            value = value * 85 + _Z85_VALUE[c]
        out += value.to_bytes(4, "big")
    return bytes(out)


@dataclass(frozen=True)
class DeletionVector:
    """A deletion vector's descriptor, as the Delta log holds it (an `add`'s or `remove`'s `deletionVector`)."""

    path_or_inline: str
    offset: int
    size: int
    cardinality: int
    storage_type: str = "u"

    @classmethod
    def from_json(cls, descriptor: Mapping[str, object]) -> DeletionVector:
        return cls(str(descriptor["pathOrInlineDv"]), int(str(descriptor.get("offset") or 0)),
                   int(str(descriptor["sizeInBytes"])), int(str(descriptor["cardinality"])),
                   str(descriptor["storageType"]))

    def to_json(self) -> dict[str, object]:
        return {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline, "offset": self.offset,
                "sizeInBytes": self.size, "cardinality": self.cardinality}

    @property
    def unique_id(self) -> str:
        """What, with a file's path, identifies the file in the log (Delta's `dvId`)."""
        return f"{self.storage_type}{self.path_or_inline}@{self.offset}"

    @property
    def file_name(self) -> str:
        """The DV file's path relative to the table (a `u` vector: an optional folder prefix, then the UUID)."""
        if self.storage_type != "u":
            raise CorruptInputError(f"deletion vector of storage type {self.storage_type!r}: kcompact reads the "
                                    "UUID-named kind (`u`) only; purge it (OPTIMIZE / REORG ... APPLY (PURGE))")
        prefix, encoded = self.path_or_inline[:-UUID_CHARS], self.path_or_inline[-UUID_CHARS:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name


def serialize(positions: Iterable[int] | np.ndarray) -> bytes:
    """The vector of the rows at `positions` (magic and bitmap, without the size and CRC around it in a file)."""
    bitmap = BitMap64(np.asarray(positions, np.uint64).tolist() if isinstance(positions, np.ndarray) else positions)
    bitmap.run_optimize()
    return struct.pack("<I", MAGIC) + bitmap.serialize()


def deserialize(data: bytes, *, obj: str, position: int) -> np.ndarray:
    """The sorted row positions of a vector (`serialize`'s bytes); `obj` and `position` locate it for errors."""
    if len(data) < 4 or struct.unpack_from("<I", data)[0] != MAGIC:
        raise CorruptInputError(f"deletion vector: expected the magic {MAGIC}, found {bytes(data[:4]).hex()}",
                                obj=obj, position=position)
    try:
        bitmap = BitMap64.deserialize(bytes(data[4:]))
    except (ValueError, OverflowError) as exc:
        raise CorruptInputError(f"deletion vector: not a Roaring bitmap ({exc})", obj=obj, position=position + 4) \
            from exc
    return np.fromiter(bitmap, np.uint64, len(bitmap))


class VectorFile:
    """One DV file being built: `add` appends a vector and returns its descriptor; `data` is the file's bytes."""

    def __init__(self) -> None:
        self.id = uuid.uuid4()
        self._parts = [bytes([FORMAT_VERSION])]
        self._size = 1

    @property
    def name(self) -> str:
        return f"deletion_vector_{self.id}.bin"

    def add(self, positions: np.ndarray) -> DeletionVector:
        vector = serialize(positions)
        offset = self._size
        self._parts += [struct.pack(">I", len(vector)), vector, struct.pack(">I", zlib.crc32(vector))]
        self._size += 8 + len(vector)
        return DeletionVector(z85_encode(self.id.bytes), offset, len(vector), len(positions))

    def __len__(self) -> int:
        return len(self._parts) // 3

    def data(self) -> bytes:
        return b"".join(self._parts)


def read_vector(data: bytes | memoryview, dv: DeletionVector, *, obj: str) -> np.ndarray:
    """The deleted row positions `dv` names in its file's bytes `data` (the whole file, named `obj` for errors).

    Raises:
        CorruptInputError: the file is short, of another format version, or the vector's size, CRC-32, magic,
            bitmap or cardinality do not match its descriptor.
    """
    if len(data) < 1 or data[0] != FORMAT_VERSION:
        raise CorruptInputError(f"deletion vector file: expected format version {FORMAT_VERSION}, found "
                                f"{data[0] if len(data) else 'an empty file'}", obj=obj, position=0)
    end = dv.offset + 8 + dv.size
    if len(data) < end:
        raise CorruptInputError(f"deletion vector of {dv.size} bytes at {dv.offset}: the file ends at {len(data)}",
                                obj=obj, position=len(data))
    (size,) = struct.unpack_from(">I", data, dv.offset)
    if size != dv.size:
        raise CorruptInputError(f"deletion vector: the descriptor says {dv.size} bytes, the file {size}", obj=obj,
                                position=dv.offset)
    vector = bytes(data[dv.offset + 4:dv.offset + 4 + size])
    (crc,) = struct.unpack_from(">I", data, dv.offset + 4 + size)
    if crc != zlib.crc32(vector):
        raise CorruptInputError(f"deletion vector: CRC-32 {crc:#010x} stored, {zlib.crc32(vector):#010x} computed",
                                obj=obj, position=dv.offset + 4 + size)
    positions = deserialize(vector, obj=obj, position=dv.offset + 4)
    if len(positions) != dv.cardinality:
        raise CorruptInputError(f"deletion vector: the descriptor says {dv.cardinality} rows, the vector holds "
                                f"{len(positions)}", obj=obj, position=dv.offset + 4)
    return positions


__all__ = ["DeletionVector", "VectorFile", "deserialize", "read_vector", "serialize", "z85_decode", "z85_encode"]
