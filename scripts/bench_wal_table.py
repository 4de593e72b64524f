"""The WAL table's state change as the table lives on (issue 41 item 2): `python scripts/bench_wal_table.py [--keep]`.

Each round records one combined object holding entries of 100 partitions (COPY_SEGMENT_STARTED) and moves it to
COPY_SEGMENT_FINISHED, the state change timed; every 16 rounds a gc round deletes the objects 16-31 rounds old
(DELETE_SEGMENT_STARTED, then FINISHED), drops the rows of the deleted ones as `kcompact gc` does a day after their
deletion (`WalTable.forget_finished`; not with `--keep`, which keeps every row as before) and runs the table's upkeep.
Prints the median state change per 16 rounds. A local store in a temporary directory; no Spark.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compaction.metadata.model import SegmentState
from compaction.storage import open_store
from compaction.wal.model import WalEntry, WalObject
from compaction.wal.table import WalTable

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"


def combined(i: int, partitions: int) -> WalObject:
    entries = tuple(WalEntry("t", TOPIC_ID, p, i * 100, i * 100 + 99, 0, p * 1000, p * 1000 + 999, 5, 100)
                    for p in range(partitions))
    return WalObject(f"obj{i:06d}", f"wal/obj{i:06d}.wal", 100_000, SegmentState.COPY_SEGMENT_STARTED, 1, "bench", i, i,
                     entries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the deleted objects' rows (the behaviour before)")
    parser.add_argument("--rounds", type=int, default=240)
    parser.add_argument("--partitions", type=int, default=100)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="kcompact-wal-table-")
    try:
        table = WalTable.in_store(open_store(root), create=True)
        times = []
        for i in range(args.rounds):
            o = combined(i, args.partitions)
            table.record_started([o], i)
            started = time.perf_counter()
            table.change_state([o.object_id], SegmentState.COPY_SEGMENT_FINISHED, i)
            times.append(time.perf_counter() - started)
            if i % 16 == 15:
                old = [f"obj{j:06d}" for j in range(max(0, i - 31), i - 15)]
                table.change_state(old, SegmentState.DELETE_SEGMENT_STARTED, i)
                table.change_state(old, SegmentState.DELETE_SEGMENT_FINISHED, i)
                if not args.keep:
                    table.forget_finished(i)
                table.upkeep(lambda _path: True)
        for start in range(0, args.rounds - 15, 16):
            window = sorted(times[start:start + 16])
            print(f"rounds {start}-{start + 15}: state change median {window[8] * 1000:.1f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
