"""The workloads of `make bench` (scripts/bench.py): generated once under bench-data/ and tiered once into a
pristine store that each measured run gets a hard-linked copy of.

Every workload is named after its options, so a changed option generates a new one; a `.complete` marker makes
an interrupted generation start over.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench-data"
NOW_MS = 1_800_000_000_000
START_MS = 1_700_000_000_000  # generated timestamps start at 1.7e12: everything is old enough to clean
QUICK = 1 / 64  # --quick: every workload at this share of its size


def generate(name: str, *args: str) -> Path:
    """Generate (once) a log dir with `kcompact generate` and the given options."""
    logdir = DATA / name
    if not (logdir / ".complete").exists():
        # pinned first timestamp: the data stays older than NOW_MS whenever it is generated (the default is the
        # wall clock, which would pass NOW_MS and make the data "in the future")
        cmd = [sys.executable, "-m", "compaction.cli", "generate", "--logdir", str(logdir),
               "--start-ms", str(START_MS), *args]
        print("generating:", " ".join(cmd[2:]), file=sys.stderr)
        subprocess.run(cmd, check=True)
        (logdir / ".complete").write_text(" ".join(args))
    return logdir


def bulk(name: str, *args: str) -> Path:
    """`kcompact generate --bulk` once per name (the name must change with the options)."""
    return generate(name, "--bulk", *args)


def rolled_logs(logdir: Path) -> list[Path]:
    """The .log files a tier run uploads (every partition's active, highest segment stays local)."""
    return [f for part in sorted(p for p in logdir.iterdir() if p.is_dir()) for f in sorted(part.glob("*.log"))[:-1]]


def log_bytes(logdir: Path) -> int:
    return sum(f.stat().st_size for f in rolled_logs(logdir))


def tiered(logdir: Path, name: str) -> Path:
    """A store holding `logdir` tiered (once, cached): the pristine copy runs are hard-linked from."""
    from compaction.metadata import table_in_store
    from compaction.storage import open_store
    from compaction.tier import tier_logdir

    pristine = DATA / "stores" / name / "pristine"
    if not (pristine / ".complete").exists():
        shutil.rmtree(pristine, ignore_errors=True)
        store = open_store(str(pristine))
        print(f"tiering {logdir.name} into {pristine}", file=sys.stderr)
        results = tier_logdir(logdir, store, table_in_store(store, create=True), NOW_MS - 86_400_000)
        errors = [r.error for r in results if r.error]
        if errors:
            raise SystemExit(f"tiering {logdir} failed: {errors}")
        (pristine / ".complete").write_text(json.dumps({"rebuilt_indexes": sum(r.rebuilt_indexes for r in results)}))
    return pristine


def copy_store(pristine: Path, name: str) -> Path:
    """A private copy of a store: hard links (objects and Delta files are never modified in place)."""
    target = pristine.parent / name
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", str(pristine), str(target)], check=True)
    return target


def warm(store: Path) -> None:
    """Read every file of `store` once, so that a run reads its objects from the page cache, as the raw read +
    CRC-32C reference does: the figures measure kcompact, not the machine's disk (on S3 the fetch is in the
    report's requests)."""
    for f in store.rglob("*"):
        if f.is_file():
            with f.open("rb") as src:
                while src.read(8 << 20):
                    pass


def e2e_args(scale: float, codec: str, partitions: int = 8) -> list[str]:
    """P2/P5's workload at `scale` (1 = the >= 1 GiB one): 8 partitions, ~110-byte values, ~4.5 versions per
    key, segments scaled with the data so every partition has the same number of them. `partitions` = 1 puts
    the same records and keys in one partition (P6)."""
    records = int((1_600_000 if codec == "none" else 2_000_000) * scale) * 8 // partitions
    keys = max(1, int(300_000 * scale)) * 8 // partitions
    return [
        "--topics", f"e2e:{partitions}" if partitions == 8 else f"hot:{partitions}", "--records", str(records),
        "--keys", str(keys), "--key-order", "uniform", "--value-bytes", "100", "--records-per-batch", "200",
        "--segment-bytes", str(int(32 * 2**20 * scale)), "--codecs", codec, "--tombstone-ratio", "0.01",
        "--seed", "11",
    ]


KAFKA_SHAPE = {"partitions": 2, "records": 4_000_000, "keys": 1_000_000, "segment_bytes": 64 * 2**20}


def kafka_workload(scale: float) -> tuple[Path, list[str], float]:
    """P2K's log dir, written once by kafka-python (`scripts/kafka_workload.py`): its path, options and the
    seconds its generation took."""
    records = max(1000, int(KAFKA_SHAPE["records"] * scale))
    args = ["--topic", "kp", "--partitions", str(KAFKA_SHAPE["partitions"]), "--records", str(records),
            "--keys", str(max(100, int(KAFKA_SHAPE["keys"] * scale))), "--key-bytes", "16", "--value-bytes", "100",
            "--records-per-batch", "200", "--segment-bytes", str(max(2**16, int(KAFKA_SHAPE["segment_bytes"] * scale))),
            "--seed", "13"]
    logdir = DATA / f"kp-{KAFKA_SHAPE['partitions']}x{records}"
    marker = logdir / ".complete"
    if not marker.exists():
        shutil.rmtree(logdir, ignore_errors=True)
        print("generating with kafka-python:", " ".join(args), file=sys.stderr)
        started = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "scripts" / "kafka_workload.py"), "--logdir", str(logdir), *args],
                       check=True)
        marker.write_text(json.dumps({"args": args, "seconds": time.perf_counter() - started}))
    return logdir, args, float(json.loads(marker.read_text())["seconds"])


