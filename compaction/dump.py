"""`kcompact dump`: what `kafka-dump-log.sh` prints, for segments, indexes, snapshots and checkpoints.

The text form is kafka-dump-log's (`kafka.tools.DumpLogSegments` with `--deep-iteration`, or `--print-data-log`
with `print_data`), line for line, with its stderr report of non-consecutive offsets (`gaps_report`);
`--json` gives the same facts as one JSON document per file. Files are decoded with the readable
reference decoder, CRCs checked and reported (`isvalid`), so a dump also tells where a file is broken.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from compaction.errors import ConfigError, CorruptInputError
from compaction.format.batch import (
    NO_SEQUENCE,
    TimestampType,
    crc32c,
    decode_batch,
    decrement_sequence,
    increment_sequence,
)
from compaction.format.control import ControlType, parse_control_record
from compaction.format.segment import iter_batch_headers


def _text(data: bytes) -> str:
    """Bytes as kafka-dump-log prints them: UTF-8, a malformed sequence as U+FFFD (`--json` keeps the bytes)."""
    return data.decode("utf-8", errors="replace")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dump_log(path: Path, *, print_data: bool) -> dict[str, Any]:
    """Decode a `.log` file into a JSON-ready dict of batches (and records)."""
    data = path.read_bytes()
    batches = []
    for header in iter_batch_headers(data, obj=str(path)):
        body = memoryview(data)[header.position + 21 : header.position + header.size]
        valid = crc32c(body) == header.crc
        try:
            batch = decode_batch(data, header.position, verify_crc=False)
        except CorruptInputError as exc:
            raise exc.located(str(path)) from None
        entry: dict[str, Any] = {
            "baseOffset": batch.base_offset,
            "lastOffset": batch.last_offset,
            "count": len(batch.records),
            "baseSequence": batch.base_sequence,
            "lastSequence": batch.last_sequence,
            "producerId": batch.producer_id,
            "producerEpoch": batch.producer_epoch,
            "partitionLeaderEpoch": batch.partition_leader_epoch,
            "isTransactional": batch.is_transactional,
            "isControl": batch.is_control,
            "deleteHorizonMs": batch.delete_horizon_ms,
            "position": header.position,
            "timestampType": "LogAppendTime"
            if batch.timestamp_type is TimestampType.LOG_APPEND_TIME
            else "CreateTime",
            "maxTimestamp": batch.max_timestamp,
            "size": header.size,
            "magic": 2,
            "compresscodec": batch.codec.name.lower(),
            "crc": header.crc,
            "isvalid": valid,
            "records": [],
        }
        for record in batch.records:
            rec: dict[str, Any] = {
                "offset": record.offset,
                "timestamp": record.timestamp,
                "keySize": -1 if record.key is None else len(record.key),
                "valueSize": -1 if record.value is None else len(record.value),
                "sequence": NO_SEQUENCE if batch.base_sequence == NO_SEQUENCE  # Kafka's DefaultRecord.sequence
                else increment_sequence(batch.base_sequence, record.offset - batch.base_offset),
                "headerKeys": [h.key for h in record.headers],
            }
            if batch.is_control:
                ctrl = parse_control_record(record)
                rec["controlType"] = ctrl.type.name if ctrl.type is not ControlType.UNKNOWN else ctrl.type_id
                if ctrl.coordinator_epoch is not None:
                    rec["coordinatorEpoch"] = ctrl.coordinator_epoch
            elif print_data:
                rec["key"] = _b64(record.key)
                rec["value"] = _b64(record.value)
                rec["headers"] = [{"key": h.key, "value": _b64(h.value)} for h in record.headers]
            entry["records"].append(rec)
        batches.append(entry)
    start = _base_offset(path)  # Kafka's segment base offset is its file name's
    if start is None and batches:
        start = batches[0]["baseOffset"]
    offsets = [r["offset"] for b in batches for r in b["records"]]
    gaps = [[a, b] for a, b in itertools.pairwise(offsets) if b != a + 1]
    return {"file": str(path), "type": "log", "logStartOffset": start, "batches": batches,
            "nonConsecutiveOffsets": gaps}


def gaps_report(docs: Iterable[dict[str, Any]]) -> Iterator[str]:
    """What kafka-dump-log prints to stderr after its files: per log whose record offsets have gaps (every
    compacted log has), each pair of neighbours that are not consecutive, the last found first."""
    for doc in docs:
        if doc.get("nonConsecutiveOffsets"):
            yield f"Non-consecutive offsets in {Path(doc['file']).absolute()}"
            yield from (f"  {a} is followed by {b}" for a, b in reversed(doc["nonConsecutiveOffsets"]))


def format_log(doc: dict[str, Any], *, print_data: bool) -> Iterator[str]:
    """kafka-dump-log's text lines for a decoded `.log`."""
    yield f"Dumping {doc['file']}"
    if doc["logStartOffset"] is not None:
        yield f"Log starting offset: {doc['logStartOffset']}"
    for b in doc["batches"]:
        horizon = (
            "OptionalLong.empty" if b["deleteHorizonMs"] is None else f"OptionalLong[{b['deleteHorizonMs']}]"
        )
        yield (
            f"baseOffset: {b['baseOffset']} lastOffset: {b['lastOffset']} count: {b['count']} "
            f"baseSequence: {b['baseSequence']} lastSequence: {b['lastSequence']} producerId: {b['producerId']} "
            f"producerEpoch: {b['producerEpoch']} partitionLeaderEpoch: {b['partitionLeaderEpoch']} "
            f"isTransactional: {str(b['isTransactional']).lower()} isControl: {str(b['isControl']).lower()} "
            f"deleteHorizonMs: {horizon} position: {b['position']} {b['timestampType']}: {b['maxTimestamp']} "
            f"size: {b['size']} magic: 2 compresscodec: {b['compresscodec']} crc: {b['crc']} "
            f"isvalid: {str(b['isvalid']).lower()}"
        )
        for r in b["records"]:
            line = (
                f"| offset: {r['offset']} {b['timestampType']}: {r['timestamp']} keySize: {r['keySize']} "
                f"valueSize: {r['valueSize']} sequence: {r['sequence']} headerKeys: [{','.join(r['headerKeys'])}]"
            )
            if "controlType" in r:
                line += f" endTxnMarker: {r['controlType']}"
                if "coordinatorEpoch" in r:
                    line += f" coordinatorEpoch: {r['coordinatorEpoch']}"
            elif print_data:  # as Kafka's parser: no key or payload field for a null one
                if r["key"] is not None:
                    line += f" key: {_text(base64.b64decode(r['key']))}"
                if r["value"] is not None:
                    line += f" payload: {_text(base64.b64decode(r['value']))}"
            yield line


