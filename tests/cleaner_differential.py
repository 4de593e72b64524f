"""Kafka's own cleaner as the referee of kcompact's: random partitions, two cleaning rounds each, compared batch by
batch and record by record (tests/kafka/test_cleaner_differential.py; docs/fidelity.md).

A workload is one partition (`ScenarioLog`) built from two rounds of appends (`Op`s, drawn by `workload()` from a
Random that hypothesis seeds): plain, idempotent and transactional batches of every codec with tombstones and
headers, COMMIT and ABORT markers, leader epoch changes and rolls. Each round ends with a roll and may leave a few
batches in the new active segment, so a round always has something dirty and never cleans the active segment.

The Kafka side (`KafkaSide`) keeps a copy of each partition dir and runs `dev.kcompact.cleaner.CleanerHarness`
(kafka/cleaner-harness) over all of them in one JVM per round: `LogCleanerManager.cleanableOffsets` from the
checkpoint of the round before, then `Cleaner.doClean(cleanable, now)`. Between rounds, the batches appended since
are laid over Kafka's dir: the files of the old active segment (which no round cleans) and of every later one.

`log_batches` decodes a segment with kafka-python (CRC checked); `differences` compares two decoded logs and
names, for each difference, the batch and the field.
"""

from __future__ import annotations

import random
import re
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compaction.format.batch import DELETE_HORIZON_FLAG_MASK, Header, Record
from compaction.format.codecs import Codec
from tests.kafka_dump import dump_check, findings
from tests.kafka_runtime import run_tool
from tests.scenario_log import RemoteRecord, ScenarioLog

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

HARNESS = "dev.kcompact.cleaner.CleanerHarness"
KEYS = 6


