"""Per-partition text files: `leader-epoch-checkpoint` and `partition.metadata`.

Kafka writes them with `LeaderEpochCheckpointFile` and `PartitionMetadataFile`.

`leader-epoch-checkpoint` is Kafka's `CheckpointFile` format: a version line (0), a count line, then one
`epoch startOffset` line per entry, `\\n`-terminated. The reader follows `CheckpointReadBuffer`: an empty file
or one without a count line has no entries, a line that is not exactly two whitespace-separated integers is
malformed (the source throws; it does not skip), and the count must match. `EpochEntry.assign` rejects a
negative epoch or start offset, so they are malformed here too.

`partition.metadata` holds `version: 0` and `topic_id: <Uuid>`, the Uuid in Kafka's text form: URL-safe
base64 of its 16 bytes without padding (22 characters).

Errors are CorruptIndexError naming the file, with the 1-based line number in the message and the byte
position of that line's start.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from compaction.errors import CorruptIndexError

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
LEADER_EPOCH_CHECKPOINT_VERSION = 0
PARTITION_METADATA = "partition.metadata"
PARTITION_METADATA_VERSION = 0
UUID_SIZE = 16
ZERO_UUID = bytes(UUID_SIZE)
ONE_UUID = bytes(UUID_SIZE - 1) + b"\x01"  # Uuid.ONE_UUID, also METADATA_TOPIC_ID

_INT = re.compile(r"[+-]?[0-9]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = re.compile(r"\s+")
_URL_BASE64 = re.compile(r"[A-Za-z0-9_-]*={0,2}")
INT32_RANGE = range(-(2**31), 2**31)
INT64_RANGE = range(-(2**63), 2**63)


@dataclass(frozen=True)
class EpochEntry:
    """A leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


@dataclass(frozen=True)
class PartitionMetadata:
    """Contents of `partition.metadata`; `topic_id` is the 22-character text form."""

    topic_id: str
    version: int = PARTITION_METADATA_VERSION


# --- leader-epoch-checkpoint -----------------------------------------------------------------------


def read_leader_epoch_checkpoint(data: bytes | str, obj: str | None = None) -> list[EpochEntry]:
    """Parse a `leader-epoch-checkpoint` image. Raises CorruptIndexError naming `obj` and the line."""
    name = obj or LEADER_EPOCH_CHECKPOINT
    lines = _lines(data, name)
    if not lines:
        return []
    version = _parse_int(lines[0], name, INT32_RANGE)
    if version != LEADER_EPOCH_CHECKPOINT_VERSION:
        raise _line_error(
            lines[0], name, f"unrecognised version {version}, expected {LEADER_EPOCH_CHECKPOINT_VERSION}"
        )
    if len(lines) == 1:
        return []
    expected = _parse_int(lines[1], name, INT32_RANGE)
    entries = [_parse_epoch_entry(line, name) for line in lines[2:]]
    if len(entries) != expected:
        raise _line_error(lines[1], name, f"expected {expected} entries, found {len(entries)}")
    return entries


def encode_leader_epoch_checkpoint(entries: Iterable[EpochEntry]) -> bytes:
    """Serialise entries as `CheckpointWriteBuffer` does (version, count, `epoch startOffset` lines)."""
    items = list(entries)
    lines = [str(LEADER_EPOCH_CHECKPOINT_VERSION), str(len(items))]
    lines += [f"{e.epoch} {e.start_offset}" for e in items]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def epochs_in_range(entries: Sequence[EpochEntry], start: int, next_base: int) -> list[EpochEntry]:
    """Kafka's `LeaderEpochFileCache.epochEntriesInRange(start, next_base)` on the cache of `entries`.

    The cache is rebuilt with `leader_epoch_cache`. Then, if `start >= 0`, entries starting at or before
    `start` are dropped and the last of them comes back with its start moved to `start`; if `next_base >= 0`,
    entries starting at or after `next_base` are dropped.
    """
    epochs = leader_epoch_cache(entries)
    if start >= 0:
        removed = 0
        while removed < len(epochs) and epochs[removed].start_offset <= start:
            removed += 1
        if removed:
            epochs = [EpochEntry(epochs[removed - 1].epoch, start), *epochs[removed:]]
    if next_base >= 0:
        while epochs and epochs[-1].start_offset >= next_base:
            epochs.pop()
    return epochs


def leader_epoch_cache(entries: Iterable[EpochEntry]) -> list[EpochEntry]:
    """The cache `LeaderEpochFileCache` builds by `assign`ing the entries in order.

    An entry repeating the latest epoch at the same or a later offset is ignored; otherwise every cached
    entry with an epoch or start offset at or above the new one's is removed before it is appended. The
    result has strictly increasing epochs and start offsets.
    """
    cache: list[EpochEntry] = []
    for entry in entries:
        if cache and entry.epoch == cache[-1].epoch and entry.start_offset >= cache[-1].start_offset:
            continue
        while cache and (cache[-1].epoch >= entry.epoch or cache[-1].start_offset >= entry.start_offset):
            cache.pop()
        cache.append(entry)
    return cache


