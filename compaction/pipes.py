"""The schema of the pipes between the broker's tiered plugin and kcompact's Python processes, read from
`compaction/pipes.json`.

Two JSON-lines protocols run between the plugin (Java, `kafka/tiered-plugin`) and Python: the metadata process
(`compaction.remote_log_metadata`) and the store process (`compaction.remote_storage`). Their field names are written
down once, in `pipes.json`, which both sides answer to: every request the Python side serves is checked against it
here (a missing field is refused with its name, not a KeyError deep in a handler), Python's tests check what each
handler reads and answers against it, and the plugin's `PipeSchemaTest` checks every request the plugin sends,
through the real Python processes, against the same file. The writer name of a broker's rows (`broker-<id>`) is
there too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

SCHEMA: Mapping[str, Any] = json.loads(resources.files("compaction").joinpath("pipes.json").read_text())

WRITER_PREFIX: str = SCHEMA["writer_prefix"]
"""The writer of the rows a broker adds and updates is `broker-<id>` (`compaction.metadata.broker_writer`)."""


def request_fields(pipe: str, op: str) -> tuple[str, ...]:
    """The fields a request `op` of `pipe` ("metadata" or "store") carries."""
    return tuple(SCHEMA[pipe]["requests"][op])


def check_request(pipe: str, request: Any) -> str:
    """The op of `request`, a request read from `pipe`, once it is checked against the schema.

    Raises:
        ValueError: not a JSON object, an unknown op, or a field of the op missing (named, with the op's fields).
    """
    if not isinstance(request, dict):
        raise ValueError(f"expected a JSON object as a {pipe} request, found {type(request).__name__}")
    ops = SCHEMA[pipe]["requests"]
    op = request.get("op")
    if op not in ops:
        raise ValueError(f"expected op one of {sorted(ops)} in a {pipe} request, found {op!r}")
    missing = [f for f in ops[op] if f not in request]
    if missing:
        raise ValueError(f"{pipe} request {op!r} lacks {', '.join(missing)} (its fields: {', '.join(ops[op])}; "
                         "compaction/pipes.json)")
    return str(op)


__all__ = ["SCHEMA", "WRITER_PREFIX", "check_request", "request_fields"]
