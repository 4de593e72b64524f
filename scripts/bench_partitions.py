"""P11 (issue 41 item 7): the same bytes over 8, 100 and 1,000 partitions, each command a fresh process.

The workload is the issue's own: `kcompact generate --bulk`, ~160 MB of 100-byte values in 128 KiB segments, split
evenly over N partitions of one topic (records and keys per partition = the totals / N). For each N, on a fresh
store: `kcompact tier` of the log dir, `kcompact compact`, `kcompact table` (a full build of the topic table),
`kcompact verify` of partition 0 (verify takes one partition: a topic-wide figure would be N processes), and
`kcompact gc --grace-ms 0` (deletes what the compaction replaced). Each is timed as a whole process, and the Delta
commits it made to the metadata table are counted (table versions before and after). Goals: 1,000 partitions
within 1.5x of 8 partitions' wall for tier and compact; a compaction's commits independent of N (<= 3).

    python scripts/bench_partitions.py [--partitions 8,100,1000] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_workloads import DATA, NOW_MS, START_MS

KCOMPACT = Path(sys.executable).parent / "kcompact"
TOTAL_RECORDS = 1_200_000
TOTAL_KEYS = 240_000
SEGMENT_BYTES = 128 * 1024
TOPIC = "p11"


def _workload(partitions: int, scale: float) -> Path:
    records, keys = int(TOTAL_RECORDS * scale) // partitions, max(1, int(TOTAL_KEYS * scale) // partitions)
    logdir = DATA / f"p11-{partitions}-{records}"
    if not (logdir / ".complete").exists():
        shutil.rmtree(logdir, ignore_errors=True)
        subprocess.run([str(KCOMPACT), "generate", "--logdir", str(logdir), "--bulk", "--start-ms", str(START_MS),
                        "--topics", f"{TOPIC}:{partitions}", "--records", str(records), "--keys", str(keys),
                        "--key-order", "uniform", "--value-bytes", "100", "--records-per-batch", "200",
                        "--segment-bytes", str(SEGMENT_BYTES), "--codecs", "none", "--tombstone-ratio", "0.01",
                        "--seed", "41"], check=True, stdout=subprocess.DEVNULL)
        (logdir / ".complete").write_text("")
    return logdir


def _version(store: Path) -> int:
    from compaction.metadata import table_in_store
    from compaction.storage import open_store

    return table_in_store(open_store(str(store))).version()


def _timed(name: str, cmd: list[str], store: Path, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    before = _version(store) if (store / "_kcompact_metadata").exists() else -1
    print("running:", " ".join(cmd), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(f"{name} exited {done.returncode}: {done.stderr[-2000:]}")
    return {"command": name, "seconds": seconds, "exit": done.returncode,
            "commits": _version(store) - max(before, 0)}


def one(partitions: int, scale: float) -> dict[str, Any]:
    logdir = _workload(partitions, scale)
    work = DATA / "stores" / f"p11-{partitions}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store, config = work / "store", work / "config.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n  min.cleanable.dirty.ratio: 0.01\n")
    base = ["--store", str(store)]
    steps = [_timed("tier", [str(KCOMPACT), "tier", "--logdir", str(logdir), *base, "--now", str(NOW_MS)], store)]
    tiered = _version(store)
    steps += [
        _timed("compact", [str(KCOMPACT), "compact", *base, "--config", str(config), "--now", str(NOW_MS)], store),
        _timed("table", [str(KCOMPACT), "table", *base, "--config", str(config), "--topic", TOPIC,
                         "--table", str(work / "topic-table"), "--now", str(NOW_MS)], store),
        _timed("verify", [str(KCOMPACT), "verify", *base, "--topic", TOPIC, "--partition", "0", "--before", str(tiered),
                          "--config", str(config)], store),
        _timed("gc", [str(KCOMPACT), "gc", *base, "--now", str(NOW_MS + 86_400_000), "--grace-ms", "0",
                      "--orphan-grace-ms", "0"], store),
    ]
    segment_bytes = sum(f.stat().st_size for f in logdir.rglob("*.log"))
    shutil.rmtree(work, ignore_errors=True)
    return {"partitions": partitions, "log_bytes": segment_bytes, "steps": steps, "load": os.getloadavg()}


def bench_partitions(scale: float = 1.0, counts: tuple[int, ...] = (8, 100, 1000)) -> dict[str, Any]:
    return {"runs": [one(n, scale) for n in counts], "segment_bytes": SEGMENT_BYTES,
            "total_records": int(TOTAL_RECORDS * scale)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,100,1000")
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    result = bench_partitions(args.scale, tuple(int(n) for n in args.partitions.split(",")))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