# --- workloads ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One append: `data` (records of `producer`, or none), `commit` / `abort` (a marker), `epoch` (a new
    leader) or `roll`. `step_ms` moves the append clock first."""

    kind: str
    producer: int | None = None
    records: tuple[tuple[int, bytes | None, tuple[Header, ...]], ...] = ()
    codec: Codec = Codec.NONE
    step_ms: int = 0


@dataclass(frozen=True)
class Producer:
    pid: int
    epoch: int
    transactional: bool


@dataclass(frozen=True)
class Workload:
    producers: tuple[Producer, ...]
    rounds: tuple[tuple[Op, ...], tuple[Op, ...]]


CODECS = tuple(Codec)


def _records(rnd: random.Random) -> tuple[tuple[int, bytes | None, tuple[Header, ...]], ...]:
    """1-4 records: a key of `KEYS`, a value (a tombstone one time in four) and up to two headers."""
    def value() -> bytes | None:
        return None if rnd.random() < 0.25 else rnd.randbytes(rnd.randint(0, 6))

    def headers() -> tuple[Header, ...]:
        return tuple(Header(rnd.choice("hv"), None if rnd.random() < 0.3 else rnd.randbytes(rnd.randint(0, 3)))
                     for _ in range(rnd.choice((0, 0, 1, 2))))

    return tuple((rnd.randrange(KEYS), value(), headers()) for _ in range(rnd.randint(1, 4)))


def workload(rnd: random.Random) -> Workload:
    """Two rounds of appends to one partition. A transaction a round opens may stay open, or be committed or
    aborted later, in the same round or the next; each round ends with a roll and 0-2 appends after it."""
    producers = tuple(Producer(1000 + i, rnd.randint(0, 2), rnd.random() < 0.6) for i in range(rnd.randint(0, 3)))
    open_txns: set[int] = set()
    rounds: list[tuple[Op, ...]] = []
    for _ in range(2):
        ops: list[Op] = []
        body = rnd.randint(2, 16)
        for i in range(body + 1 + rnd.randint(0, 2)):
            if i == body:
                ops.append(Op("roll"))
                continue
            step = rnd.choice((0, 1, 7, 1000))
            choice = rnd.randrange(10)
            if choice <= 5 or (choice <= 7 and not open_txns):
                p = rnd.choice((None, *producers))
                if p is not None and p.transactional:
                    open_txns.add(p.pid)
                ops.append(Op("data", p.pid if p else None, _records(rnd), rnd.choice(CODECS), step))
            elif choice <= 7:
                pid = rnd.choice(sorted(open_txns))
                open_txns.discard(pid)
                ops.append(Op(rnd.choice(("commit", "abort")), pid, step_ms=step))
            elif choice == 8 and i < body:
                ops.append(Op("roll"))
            else:
                ops.append(Op("epoch"))
        rounds.append(tuple(ops))
    return Workload(producers, (rounds[0], rounds[1]))


@dataclass
class Appender:
    """Applies a workload's ops to its `ScenarioLog`, keeping each producer's next sequence."""

    log: ScenarioLog
    producers: dict[int, Producer]
    sequences: dict[int, int] = field(default_factory=dict)

    def apply(self, ops: Iterable[Op]) -> None:
        for op in ops:
            self.log.timestamp += op.step_ms
            if op.kind == "roll":
                self.log.roll()
            elif op.kind == "epoch":
                self.log.leader_epoch += 1
            elif op.kind in ("commit", "abort"):
                assert op.producer is not None
                marker = self.log.commit if op.kind == "commit" else self.log.abort
                marker(op.producer, self.producers[op.producer].epoch)
            else:
                self._data(op)

    def _data(self, op: Op) -> None:
        start = self.log.next_offset
        records = [Record(start + i, self.log.timestamp + i, str(k).encode(), v, h)
                   for i, (k, v, h) in enumerate(op.records)]
        fields: dict[str, object] = {"codec": op.codec}
        if op.producer is not None:
            p = self.producers[op.producer]
            seq = self.sequences.get(p.pid, 0)
            self.sequences[p.pid] = seq + len(records)
            fields |= {"producer_id": p.pid, "producer_epoch": p.epoch, "base_sequence": seq,
                       "transactional": p.transactional}
        self.log.append_records(records, **fields)


# --- the Kafka side ----------------------------------------------------------------------------------------

_SEGMENT_FILES = (".log", ".index", ".timeindex", ".txnindex", ".snapshot")


def _base(filename: str) -> int:
    """The offset a segment or snapshot file is named after."""
    return int(filename.split(".", 1)[0])


@dataclass(frozen=True)
class KafkaRound:
    """What `CleanerHarness` printed for one partition."""

    first_dirty: int
    first_uncleanable: int
    checkpoint: int
    groups: tuple[int, ...]


@dataclass
class KafkaSide:
    """Copies of the partition dirs, cleaned by Kafka's Cleaner round by round."""

    root: Path
    configs: dict[str, str]
    checkpoints: dict[str, int] = field(default_factory=dict)
    active_bases: dict[str, int] = field(default_factory=dict)

    def lay_over(self, written: Path) -> None:
        """Bring Kafka's copy of the partition dir `written` up to date: the first time a plain copy, later the
        files of the old active segment and every later offset (which no round has cleaned), and the
        leader-epoch checkpoint."""
        target = self.root / written.name
        if written.name not in self.active_bases:
            shutil.copytree(written, target)
        else:
            since = self.active_bases[written.name]
            for f in written.iterdir():
                if f.suffix in _SEGMENT_FILES and _base(f.name) < since:
                    continue
                if f.name != "partition.metadata":
                    shutil.copyfile(f, target / f.name)
        self.active_bases[written.name] = max(_base(f.name) for f in written.glob("*.log"))

    def clean(self, bounds: Mapping[str, int | None], now_ms: int, logs_dir: Path) -> dict[str, KafkaRound]:
        """One round at `now_ms` over the partitions named in `bounds`, all in one JVM; each partition's first
        uncleanable offset is at most its bound (`tier_bound`)."""
        args = ["--now", str(now_ms)]
        for k, v in self.configs.items():
            args += ["--config", f"{k}={v}"]
        args += [f"{self.root / n}={self.checkpoints.get(n, -1)}:{-1 if b is None else b}" for n, b in bounds.items()]
        names = list(bounds)
        done = run_tool(HARNESS, args, jars=["cleaner-harness"], logs_dir=logs_dir)
        out = {}
        for line in done.stdout.splitlines():
            path, first_dirty, uncleanable, checkpoint, *groups = line.split()
            name = Path(path).name
            out[name] = KafkaRound(int(first_dirty), int(uncleanable), int(checkpoint), tuple(map(int, groups)))
            self.checkpoints[name] = int(checkpoint)
        assert sorted(out) == sorted(names), done.stdout + done.stderr
        return out

    def inactive_files(self, name: str) -> list[Path]:
        """The files of Kafka's inactive segments (what a tier would hold), offset indexes and logs included."""
        bases = sorted(_base(f.name) for f in (self.root / name).glob("*.log"))[:-1]
        return [f for base in bases for suffix in (".log", ".index", ".timeindex", ".txnindex")
                if (f := self.root / name / f"{base:020d}{suffix}").is_file()]

    def segments(self, name: str) -> list[tuple[int, bytes]]:
        """(base offset, bytes) of every segment of Kafka's copy, in order, the active one included."""
        files = sorted((_base(f.name), f) for f in (self.root / name).glob("*.log"))
        return [(base, f.read_bytes()) for base, f in files]