def dump_path(path: Path, *, print_data: bool) -> dict[str, Any]:
    """Dispatch on the file name the way kafka-dump-log does."""
    from compaction.format import checkpoints, indexes, producer_snapshot

    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    name = path.name
    base = _base_offset(path) or 0
    if name.endswith(".log"):
        return dump_log(path, print_data=print_data)
    if name.endswith(".index"):
        entries = indexes.read_offset_index(path.read_bytes(), base, obj=str(path))
        return {
            "file": str(path),
            "type": "offset_index",
            "entries": [{"offset": base + e.relative_offset, "position": e.position} for e in entries],
        }
    if name.endswith(".timeindex"):
        tentries = indexes.read_time_index(path.read_bytes(), base, obj=str(path))
        return {
            "file": str(path),
            "type": "time_index",
            "entries": [{"timestamp": e.timestamp, "offset": base + e.relative_offset} for e in tentries],
        }
    if name.endswith(".txnindex"):
        txns = indexes.read_txn_index(path.read_bytes(), obj=str(path))
        return {
            "file": str(path),
            "type": "txn_index",
            "entries": [
                {
                    "version": t.version,
                    "producerId": t.producer_id,
                    "firstOffset": t.first_offset,
                    "lastOffset": t.last_offset,
                    "lastStableOffset": t.last_stable_offset,
                }
                for t in txns
            ],
        }
    if name.endswith(".snapshot"):
        states = producer_snapshot.read_producer_snapshot(path.read_bytes(), obj=str(path))
        return {"file": str(path), "type": "producer_snapshot", "entries": [vars(s) for s in states]}
    if name == "leader-epoch-checkpoint" or name.endswith(".leader_epoch_checkpoint"):
        epochs = checkpoints.read_leader_epoch_checkpoint(path.read_text(), obj=str(path))
        return {
            "file": str(path),
            "type": "leader_epoch_checkpoint",
            "entries": [{"epoch": e.epoch, "startOffset": e.start_offset} for e in epochs],
        }
    if name.endswith(".indexes"):
        from compaction.storage.indexes import read_header

        data = path.read_bytes()
        parts = read_header(data, obj=str(path), size=len(data))
        return {
            "file": str(path),
            "type": "indexes",
            "entries": [{"part": s.value, "position": a, "size": b - a} for s, (a, b) in parts.items()],
        }
    if name == "partition.metadata":
        return {
            "file": str(path),
            "type": "partition_metadata",
            "topic_id": checkpoints.read_partition_metadata(path.read_text(), obj=str(path)).topic_id,
        }
    raise ConfigError(
        f"{path}: don't know how to dump this file (expected .log, .index, .timeindex, .txnindex, "
        ".snapshot, leader-epoch-checkpoint, partition.metadata or kcompact's .indexes)"
    )


def format_doc(doc: dict[str, Any], *, print_data: bool) -> Iterator[str]:
    if doc["type"] == "log":
        yield from format_log(doc, print_data=print_data)
        return
    yield f"Dumping {doc['file']}"
    if doc["type"] == "offset_index" and not doc["entries"]:
        yield f"{doc['file']} is empty."
    if "topic_id" in doc:
        yield f"topic_id: {doc['topic_id']}"
    for entry in doc.get("entries", []):
        yield _snapshot_line(entry) if doc["type"] == "producer_snapshot" else " ".join(
            f"{k}: {v}" for k, v in entry.items())


def _snapshot_line(e: dict[str, Any]) -> str:
    """kafka-dump-log's line for a producer snapshot entry: its batch metadata only when it has some (a last
    offset), the first sequence counted back from the last one (Kafka's `DefaultRecordBatch.decrementSequence`)."""
    txn = e["current_txn_first_offset"]
    line = (f"producerId: {e['producer_id']} producerEpoch: {e['producer_epoch']} "
            f"coordinatorEpoch: {e['coordinator_epoch']} currentTxnFirstOffset: "
            f"{'OptionalLong.empty' if txn < 0 else f'OptionalLong[{txn}]'} lastTimestamp: {e['timestamp']} ")
    if e["last_offset"] >= 0:
        first = decrement_sequence(e["last_sequence"], e["offset_delta"])
        line += (f"firstSequence: {first} lastSequence: {e['last_sequence']} lastOffset: {e['last_offset']} "
                 f"offsetDelta: {e['offset_delta']} timestamp: {e['timestamp']}")
    return line


def _base_offset(path: Path) -> int | None:
    """The base offset a Kafka file name carries (`00000000000000000042.index`), None for another name."""
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else None