def _parse_epoch_entry(line: _Line, name: str) -> EpochEntry:
    fields = _WHITESPACE.split(line.text)
    while fields and fields[-1] == "":  # Java's String.split drops trailing empty strings
        fields.pop()
    if len(fields) != 2 or not all(_INT.fullmatch(f) for f in fields):
        raise _line_error(line, name, f"malformed line {line.text!r}, expected 'epoch startOffset'")
    epoch, start_offset = int(fields[0]), int(fields[1])
    if epoch not in INT32_RANGE or start_offset not in INT64_RANGE or epoch < 0 or start_offset < 0:
        raise _line_error(
            line, name, f"invalid leader epoch entry {line.text!r}: epoch and offset must be >= 0"
        )
    return EpochEntry(epoch, start_offset)


# --- partition.metadata ----------------------------------------------------------------------------


def read_partition_metadata(data: bytes | str, obj: str | None = None) -> PartitionMetadata:
    """Parse `partition.metadata` (`PartitionMetadataReadBuffer`); CorruptIndexError names the line."""
    name = obj or PARTITION_METADATA
    lines = _lines(data, name)
    if len(lines) < 2:
        raise CorruptIndexError(f"{len(lines)} lines, expected 'version: 0' and 'topic_id: <uuid>'", obj=name)
    version_text = _field(lines[0], "version:", name)
    version = _parse_int(lines[0], name, INT32_RANGE, version_text)
    if version != PARTITION_METADATA_VERSION:
        raise _line_error(
            lines[0], name, f"unrecognised version {version}, expected {PARTITION_METADATA_VERSION}"
        )
    topic_id = _field(lines[1], "topic_id:", name)
    try:
        raw = base64_to_uuid(topic_id)
    except ValueError as exc:
        raise _line_error(lines[1], name, str(exc)) from None
    if raw == ZERO_UUID:
        raise _line_error(lines[1], name, "invalid topic ID: the zero Uuid")
    return PartitionMetadata(topic_id, version)


def encode_partition_metadata(topic_id: str) -> bytes:
    """`version: 0\\ntopic_id: <topic_id>\\n`. Raises ValueError if `topic_id` is not a Uuid text form."""
    if base64_to_uuid(topic_id) == ZERO_UUID:
        raise ValueError("the zero Uuid is not a valid topic ID")
    return f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id}\n".encode()


def uuid_to_base64(raw: bytes) -> str:
    """Kafka's `Uuid.toString`: URL-safe base64 of the 16 bytes, no padding (22 characters)."""
    if len(raw) != UUID_SIZE:
        raise ValueError(f"a Uuid has {UUID_SIZE} bytes, got {len(raw)}")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def base64_to_uuid(text: str) -> bytes:
    """Kafka's `Uuid.fromString`: the 16 bytes of a URL-safe base64 Uuid (padding optional)."""
    if not _URL_BASE64.fullmatch(text):
        raise ValueError(f"{text!r} is not URL-safe base64")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"{text!r} is not URL-safe base64") from None
    if len(raw) != UUID_SIZE:
        raise ValueError(f"{text!r} decodes to {len(raw)} bytes, a Uuid has {UUID_SIZE}")
    return raw


def new_topic_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """Kafka's `Uuid.randomUuid()` as text: a v4 UUID, neither reserved (zero, one) nor starting with '-'."""
    while True:
        raw = uuid.UUID(bytes=random_bytes(UUID_SIZE), version=4).bytes
        text = uuid_to_base64(raw)
        if raw not in (ZERO_UUID, ONE_UUID) and not text.startswith("-"):
            return text


# --- files -----------------------------------------------------------------------------------------


def write_checkpoint_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `<path>.tmp`, fsync, then rename over `path`, as Kafka's checkpoint writers do."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)


# --- shared ----------------------------------------------------------------------------------------


class _Line(NamedTuple):
    number: int  # 1-based
    position: int  # byte position of the line start
    text: str


def _lines(data: bytes | str, name: str) -> list[_Line]:
    """`BufferedReader.readLine` semantics: `\\n`, `\\r` or `\\r\\n` end a line; no final empty line."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptIndexError(f"not UTF-8: {exc.reason}", obj=name, position=exc.start) from None
    else:
        text = data
    spans: list[tuple[int, int]] = []
    pos = 0
    for match in _LINE_BREAK.finditer(text):
        spans.append((pos, match.start()))
        pos = match.end()
    if pos < len(text):
        spans.append((pos, len(text)))
    return [
        _Line(i + 1, len(text[:start].encode("utf-8")), text[start:end])
        for i, (start, end) in enumerate(spans)
    ]


def _field(line: _Line, key: str, name: str) -> str:
    fields = _WHITESPACE.split(line.text)
    if len(fields) != 2 or fields[0] != key:
        raise _line_error(line, name, f"malformed line {line.text!r}, expected '{key} <value>'")
    return fields[1]


def _parse_int(line: _Line, name: str, valid: range, text: str | None = None) -> int:
    value = line.text if text is None else text
    if not _INT.fullmatch(value) or int(value) not in valid:
        raise _line_error(line, name, f"malformed line {line.text!r}, expected an integer")
    return int(value)


def _line_error(line: _Line, name: str, message: str) -> CorruptIndexError:
    return CorruptIndexError(f"line {line.number}: {message}", obj=name, position=line.position)