def tier_bound(log: ScenarioLog) -> int | None:
    """Where a remote tier of `log` must stop cleaning though Kafka need not: the base of the segment holding the
    first batch of a transaction with no marker below the active segment (the tier never holds the active
    segment, so a marker there is unseen; kcompact rounds its first unstable offset down to a segment base)."""
    end = log.segment_bases[-1]
    open_txns: dict[int, int] = {}
    for b in log.batches:
        if b.base_offset >= end:
            break
        if b.is_transactional and b.is_control:
            open_txns.pop(b.producer_id, None)
        elif b.is_transactional:
            open_txns.setdefault(b.producer_id, b.base_offset)
    if not open_txns:
        return None
    first = min(open_txns.values())
    return max(base for base in log.segment_bases if base <= first)


# --- decoding and comparing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodedBatch:
    """Every header field the cleaner decides, and the records (CRC checked on decoding)."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    attributes: int
    partition_leader_epoch: int
    base_timestamp: int
    max_timestamp: int
    records: tuple[RemoteRecord, ...]

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & 0x7)


BATCH_FIELDS = ("base_offset", "last_offset", "producer_id", "producer_epoch", "base_sequence", "attributes",
                "partition_leader_epoch", "base_timestamp", "max_timestamp")


def log_batches(data: bytes, where: str) -> list[DecodedBatch]:
    """The batches of one `.log`, decoded by kafka-python; fails naming `where` on a bad CRC."""
    out = []
    records = MemoryRecords(data)
    while records.has_next():
        b = records.next_batch()
        assert b.validate_crc(), f"{where}: bad CRC in the batch at {b.base_offset}"
        out.append(DecodedBatch(
            b.base_offset, b.last_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.attributes,
            b.leader_epoch, b.first_timestamp, b.max_timestamp,
            tuple(RemoteRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in b),
        ))
    return out


def differences(name: str, kafka: Sequence[DecodedBatch], ours: Sequence[DecodedBatch],
                later_producers: frozenset[int] = frozenset()) -> tuple[list[str], list[tuple[int, str]]]:
    """Every difference between two decoded logs, one line each naming the partition, the batch and the field, and
    apart, the differences docs/fidelity.md allows: a batch only kcompact kept, empty, of a producer that wrote again
    above the tier's end (`later_producers`; Kafka judges its last batch by the log end, kcompact by the tier's),
    each with its base offset."""
    out: list[str] = []
    allowed: list[tuple[int, str]] = []
    by_base = {b.base_offset: b for b in ours}
    kafka_bases = {b.base_offset for b in kafka}
    for k in kafka:
        o = by_base.get(k.base_offset)
        if o is None:
            out.append(f"{name}: batch @{k.base_offset} (last {k.last_offset}, {len(k.records)} records) "
                       "only in Kafka's")
            continue
        for f in BATCH_FIELDS:
            if getattr(k, f) != getattr(o, f):
                out.append(f"{name}: batch @{k.base_offset}: {f} kafka={getattr(k, f)!r} kcompact={getattr(o, f)!r}")
        k_recs = {r.offset: r for r in k.records}
        o_recs = {r.offset: r for r in o.records}
        for off in sorted(k_recs.keys() | o_recs.keys()):
            kr, orr = k_recs.get(off), o_recs.get(off)
            if kr is None or orr is None:
                out.append(f"{name}: batch @{k.base_offset}: record @{off} only in "
                           f"{'kcompact' if kr is None else 'Kafka'}'s")
            elif kr != orr:
                fields = [f for f in ("timestamp", "key", "value", "headers") if getattr(kr, f) != getattr(orr, f)]
                out += [f"{name}: batch @{k.base_offset}: record @{off}: {f} kafka={getattr(kr, f)!r} "
                        f"kcompact={getattr(orr, f)!r}" for f in fields]
    for b in ours:
        if b.base_offset in kafka_bases:
            continue
        line = f"{name}: batch @{b.base_offset} (last {b.last_offset}, {len(b.records)} records) only in kcompact's"
        if not b.records and b.producer_id in later_producers:
            allowed.append((b.base_offset, f"{line}: empty, its producer {b.producer_id} wrote again above the tier"))
        else:
            out.append(line)
    return out, allowed


def later_producers(log: ScenarioLog) -> frozenset[int]:
    """The producers with a batch in `log`'s active segment (above the tier's end)."""
    end = log.segment_bases[-1]
    return frozenset(b.producer_id for b in log.batches if b.base_offset >= end and b.producer_id >= 0)


@dataclass
class Tally:
    """What Kafka's cleaner did over the rounds compared, so that a run shows it compared something."""

    cleaned: int = 0
    batches: int = 0
    records: int = 0
    removed: int = 0
    empty: int = 0
    horizons: int = 0
    control: int = 0
    codecs: set[Codec] = field(default_factory=set)

    def add(self, done: KafkaRound, segments: Sequence[tuple[int, bytes]]) -> None:
        self.cleaned += bool(done.groups)
        batches = [b for base, data in segments[:-1] for b in log_batches(data, str(base))]
        self.batches += len(batches)
        self.records += sum(len(b.records) for b in batches)
        self.removed += sum(b.last_offset - b.base_offset + 1 - len(b.records) for b in batches)
        self.empty += sum(not b.records for b in batches)
        self.horizons += sum(b.has_delete_horizon for b in batches)
        self.control += sum(bool(b.attributes & 0x20) for b in batches)
        self.codecs |= {b.codec for b in batches if b.records}

    def __str__(self) -> str:
        return (f"{self.cleaned} partition rounds cleaned by Kafka; compared {self.batches} batches ({self.empty} "
                f"empty, {self.horizons} with a delete horizon, {self.control} control) and {self.records} records "
                f"({self.removed} offsets removed within kept batches); codecs {sorted(c.name for c in self.codecs)}")


