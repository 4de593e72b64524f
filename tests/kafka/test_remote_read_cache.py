"""The storage manager's chunk cache on an s3:// store (the moto server on 127.0.0.1): segments read through
`fetchLogSegment` at successive positions, as the broker reads them one consumer fetch at a time, one segment after
another, have each of their bytes fetched from the store once, and readers that want more than the cache holds never
push it above its configured size.

`RemoteReadCheck.java` (beside this file, run as a single source file on the built plugin jar) drives the storage
manager through its public surface and counts with its own KIP-877 metrics: `store-gets-total` and
`store-get-bytes-total` are the ranged GETs its store process was asked for, `chunk-cache-peak-bytes` the most the
cache ever held (chunks in flight counted at their full size), and a thread samples `chunk-cache-bytes` meanwhile.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from tests.kafka_runtime import run_tool
from tests.moto_s3 import BUCKET

pytestmark = pytest.mark.s3
CHECK = Path(__file__).with_name("RemoteReadCheck.java")
CHUNK = 256 * 1024
CACHE = 4 * CHUNK
SEGMENT = 3 * 1024 * 1024 + 12345  # not a whole number of chunks: 13 of them
FETCH = 100_000  # a fetch's bytes: max.partition.fetch.bytes in small
OVERLAP = 60_000  # each fetch starts at the batch the last one could not send whole, often back in the last chunk
SEQUENTIAL = 3  # segments read one after another: the cache fills with the chunks behind the reader
READERS = 4  # concurrent readers of their own segments: each wants 3 chunks, 12 in all, for a cache of 4


@pytest.mark.usefixtures("fake_aws_env")
def test_a_sequential_read_fetches_each_byte_once_and_the_cache_stays_within_its_bound(
        kafka_runtime: str, moto_endpoint: str, tmp_path: Path) -> None:
    store = f"s3://{BUCKET}/read-cache-{uuid.uuid4().hex[:12]}"
    done = run_tool(str(CHECK), [
        f"rsm.kcompact.store={store}", f"rsm.kcompact.endpoint.url={moto_endpoint}",
        f"rsm.kcompact.python={sys.executable}", f"rsm.kcompact.fetch.chunk.bytes={CHUNK}",
        f"rsm.kcompact.fetch.cache.bytes={CACHE}", "rsm.kcompact.fetch.prefetch.chunks=2",
        f"segments={SEQUENTIAL + READERS}", f"sequential={SEQUENTIAL}", f"segment={SEGMENT}", f"fetch={FETCH}",
        f"overlap={OVERLAP}", f"dir={tmp_path}"], jars=["tiered-plugin"], logs_dir=tmp_path, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    sizes, sequential, concurrent = result["sizes"], result["sequential"], result["concurrent"]

    read_in_turn = sizes[:SEQUENTIAL]
    chunks = sum(-(-size // CHUNK) for size in read_in_turn)
    indexes = SEQUENTIAL * (8 + 12)  # an offset and a time index entry each: no transaction index, none fetched
    assert sequential["served"] > 2 * sum(read_in_turn), "successive fetches overlap, as the broker's do"
    assert sequential["fetched"] == sum(read_in_turn) + indexes, f"each byte of the segments fetched once: {sequential}"
    assert sequential["gets"] == chunks + 2 * SEQUENTIAL, "one GET per chunk and per index"
    assert sequential["prefetches"] == chunks - 1 + SEQUENTIAL, (
        "every chunk but the first segment's first fetched ahead (a segment's first while the reader is in the last "
        "chunk of the one before, found by listing the partition), and each time index")
    assert 1 <= sequential["lists"] <= 2, "the partition listed once, and again for the segment after the last"
    assert sequential["peak"] <= CACHE

    assert concurrent["peak"] <= CACHE, f"the cache held {concurrent['peak']} bytes, above its {CACHE}"
    assert 0 < concurrent["sampled_max"] <= CACHE
    # Too small a cache costs refetches (here each reader's chunks go before its next fetch comes back to them), but
    # no more than a chunk per fetch, as without the cache.
    needed = sum(sizes[SEQUENTIAL:])
    assert needed <= concurrent["fetched"] <= concurrent["served"] / FETCH * CHUNK, concurrent
