"""A Kafka log dir written by an independent codec (kafka-python), for `make bench`'s second P2 shape.

`kcompact generate` and the scan share kcompact's own batch code: a benchmark on its output cannot catch a
shape that code never produces. This writer builds every record batch with kafka-python's
`DefaultRecordBatchBuilder` (its own varints, header layout and CRC-32C) and lays the batches out as a
broker's log dir holds them: `<topic>-<n>/` with `partition.metadata`, `leader-epoch-checkpoint`, rolled
`<base offset>.log` segments of at most `--segment-bytes`, an empty producer snapshot at every roll (the
producers are plain, non-idempotent ones: producer id -1, as kafka-python's default producer writes) and an
empty active segment, so that `kcompact tier` uploads every record. No `.index`/`.timeindex` files: the tier
rebuilds them, as Kafka does on load.

The builder writes base offset 0 and partition leader epoch -1 (the broker assigns both on append); both lie
before the CRC-covered bytes (attributes onwards), so they are set here without touching the CRC.

    python scripts/kafka_workload.py --logdir DIR --topic t --partitions 2 --records 4000000 --keys 1000000 \
        --key-bytes 16 --value-bytes 100 --records-per-batch 200 --segment-bytes 67108864 --seed 13

Keys are drawn uniformly at random from `--keys` distinct ids per partition; values are random bytes
(uncompressible; batches are uncompressed). Timestamps start at 1.7e12 ms, one millisecond per offset.
"""

from __future__ import annotations

import argparse
import base64
import os
import struct
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

BASE_OFFSET_OFFSET = 0  # int64, outside the CRC
PARTITION_LEADER_EPOCH_OFFSET = 12  # int32 after baseOffset and batchLength, outside the CRC
FIRST_TIMESTAMP_MS = 1_700_000_000_000


def empty_producer_snapshot() -> bytes:
    """Kafka's producer snapshot (version 1) with no producer: version int16 | crc uint32 | count int32."""
    body = struct.pack(">i", 0)
    return struct.pack(">hI", 1, crc32c(body)) + body


def kafka_batch(base_offset: int, keys: list[bytes], value_bytes: int) -> bytes:
    """One uncompressed v2 batch built by kafka-python, placed at `base_offset` in leader epoch 0."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=2**30)
    values = os.urandom(value_bytes * len(keys))
    for i, key in enumerate(keys):
        builder.append(i, timestamp=FIRST_TIMESTAMP_MS + base_offset + i, key=key,
                       value=values[i * value_bytes:(i + 1) * value_bytes], headers=[])
    batch = builder.build()
    struct.pack_into(">q", batch, BASE_OFFSET_OFFSET, base_offset)
    struct.pack_into(">i", batch, PARTITION_LEADER_EPOCH_OFFSET, 0)
    return bytes(batch)


def write_partition(directory: Path, args: argparse.Namespace, rng: np.random.Generator) -> int:
    """One partition's segments; returns the bytes of its .log files."""
    directory.mkdir(parents=True, exist_ok=True)
    topic_id = base64.urlsafe_b64encode(uuid.UUID(int=int(rng.integers(1, 2**63))).bytes).rstrip(b"=").decode()
    (directory / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
    (directory / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    ids = rng.integers(0, args.keys, size=args.records)
    width = args.key_bytes - 4
    base, offset, written = 0, 0, 0
    log = (directory / f"{base:020d}.log").open("wb")
    size = 0
    while offset < args.records:
        n = min(args.records_per_batch, args.records - offset)
        keys = [b"key-" + str(k).zfill(width).encode() for k in ids[offset:offset + n].tolist()]
        batch = kafka_batch(offset, keys, args.value_bytes)
        if size and size + len(batch) > args.segment_bytes:  # roll, as the broker does before an append
            log.close()
            base, size = offset, 0
            (directory / f"{base:020d}.snapshot").write_bytes(empty_producer_snapshot())
            log = (directory / f"{base:020d}.log").open("wb")
        log.write(batch)
        size += len(batch)
        written += len(batch)
        offset += n
    log.close()
    (directory / f"{offset:020d}.snapshot").write_bytes(empty_producer_snapshot())
    (directory / f"{offset:020d}.log").write_bytes(b"")  # the active segment: every record above is rolled
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", type=Path, required=True)
    parser.add_argument("--topic", default="kp")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--records", type=int, default=4_000_000, help="per partition")
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys per partition")
    parser.add_argument("--key-bytes", type=int, default=16)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--records-per-batch", type=int, default=200)
    parser.add_argument("--segment-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    if args.key_bytes < 4 + len(str(args.keys - 1)):
        parser.error(f"--key-bytes {args.key_bytes}: too short for 'key-' and {args.keys} ids")
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    total = sum(write_partition(args.logdir / f"{args.topic}-{p}", args, rng) for p in range(args.partitions))
    seconds = time.perf_counter() - started
    print(f"kafka-python wrote {total:,} bytes in {seconds:.1f} s ({total / seconds / 1e6:.1f} MB/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