def index_differences(name: str, kafka: Sequence[Path], ours: Sequence[Path],
                      excused: frozenset[int] = frozenset()) -> tuple[list[str], list[str]]:
    """Kafka's offset, time and transaction indexes of the inactive segments against kcompact's, byte for byte (an
    absent `.txnindex` is an empty one); apart, those of the segments `excused` (by base offset: they hold a batch
    whose difference docs/fidelity.md allows, which moves their index entries)."""
    theirs = {f.name: f.read_bytes() for f in kafka if f.suffix in (".index", ".timeindex", ".txnindex")}
    mine = {f.name: f.read_bytes() for f in ours if f.suffix in (".index", ".timeindex", ".txnindex")}
    out: list[str] = []
    allowed: list[str] = []
    for file in sorted(theirs.keys() | mine.keys()):
        k, o = theirs.get(file, b""), mine.get(file, b"")
        if k != o and (file.endswith(".txnindex") or (file in theirs and file in mine)):
            at = next((i for i, (a, b) in enumerate(zip(k, o, strict=False)) if a != b), min(len(k), len(o)))
            line = f"{name}: {file}: kafka {len(k)} bytes, kcompact {len(o)} bytes, first difference at byte {at}"
            (allowed if _base(file) in excused else out).append(line)
    return out, allowed


_PARTITION_DIR = re.compile(r"\S*/([^/\s]+-\d+)/")


def _dump_findings(files: Sequence[Path], workdir: Path) -> list[str]:
    """DumpLogSegments' findings over `files`, one string each (a line naming the file and the indented lines
    after it), every path cut to `<topic>-<partition>/<file>`."""
    try:
        dump_check(files, workdir)
        return []
    except AssertionError:
        lines = findings((workdir / "dump-check.out").read_text(), (workdir / "dump-check.err").read_text())
    out: list[str] = []
    for line in lines:
        line = _PARTITION_DIR.sub(r"\1/", line)
        if out and line[:1].isspace():
            out[-1] += " |" + line
        else:
            out.append(line)
    return out


_FINDING_FILE = re.compile(r"([^/\s]+-\d+)/(\d{20})\.")


def dump_differences(kafka: Sequence[Path], ours: Sequence[Path], workdir: Path,
                     excused: frozenset[tuple[str, int]] = frozenset()) -> tuple[list[str], list[str]]:
    """What Kafka's DumpLogSegments finds in kcompact's files and not in Kafka's own cleaner's output of the same
    round: it flags, for one, a time index entry whose batch the cleaner emptied (RETAIN_EMPTY keeps the batch's
    max timestamp, DumpLogSegments compares the entry with its records' timestamps), which Kafka writes too. Apart:
    the findings in the files of the segments `excused` ((partition dir, base offset): see `index_differences`)."""
    mine = _dump_findings(ours, workdir / "kcompact")
    if not mine:
        return [], []
    theirs = set(_dump_findings(kafka, workdir / "kafka"))
    out: list[str] = []
    allowed: list[str] = []
    for finding in mine:
        if finding in theirs:
            continue
        named = _FINDING_FILE.search(finding)
        excuse = named is not None and (named.group(1), int(named.group(2))) in excused
        (allowed if excuse else out).append(f"DumpLogSegments on kcompact's files: {finding}")
    return out, allowed
