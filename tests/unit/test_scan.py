"""The numba columnar scan against the reference decoder, and segment-level corruption."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.errors import (
    CorruptBatchError,
    CorruptInputError,
    CrcMismatchError,
    InvalidMagicError,
    TruncatedSegmentError,
)
from compaction.format import scan as scan_module
from compaction.format.batch import TimestampType, encode_batch
from compaction.format.scan import batch_fields, headers_of, scan_ranges, scan_segment
from compaction.format.scan_kernels import RECORD_HEADER_POS, RECORD_KEY_POS, RECORD_VALUE_POS
from compaction.format.segment import iter_batch_headers, iter_batches, write_segment
from tests.unit.random_batches import any_batches

HEADER = "h"


def reference_rows(data: bytes) -> list[tuple]:
    rows = []
    for pos, batch in iter_batches(data):
        for r in batch.records:
            hv = None
            for h in r.headers:
                if h.key == HEADER:
                    hv = h.value
            rows.append(
                (
                    r.offset,
                    r.timestamp,
                    r.key,
                    r.value is None,
                    len(r.value or b""),
                    hv,
                    r.value,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_offset,
                    batch.last_offset,
                    pos,
                    batch.partition_leader_epoch,
                    batch.is_transactional,
                    batch.is_control,
                    int(batch.codec),
                    -1 if batch.delete_horizon_ms is None else batch.delete_horizon_ms,
                )
            )
    return rows


def scan_rows(data: bytes) -> list[tuple]:
    t = scan_segment(data, header_key=HEADER, with_values=True).records.to_pydict()
    cols = [
        "offset",
        "timestamp",
        "key",
        "value_is_null",
        "value_size",
        "header_value",
        "value",
        "producer_id",
        "producer_epoch",
        "batch_base_offset",
        "batch_last_offset",
        "batch_position",
        "partition_leader_epoch",
        "transactional",
        "control",
        "codec",
        "delete_horizon_ms",
    ]
    return list(zip(*(t[c] for c in cols), strict=True))


def segment_of(batches: list) -> bytes:
    return b"".join(encode_batch(b) for b in batches)


@given(st.lists(any_batches, min_size=0, max_size=6))
def test_scan_matches_reference_decoder(batches: list) -> None:
    data = segment_of(batches)
    assert scan_rows(data) == reference_rows(data)


@given(st.lists(any_batches, min_size=0, max_size=6), st.integers(0, 2**16), st.integers(0, 255))
def test_batch_headers_are_the_reference_headers(batches: list, at: int, xor: int) -> None:
    """`headers_of(batch_fields(...))` (the kernel's walk) gives `iter_batch_headers`'s headers, or the same
    error, on a segment with one byte changed (a header field, a section byte, or nothing: xor 0). The walk also
    refuses a negative record count, which only decoding the batch finds: then the decoder's error, naming the
    object."""
    data = bytearray(segment_of(batches))
    if data:
        data[at % len(data)] ^= xor

    def headers(read: object) -> object:
        try:
            return read()  # type: ignore[operator]
        except CorruptInputError as exc:
            return type(exc), exc.obj, exc.position
    reference = headers(lambda: list(iter_batch_headers(bytes(data), obj="seg.log")))
    walked = headers(lambda: headers_of(batch_fields(bytes(data), obj="seg.log")))
    if isinstance(reference, list) and isinstance(walked, tuple):
        assert walked[1] == "seg.log" and any(h.records_count < 0 for h in reference)
    else:
        assert walked == reference


@given(st.lists(any_batches, min_size=1, max_size=8), st.sampled_from([1, 40, 300, 2000]), st.integers(0, 2**16),
       st.integers(0, 255))
def test_a_scan_by_windows_of_batches_is_the_scan_of_the_whole(batches: list, window: int, at: int, xor: int
                                                               ) -> None:
    """Compressed batches are decompressed and decoded a window of batches at a time, into one reused buffer
    (`scan._windows`): any window size gives the rows, record ranges and errors of one window holding the whole
    segment, on a segment with one byte changed too (CRCs not checked, so that the change reaches the decoders)."""
    data = bytearray(segment_of(batches))
    data[at % len(data)] ^= xor

    def scanned() -> object:
        try:
            rows = scan_segment(bytes(data), obj="seg.log", header_key=HEADER, with_values=True,
                                verify_crc=False).records
            ranges, fields = scan_ranges(bytes(data), obj="seg.log", verify_crc=False)
        except CorruptInputError as exc:
            return type(exc), exc.obj, exc.position, str(exc)
        # positions point into the buffer each window decoded from, which the caller never sees
        return rows, np.delete(ranges, [RECORD_KEY_POS, RECORD_VALUE_POS, RECORD_HEADER_POS], axis=0).tolist(), \
            fields.tolist()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scan_module, "WINDOW_DECOMPRESSED_BYTES", 1 << 40)
        whole = scanned()
        patch.setattr(scan_module, "WINDOW_DECOMPRESSED_BYTES", window)
        assert scanned() == whole


def test_scan_handles_log_append_time_and_null_header_values() -> None:
    from compaction.format.batch import Header, Record, build_batch

    recs = [
        Record(5, 1, b"k", b"v", (Header(HEADER, None),)),
        Record(6, 2, None, None, (Header(HEADER, b"x"),)),
    ]
    data = encode_batch(build_batch(recs, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=77))
    rows = scan_segment(data, header_key=HEADER).records.to_pydict()
    assert rows["timestamp"] == [77, 77]
    assert rows["header_value"] == [None, b"x"]
    assert rows["key"] == [b"k", None]


def golden_segment(n: int = 3) -> bytes:
    from compaction.format.batch import Record, build_batch

    return b"".join(
        encode_batch(
            build_batch([Record(2 * i, 1000 + i, b"k%d" % i, b"v" * 30), Record(2 * i + 1, 1000, b"x", None)])
        )
        for i in range(n)
    )


def test_truncated_segment_names_file_and_batch_start() -> None:
    data = golden_segment()
    size = next(iter_batch_headers(data)).size
    with pytest.raises(TruncatedSegmentError) as err:
        scan_segment(data[: 2 * size + 20], obj="t-0/00000000000000000000.log")
    assert err.value.obj == "t-0/00000000000000000000.log"
    assert err.value.position == 2 * size


def test_crc_error_in_second_batch_names_its_crc_field() -> None:
    data = bytearray(golden_segment())
    size = next(iter_batch_headers(data)).size
    data[size + 70] ^= 0xFF
    with pytest.raises(CrcMismatchError) as err:
        scan_segment(bytes(data), obj="seg.log")
    assert (err.value.obj, err.value.position) == ("seg.log", size + 17)
    assert f"seg.log, byte {size + 17}" in str(err.value)


def test_bad_magic_and_small_length_are_reported() -> None:
    data = bytearray(golden_segment())
    data[16] = 0x7F
    with pytest.raises(InvalidMagicError) as err:
        scan_segment(bytes(data), obj="seg.log")
    assert err.value.position == 16
    data = bytearray(golden_segment())
    struct.pack_into(">i", data, 8, 3)
    with pytest.raises(CorruptBatchError, match="minimum record overhead") as err2:
        scan_segment(bytes(data), obj="seg.log")
    assert err2.value.position == 8


def test_records_overrun_reported_by_reference_path() -> None:
    data = bytearray(golden_segment())
    struct.pack_into(">i", data, 57, 5)
    with pytest.raises(CorruptBatchError) as err:
        scan_segment(bytes(data), obj="seg.log", verify_crc=False)
    assert err.value.obj == "seg.log"


def test_write_segment_is_atomic_and_copies_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = golden_segment()
    chunks = [data[h.position : h.position + h.size] for h in iter_batch_headers(data)]
    path = tmp_path / "00000000000000000000.log"
    assert write_segment(path, chunks) == len(data)
    assert path.read_bytes() == data
    assert not list(tmp_path.glob("*.tmp"))


def test_every_buffer_shape_reaches_the_kernels_as_one_numba_type() -> None:
    """numba compiles a kernel once per argument type, and a writable array is another type than a read-only one:
    a segment in `bytes`, in a `bytearray` or in the run cache's numpy buffer, compressed or not, is scanned by the
    same compiled kernels (a warmed-up executor never compiles during a run)."""
    import numpy as np

    from compaction.format import scan_kernels
    from compaction.format.batch import Record, build_batch
    from compaction.format.codecs import Codec

    segments = [encode_batch(build_batch([Record(0, 0, b"k", b"v", ()), Record(1, 0, b"j", None, ())], codec=c))
                for c in (Codec.NONE, Codec.LZ4)]
    kernels = (scan_kernels.walk_batches, scan_kernels.decode_record_ranges, scan_kernels.gather_ranges)
    scan_segment(segments[0])  # uncompressed, in bytes
    compiled = [len(k.signatures) for k in kernels]
    for data in segments:
        buffer = np.empty(len(data), np.uint8)
        buffer[:] = np.frombuffer(data, np.uint8)
        for shape in (data, bytearray(data), memoryview(buffer.data)):
            assert scan_segment(shape).records.equals(scan_segment(data).records)
    assert [len(k.signatures) for k in kernels] == compiled


def test_compressed_sections_larger_than_the_first_guess_grow_the_side_buffer() -> None:
    """Sections decompress into one buffer sized from the compressed bytes (`codecs.FIRST_RATIO_GUESS` times them);
    values that compress far better (here ~1,000x) outgrow it, and the buffer grows with every byte kept."""
    from compaction.format.batch import Record, build_batch
    from compaction.format.codecs import FIRST_RATIO_GUESS, Codec

    batches = [build_batch([Record(200 * b + i, 1000, b"k%d" % i, bytes(20_000) if b != 1 else b"v%d" % i)
                            for i in range(200)], codec=codec)
               for b, codec in enumerate((Codec.ZSTD, Codec.LZ4, Codec.ZSTD, Codec.GZIP))]
    data = segment_of(batches)
    assert len(data) * FIRST_RATIO_GUESS < 3 * 200 * 20_000  # the guess is far too small
    assert scan_rows(data) == reference_rows(data)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_section_that_does_not_decompress_names_its_codec_and_position(codec: str) -> None:
    from compaction.format.batch import RECORDS_OFFSET, Record, build_batch, frame_batch
    from compaction.format.codecs import Codec

    good = encode_batch(build_batch([Record(0, 1000, b"k", b"v" * 50)], codec=Codec.ZSTD))
    bad = build_batch([Record(1, 1000, b"k", b"v")], codec=Codec[codec.upper()])
    framed = frame_batch(b"\x00\x01not a compressed frame" * 4, base_offset=1, partition_leader_epoch=0,
                         attributes=bad.attributes, last_offset_delta=0, base_timestamp=1000, max_timestamp=1000,
                         producer_id=-1, producer_epoch=-1, base_sequence=-1, records_count=1)
    with pytest.raises(CorruptBatchError, match=f"cannot decompress {codec} records") as err:
        scan_segment(good + framed, obj="seg.log")
    assert (err.value.obj, err.value.position) == ("seg.log", len(good) + RECORDS_OFFSET)
