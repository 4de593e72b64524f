"""A Parquet encoder for the metadata table's small data files: one row group, one PLAIN data page a column.

A commit writes one data file per partition it touches (a few rows each: the partition row and its segments'), so a
commit of 1,000 partitions encodes 1,000 files. pyarrow's writer sets up a writer, a page writer per column and its
encoders for each file: ~0.5 ms of CPU for 2 rows, nearly all of it setup, so at 1,000 partitions the encodes were
most of a batched commit's time (BENCHMARKS.md, "P11"). This encoder writes the same layout pyarrow wrote for these
files with `compression="none", use_dictionary=False, write_statistics=False, store_schema=False`: the same Parquet
schema (`pq.ParquetFile(...).schema` of both is equal), a data page v1 per column chunk, PLAIN values, RLE
definition and repetition levels, no statistics, no dictionary, no compression, no key-value metadata. It encodes
from the rows' Python values, without building an Arrow table per file.

It takes an Arrow schema of what the metadata table holds and nothing else: top-level `string`, `int32`, `int64` and
`bool` columns, nullable or not, and nullable `list<element: struct<...>>` columns whose struct fields are nullable
columns of those types (`compaction.metadata.model.METADATA_SCHEMA`); `encoder()` raises `ValueError` for any other
(a new column of another type needs its encoding here first). Its output is checked against pyarrow's reader and
writer in `tests/unit/test_small_parquet.py`, and every reader of the table (delta-rs, Spark, pyarrow) reads it in the
integration and Spark tests. The format is Apache Parquet's (`parquet.thrift`): the footer is Thrift's compact
protocol.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

MAGIC = b"PAR1"
CREATED_BY = "kcompact small_parquet"

# parquet.thrift enums
_BOOLEAN, _INT32, _INT64, _BYTE_ARRAY = 0, 1, 2, 6
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_UTF8, _LIST = 0, 3
_PLAIN, _RLE = 0, 3
_DATA_PAGE = 0
# Thrift compact protocol field types
_T_I32, _T_I64, _T_BINARY, _T_LIST, _T_STRUCT = 5, 6, 8, 9, 12


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(n) for n in range(1 << 14)]


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    return _SMALL[z] if z < 16384 else _varint(z)


class _Struct:
    """A Thrift compact-protocol struct being written: fields in ascending id order, then `end()`."""

    __slots__ = ("last", "out")

    def __init__(self) -> None:
        self.out = bytearray()
        self.last = 0

    def _header(self, fid: int, ftype: int) -> None:
        delta = fid - self.last
        if 0 < delta <= 15:
            self.out.append((delta << 4) | ftype)
        else:
            self.out.append(ftype)
            self.out += _zigzag(fid)
        self.last = fid

    def i32(self, fid: int, v: int) -> _Struct:
        self._header(fid, _T_I32)
        self.out += _zigzag(v)
        return self

    def i64(self, fid: int, v: int) -> _Struct:
        self._header(fid, _T_I64)
        self.out += _zigzag(v)
        return self

    def binary(self, fid: int, v: bytes) -> _Struct:
        self._header(fid, _T_BINARY)
        self.out += _varint(len(v)) + v
        return self

    def struct(self, fid: int, encoded: bytes) -> _Struct:
        """A nested struct field, already encoded (with its stop byte)."""
        self._header(fid, _T_STRUCT)
        self.out += encoded
        return self

    def list(self, fid: int, elem_type: int, items: Sequence[bytes]) -> _Struct:
        """A list field of `items`, each already encoded as `elem_type` (a struct's with its stop byte)."""
        self._header(fid, _T_LIST)
        n = len(items)
        self.out += bytes([(n << 4) | elem_type]) if n < 15 else bytes([0xF0 | elem_type]) + _varint(n)
        for item in items:
            self.out += item
        return self

    def end(self) -> bytes:
        self.out.append(0)
        return bytes(self.out)


def _rle_levels(levels: Sequence[int], bit_width: int) -> bytes:
    """`levels` in the RLE / bit-packing hybrid as RLE runs only, with the 4-byte length a v1 data page puts first."""
    width = (bit_width + 7) // 8
    out = bytearray()
    i, n = 0, len(levels)
    while i < n:
        v = levels[i]
        j = i + 1
        while j < n and levels[j] == v:
            j += 1
        out += _varint((j - i) << 1)
        out += v.to_bytes(width, "little")
        i = j
    return struct.pack("<i", len(out)) + out


def _plain(kind: str, values: Sequence[Any]) -> bytes:
    """The PLAIN encoding of the non-null `values` of a column of `kind`."""
    if kind == "int64":
        return struct.pack(f"<{len(values)}q", *values)
    if kind == "int32":
        return struct.pack(f"<{len(values)}i", *values)
    if kind == "string":
        out = bytearray()
        for v in values:
            b = v.encode()
            out += struct.pack("<i", len(b))
            out += b
        return bytes(out)
    # bool: bit-packed, least significant bit first
    out = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


_KINDS = {pa.string(): ("string", _BYTE_ARRAY), pa.int64(): ("int64", _INT64), pa.int32(): ("int32", _INT32),
          pa.bool_(): ("bool", _BOOLEAN)}


def _primitive(t: pa.DataType, where: str) -> tuple[str, int]:
    kind = _KINDS.get(t)
    if kind is None:
        raise ValueError(f"small_parquet: column {where} has type {t}, which this encoder does not write")
    return kind


def _schema_element(name: str, repetition: int | None, physical: int | None = None, children: int | None = None,
                    converted: int | None = None, logical: int | None = None) -> bytes:
    s = _Struct()
    if physical is not None:
        s.i32(1, physical)
    if repetition is not None:
        s.i32(3, repetition)
    s.binary(4, name.encode())
    if children is not None:
        s.i32(5, children)
    if converted is not None:
        s.i32(6, converted)
    if logical is not None:  # LogicalType union: field 1 STRING, field 3 LIST, each an empty struct
        s.struct(10, _Struct().struct(logical, b"\x00").end())
    return s.end()


class _Leaf:
    """One column chunk to write: its path, physical type, and how to get its levels and values from the rows."""

    __slots__ = ("fill", "kind", "meta_prefix", "path", "physical")

    def __init__(self, path: tuple[str, ...], physical: int, kind: str,
                 fill: Callable[[Sequence[Mapping[str, Any]]], tuple[list[int] | None, list[int] | None, list[Any]]]
                 ) -> None:
        self.path, self.physical, self.kind, self.fill = path, physical, kind, fill
        # ColumnMetaData's fields before num_values: type, encodings, path_in_schema, codec (UNCOMPRESSED)
        m = _Struct().i32(1, physical)
        m.list(2, _T_I32, [_zigzag(_PLAIN), _zigzag(_RLE)])
        m.list(3, _T_BINARY, [_varint(len(p.encode())) + p.encode() for p in path])
        m.i32(4, 0)
        self.meta_prefix = bytes(m.out)


def _top_fill(name: str, nullable: bool) -> Callable[..., tuple[list[int] | None, list[int] | None, list[Any]]]:
    if not nullable:
        def required(rows: Sequence[Mapping[str, Any]]) -> tuple[None, None, list[Any]]:
            values = [r[name] for r in rows]
            if None in values:
                raise ValueError(f"small_parquet: column {name} is not nullable, and a row has it null")
            return None, None, values
        return required

    def optional(rows: Sequence[Mapping[str, Any]]) -> tuple[None, list[int], list[Any]]:
        values = [r.get(name) for r in rows]
        return None, [0 if v is None else 1 for v in values], [v for v in values if v is not None]
    return optional


def _list_fill(name: str, field: str) -> Callable[..., tuple[list[int], list[int], list[Any]]]:
    """Levels of `name.list.element.field` (optional list, repeated group, optional element, optional field):
    definition 0 a null list, 1 an empty one, 2 a null element, 3 a null field, 4 a value."""

    def fill(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int], list[Any]]:
        reps: list[int] = []
        defs: list[int] = []
        values: list[Any] = []
        for r in rows:
            items = r.get(name)
            if not items:
                reps.append(0)
                defs.append(0 if items is None else 1)
                continue
            rep = 0
            for item in items:
                reps.append(rep)
                rep = 1
                if item is None:
                    defs.append(2)
                    continue
                v = item.get(field)
                if v is None:
                    defs.append(3)
                else:
                    defs.append(4)
                    values.append(v)
        return reps, defs, values
    return fill


