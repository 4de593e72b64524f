"""kcompact's metadata process for the broker (`compaction.remote_log_metadata`) with one crash point a test arms.

`python -m tests.kafka.metadata_crash_point --crash-dir DIR <the metadata process's arguments>` serves as the real
process does until a request matches the point written in `DIR/armed`: its op (`copy`, `add`, ...) or
`update <STATE>` before the request is served (nothing committed), `after <op>` or `after update <STATE>` once it is
(committed, not answered). It then
moves `armed` to `reached`, writes the request there, and never answers, so the broker's call stays in flight until
the test kills the broker or this process. The point fires once (a restarted process finds nothing armed).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compaction import remote_log_metadata
from compaction.remote_log_metadata import RemoteTier

Op = Callable[[RemoteTier, Mapping[str, Any]], Any]


def point(req: Mapping[str, Any]) -> str:
    return f"update {req['state']}" if req["op"] == "update" else str(req["op"])


def crashing(op: Op, crash_dir: Path) -> Op:
    def serve(tier: RemoteTier, req: Mapping[str, Any]) -> Any:
        armed = crash_dir / "armed"
        armed_at = armed.read_text().strip() if armed.is_file() else None
        if armed_at == point(req):
            hold(crash_dir, req)
        result = op(tier, req)
        if armed_at == f"after {point(req)}":
            hold(crash_dir, req)
        return result

    return serve


def hold(crash_dir: Path, req: Mapping[str, Any]) -> None:
    """Say where it stopped, then never return: the call stays in flight until the process is killed."""
    reached = crash_dir / "reached"
    os.replace(crash_dir / "armed", reached)
    reached.write_text(json.dumps(dict(req)))
    while True:
        time.sleep(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash-dir", required=True, type=Path)
    args, rest = parser.parse_known_args()
    for name, op in list(remote_log_metadata._OPS.items()):
        remote_log_metadata._OPS[name] = crashing(op, args.crash_dir)
    remote_log_metadata.main(rest)


if __name__ == "__main__":
    main()
