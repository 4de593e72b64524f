"""compaction.metadata.small_parquet: the metadata table's data files, checked against pyarrow's reader and writer.

The files it writes must read back as exactly the rows given, with the Parquet schema pyarrow's writer gave the same
rows (the layout every reader of the table already read). Readers other than pyarrow (delta-rs, DuckDB, Spark) read
them in tests/integration/test_metadata_readers.py and tests/spark/test_batched_commits.py.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.metadata.delta_log import data_schema
from compaction.metadata.model import LEGACY_METADATA_SCHEMA, METADATA_SCHEMA
from compaction.metadata.small_parquet import CREATED_BY, encoder

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=40)  # any Unicode, the empty string included


def _value(t: pa.DataType, nullable: bool) -> st.SearchStrategy[Any]:
    if pa.types.is_list(t):
        struct = t.value_type
        element = st.fixed_dictionaries({f.name: _value(f.type, True) for f in struct})
        items = st.lists(st.one_of(st.none(), element), max_size=20)
        return st.one_of(st.none(), items)
    base = {pa.string(): TEXT, pa.int64(): INT64, pa.int32(): INT32, pa.bool_(): st.booleans()}[t]
    return st.one_of(st.none(), base) if nullable else base


def _rows(schema: pa.Schema) -> st.SearchStrategy[list[dict[str, Any]]]:
    row = st.fixed_dictionaries({f.name: _value(f.type, f.nullable) for f in schema})
    return st.lists(row, max_size=12)


def _pyarrow_file(rows: list[dict[str, Any]], schema: pa.Schema) -> bytes:
    """What the table's data files were before this encoder: pyarrow's writer with the same options."""
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out, compression="none", store_schema=False,
                   write_statistics=False, use_dictionary=False)
    return out.getvalue()


SCHEMAS = {"current": data_schema(METADATA_SCHEMA), "legacy": data_schema(LEGACY_METADATA_SCHEMA)}


@pytest.mark.parametrize("name", list(SCHEMAS))
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_file_reads_back_as_its_rows_with_pyarrows_schema(name: str, data: st.DataObject) -> None:
    schema = SCHEMAS[name]
    rows = data.draw(_rows(schema))
    body = encoder(schema).encode(rows)
    assert body[:4] == body[-4:] == b"PAR1"
    got = pq.read_table(io.BytesIO(body))
    assert got.schema.equals(schema)
    assert got.to_pylist() == pa.Table.from_pylist(rows, schema=schema).to_pylist()
    ours, theirs = pq.ParquetFile(io.BytesIO(body)), pq.ParquetFile(io.BytesIO(_pyarrow_file(rows, schema)))
    assert ours.schema.equals(theirs.schema)
    meta = ours.metadata
    assert (meta.num_rows, meta.num_row_groups, meta.created_by) == (len(rows), 1, CREATED_BY)
    for i in range(meta.num_columns):  # each column chunk as pyarrow's: one PLAIN page, no dictionary, no stats
        ours_col, theirs_col = meta.row_group(0).column(i), theirs.metadata.row_group(0).column(i)
        assert ours_col.path_in_schema == theirs_col.path_in_schema
        assert ours_col.num_values == theirs_col.num_values
        assert (ours_col.compression, ours_col.has_dictionary_page, ours_col.is_stats_set) == ("UNCOMPRESSED", False,
                                                                                               False)


def test_extra_keys_are_ignored_and_a_missing_optional_column_is_null() -> None:
    schema = pa.schema([pa.field("a", pa.string(), nullable=False), pa.field("b", pa.int64())])
    got = pq.read_table(io.BytesIO(encoder(schema).encode([{"a": "x", "topic": "t"}, {"a": "é", "b": -5}])))
    assert got.to_pylist() == [{"a": "x", "b": None}, {"a": "é", "b": -5}]


def test_long_runs_and_large_values_round_trip() -> None:
    """Levels and footer integers past one varint byte: 5,000 rows, offsets beyond 16 KiB."""
    schema = SCHEMAS["current"]
    rows = [{f.name: None for f in schema} | {"row_kind": "segment", "topic_id": "t" * 22, "writer": "w" * 100,
                                              "fencing_epoch": 2**62, "start_offset": i if i % 3 else None,
                                              "object_keys": [{"suffix": "log", "key": "k" * 90}] * (i % 4)}
            for i in range(5_000)]
    got = pq.read_table(io.BytesIO(encoder(schema).encode(rows)))
    assert got.to_pylist() == pa.Table.from_pylist(rows, schema=schema).to_pylist()


@pytest.mark.parametrize("field", [pa.field("f", pa.float64()), pa.field("f", pa.list_(pa.int64())),
                                   pa.field("f", pa.list_(pa.struct([pa.field("x", pa.int64(), nullable=False)])))])
def test_a_type_it_does_not_write_is_refused_when_the_encoder_is_built(field: pa.Field) -> None:
    with pytest.raises(ValueError, match="small_parquet"):
        encoder(pa.schema([field]))


def test_a_null_in_a_required_column_is_refused() -> None:
    schema = pa.schema([pa.field("a", pa.string(), nullable=False)])
    with pytest.raises(ValueError, match="column a is not nullable"):
        encoder(schema).encode([{"a": None}])