class Encoder:
    """Encodes lists of rows (dicts keyed by column name) of one Arrow schema as Parquet files (module docstring)."""

    def __init__(self, schema: pa.Schema) -> None:
        elements: list[bytes] = [_schema_element("schema", _REQUIRED, children=len(schema))]
        leaves: list[_Leaf] = []
        for f in schema:
            rep = _OPTIONAL if f.nullable else _REQUIRED
            if pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type):
                if not f.nullable:
                    raise ValueError(f"small_parquet: list column {f.name} must be nullable")
                element = f.type.value_field
                struct_type = element.type
                if not element.nullable or any(not c.nullable for c in struct_type):
                    raise ValueError(f"small_parquet: list column {f.name}'s element and fields must be nullable")
                elements.append(_schema_element(f.name, _OPTIONAL, children=1, converted=_LIST, logical=3))
                elements.append(_schema_element("list", _REPEATED, children=1))
                elements.append(_schema_element(element.name, _OPTIONAL, children=struct_type.num_fields))
                for c in struct_type:
                    kind, physical = _primitive(c.type, f"{f.name}.{c.name}")
                    elements.append(_schema_element(c.name, _OPTIONAL, physical,
                                                    converted=_UTF8 if kind == "string" else None,
                                                    logical=1 if kind == "string" else None))
                    leaves.append(_Leaf((f.name, "list", element.name, c.name), physical, kind,
                                        _list_fill(f.name, c.name)))
            else:
                kind, physical = _primitive(f.type, f.name)
                elements.append(_schema_element(f.name, rep, physical, converted=_UTF8 if kind == "string" else None,
                                                logical=1 if kind == "string" else None))
                leaves.append(_Leaf((f.name,), physical, kind, _top_fill(f.name, f.nullable)))
        self.leaves = leaves
        # FileMetaData's schema field, encoded once: the version (1) comes first
        head = _Struct().i32(1, 1)
        head.list(2, _T_STRUCT, elements)
        self._footer_head = bytes(head.out)

    def encode(self, rows: Sequence[Mapping[str, Any]]) -> bytes:
        """The Parquet file of `rows`, in order."""
        out = bytearray(MAGIC)
        chunks: list[bytes] = []
        total = 0
        zz = _zigzag
        for leaf in self.leaves:
            reps, defs, values = leaf.fill(rows)
            body = bytearray()
            if reps is not None:
                body += _rle_levels(reps, 1)
            if defs is not None:
                body += _rle_levels(defs, 3 if reps is not None else 1)
            body += _plain(leaf.kind, values)
            num_values = len(defs) if defs is not None else len(values)
            n, nv = zz(len(body)), zz(num_values)
            # PageHeader {1: DATA_PAGE, 2: size, 3: size, 5: DataPageHeader {1: num_values, 2: PLAIN, 3: RLE,
            # 4: RLE}}, in the compact protocol's bytes
            header = b"\x15\x00\x15" + n + b"\x15" + n + b"\x2c\x15" + nv + b"\x15\x00\x15\x06\x15\x06\x00\x00"
            offset = len(out)
            out += header
            out += body
            size = len(header) + len(body)
            total += size
            s = zz(size)
            # ColumnChunk {2: file_offset 0, 3: ColumnMetaData {1-4: leaf.meta_prefix, 5: num_values,
            # 6: uncompressed size, 7: compressed size, 9: data_page_offset}}
            chunks.append(b"\x26\x00\x1c" + leaf.meta_prefix + b"\x16" + nv + b"\x16" + s + b"\x16" + s
                          + b"\x26" + zz(offset) + b"\x00\x00")
        footer = _Struct()
        footer.out += self._footer_head
        footer.last = 2
        footer.i64(3, len(rows))
        footer.list(4, _T_STRUCT, [_Struct().list(1, _T_STRUCT, chunks).i64(2, total).i64(3, len(rows)).end()])
        footer.binary(6, CREATED_BY.encode())
        encoded = footer.end()
        out += encoded
        out += struct.pack("<i", len(encoded))
        out += MAGIC
        return bytes(out)


_ENCODERS: dict[pa.Schema, Encoder] = {}


def encoder(schema: pa.Schema) -> Encoder:
    """The encoder of `schema`, built once a process (module docstring: the schemas it takes)."""
    enc = _ENCODERS.get(schema)
    if enc is None:
        enc = _ENCODERS[schema] = Encoder(schema)
    return enc


__all__ = ["CREATED_BY", "Encoder", "encoder"]
