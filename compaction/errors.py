"""The one error tree of kcompact.

Subtrees are chosen by what the caller should do next, and each maps to a distinct exit code
(see `ExitCode`): fix the configuration, quarantine the input, or simply rerun.
Every message says what, where (object key and byte position) and, where it helps, expected vs found.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol


class ExitCode(IntEnum):
    """Process exit codes that an orchestrator can act on."""

    OK = 0
    INTERNAL = 1
    CONFIG = 2
    CORRUPT_INPUT = 3
    RETRYABLE = 4
    VERIFY_FAILED = 5  # `kcompact verify` found a key lost or changed: alert, do not rerun blindly


class KcompactError(Exception):
    """Root of every error kcompact raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def outcome_fields(self) -> dict[str, Any]:
        """What a per-partition outcome records of this error (`Failure`'s fields, its JSON)."""
        return {"error": str(self), "error_type": type(self).__name__, "exit_code": int(self.exit_code)}


class HasExitCode(Protocol):
    @property
    def exit_code(self) -> int: ...


def worst_exit_code(outcomes: Iterable[HasExitCode]) -> int:
    """The process's exit code for per-partition outcomes: the highest (0 when there are none)."""
    return max((o.exit_code for o in outcomes), default=0)


@dataclass(kw_only=True)
class Failure:
    """A per-partition outcome's failure, one shape for every command's report: the message, the error's class name
    and its exit code (the worst one decides the process's). All empty when the partition succeeded."""

    error: str | None = None
    error_type: str | None = None
    exit_code: int = 0

    def fail(self, exc: KcompactError) -> None:
        for name, value in exc.outcome_fields().items():
            setattr(self, name, value)

    def to_dict(self) -> dict[str, object]:
        """Every field, the failure's last (a subclass's own fields lead its JSON)."""
        out = dict(vars(self))
        for name in ("error", "error_type", "exit_code"):
            out[name] = out.pop(name)
        return out


class ConfigError(KcompactError):
    """The configuration or the command line is wrong: fix it, a rerun alone will not help."""

    exit_code = ExitCode.CONFIG


class CorruptInputError(KcompactError):
    """An input object is malformed. The partition it belongs to is quarantined; nothing is committed for it.

    `obj` names the file or object key, `position` the byte position where the problem was found.
    """

    exit_code = ExitCode.CORRUPT_INPUT

    def __init__(self, message: str, *, obj: str | None = None, position: int | None = None) -> None:
        self.detail = message
        self.obj = obj
        self.position = position
        where = []
        if obj is not None:
            where.append(str(obj))
        if position is not None:
            where.append(f"byte {position}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)

    def located(self, obj: str, base_position: int = 0) -> CorruptInputError:
        """The same error re-anchored on `obj`, with positions shifted by `base_position`."""
        position = None if self.position is None else self.position + base_position
        return type(self)(self.detail, obj=obj, position=position)


class CorruptBatchError(CorruptInputError):
    """A record batch or record does not follow the v2 format (lengths, varints, counts)."""


class CrcMismatchError(CorruptBatchError):
    """A batch's stored CRC-32C differs from the one computed over bytes [21, end)."""


class InvalidMagicError(CorruptBatchError):
    """The magic byte is not 0, 1 or 2."""


class UnsupportedMagicError(CorruptInputError):
    """A legacy message set (magic 0 or 1): kcompact reads record batch v2 only."""


class TruncatedSegmentError(CorruptBatchError):
    """The segment ends in the middle of a batch."""


class CorruptIndexError(CorruptInputError):
    """An offset, time or transaction index (or a checkpoint/snapshot file) is malformed."""


class MissingObjectError(CorruptInputError):
    """The metadata points at an object that does not exist in the store."""


class RetryableError(KcompactError):
    """Nothing was committed; rerunning is safe and may succeed."""

    exit_code = ExitCode.RETRYABLE


class CommitConflictError(RetryableError):
    """Another commit landed between planning and committing ("expected …, found …")."""


class FencedError(CommitConflictError):
    """A run with a newer fencing epoch owns the partition; this run is a zombie."""


class TransientStoreError(RetryableError):
    """The object store failed in a way that may pass (throttling, timeouts) after retries ran out."""


class ObjectExistsError(KcompactError):
    """A create-only write found the object already there; the store never overwrites.

    Seen after a crash and rerun, or when two writers chose the same key: pick a fresh key (a new segment
    id), or read the existing object if it is known to hold the same bytes.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(f"{uri}: object already exists; the store never overwrites (write under a new key)")

    def __reduce__(self) -> tuple[type[ObjectExistsError], tuple[str]]:
        return (type(self), (self.uri,))


class StoreAccessError(ConfigError):
    """The store refused access or is not there (bucket, credentials, permissions): fix the configuration."""


class StoreRequestError(KcompactError):
    """The store rejected a request for a reason that is neither configuration nor transient."""


class MetadataTableNotFoundError(ConfigError):
    """No Delta table at the metadata table URI: fix the URI, or create the table first."""


class UnsupportedDeltaProtocolError(ConfigError):
    """A Delta table kcompact writes (the topic, metadata or WAL table) requires a protocol version or table feature
    the kcompact writer that opened it does not implement (`compaction.delta_protocol`), typically turned on by
    another writer: nothing was written to it. Turn the feature off where Delta allows it, or use another table."""


class UnknownPartitionError(ConfigError):
    """The store holds nothing of the named topic-partition (no metadata rows, no WAL objects): a misspelt topic or
    partition, or the wrong store; Kafka's UNKNOWN_TOPIC_OR_PARTITION."""


class MetadataSchemaError(ConfigError):
    """The Delta table at the metadata URI is not kcompact's: other columns, types or partitioning."""


class MetadataVersionNotFoundError(ConfigError):
    """Time travel asked for a table version that does not exist (or was vacuumed away)."""


class TopicIdMismatchError(ConfigError):
    """The topic id differs from the one recorded: the topic was deleted and recreated under the same name.

    The old metadata belongs to a topic that no longer exists; a rerun alone will not help.
    """


class CorruptMetadataError(CorruptInputError):
    """The metadata table holds rows no kcompact commit writes (two partition rows, duplicate segment ids)."""


class MetadataInvariantError(KcompactError):
    """A change set would break an invariant of the metadata table: unknown segment, overlapping live
    segments, a cleaner offset going back. The change set is wrong; rebuilding it from a fresh snapshot
    with the same inputs will not help.
    """


class InvalidStateTransitionError(MetadataInvariantError):
    """A segment state change KIP-405 does not allow (e.g. COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED)."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain_text(exc: BaseException, limit: int = 600) -> str:
    """`exc`'s message as one plain line: delta-rs's error chains come with ANSI colours and one `↳` line per cause,
    which a log or an orchestrator's alert shows as escape codes. Causes are joined with `: `, and the line cut
    at `limit` characters."""
    parts = [p.strip(" ↳\t") for p in _ANSI.sub("", str(exc)).splitlines()]
    line = ": ".join(p for p in parts if p)
    return line if len(line) <= limit else line[: limit - 1] + "…"