def cardinality_args(keys: int, partitions: int, scale: float = 1.0) -> list[str]:
    topic = "card" if partitions == 8 else "verify"
    return [
        "--topics", f"{topic}:{partitions}", "--records", str(int(keys * 1.5) // partitions), "--keys",
        str(keys // partitions), "--key-order", "sequential", "--value-bytes", "16", "--records-per-batch", "500",
        "--segment-bytes", str(int(16 * 2**20 * scale)), "--codecs", "none", "--tombstone-ratio", "0", "--seed", "5",
    ]


P4_KEYS = 1_000_000  # per partition (2 partitions)
P4_FRACTION = 0.01
P4_SEGMENT = 16 * 2**20
P4_SWEEP = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def records_per_segment(value_bytes: int, per_batch: int, segment_bytes: int) -> int:
    """With fixed-size keys and values every batch has one size: how many records a segment holds."""
    from compaction.format.segment import iter_batch_headers

    probe = bulk(f"probe-{value_bytes}-{per_batch}", "--topics", "probe:1", "--records", str(3 * per_batch),
                 "--keys", str(3 * per_batch), "--value-bytes", str(value_bytes), "--records-per-batch",
                 str(per_batch), "--codecs", "none", "--tombstone-ratio", "0", "--seed", "1")
    data = (probe / "probe-0" / f"{0:020d}.log").read_bytes()
    sizes = {h.size for h in iter_batch_headers(data)}
    if len(sizes) != 1:
        raise SystemExit(f"batch sizes vary ({sizes}): cannot align the base with a segment boundary")
    return (segment_bytes // sizes.pop()) * per_batch


def rolled(logdir: Path) -> Path:
    """`logdir` with its active segments rolled: hard links plus an empty new active segment per partition
    at its log end offset (as a broker's roll leaves it), so that tiering uploads the updates."""
    from compaction.format.segment import iter_batch_headers

    rolled = logdir.with_name(logdir.name + "-rolled")
    if (rolled / ".complete").exists():
        return rolled
    shutil.rmtree(rolled, ignore_errors=True)
    for part in sorted(p for p in logdir.iterdir() if p.is_dir()):
        (rolled / part.name).mkdir(parents=True)
        for f in part.iterdir():
            os.link(f, rolled / part.name / f.name)
        last = sorted(part.glob("*.log"))[-1]
        end = max(h.last_offset for h in iter_batch_headers(last.read_bytes())) + 1
        (rolled / part.name / f"{end:020d}.log").write_bytes(b"")
    (rolled / ".complete").write_text("ok")
    return rolled


def base_segments(full: Path, keys: int) -> Path:
    """`full`'s segments up to the first one at or above offset `keys` (hard links): the base without the updates
    (that segment is the active one, so tiering the base leaves the updates out)."""
    base = full.with_name(full.name + "-base")
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        for part in sorted(p for p in full.iterdir() if p.is_dir()):
            (base / part.name).mkdir(parents=True)
            for f in part.iterdir():
                if not f.name.split(".")[0].isdigit() or int(f.name.split(".")[0]) <= keys:
                    os.link(f, base / part.name / f.name)
        (base / ".complete").write_text("ok")
    return base


P8_SHAPES = (  # (partitions, keys per partition, value bytes, segment bytes): >= 1.1 GB of base segments each
    (8, 1_500_000, 100, 32 * 2**20),
    (1, 2_700_000, 400, 64 * 2**20),
)
P8_FRACTION = 0.01
