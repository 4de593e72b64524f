"""Kafka's own tools as the referee of the files kcompact writes.

`dump_check` runs Kafka's `DumpLogSegments` over Kafka-named files (`NNNN.log`, `.index`, `.timeindex`, `.txnindex`,
`.snapshot`) and Kafka's leader-epoch checkpoint reader over `*leader-epoch-checkpoint` files (DumpLogSegments reads
none), all in one JVM (`kafka/tools-harness`, `dev.kcompact.tools.DumpCheck`), and raises AssertionError quoting the
tools' output on any error or mismatch. DumpLogSegments exits 0 with most of its findings, so its output is judged
here, by what `kafka.tools.DumpLogSegments` prints:

- `--deep-iteration` over a `.log` decodes every record of every batch (a corrupt batch throws) and prints
  `isvalid: false` for a batch whose CRC-32C does not match, `Found N invalid bytes at the end of` for a tail that is
  no batch, and on stderr `Non-consecutive offsets in F` followed by `A is followed by B` pairs. A compacted log has
  holes by design (Kafka's cleaner writes them too), so only a pair with B <= A (offsets that do not increase) is a
  finding;
- `--verify-index-only` over an `.index` prints `Mismatches in :F` when an entry's position does not start the batch
  whose last offset is the entry's offset; over a `.timeindex`, `Found timestamp mismatch in :F` (the entry's
  timestamp is not the max timestamp of the batch ending at its offset), `Found out of order timestamp in :F` and
  `The following indexed offsets are not found in the log.`;
- `--index-sanity-check` runs `OffsetIndex.sanityCheck` / `TimeIndex.sanityCheck`, the checks that decide whether a
  broker rebuilds an index at startup; a failure throws (`CorruptIndexException`);
- a `.snapshot` is read with `ProducerStateManager.readSnapshot` (version, CRC); a corrupt one prints the exception's
  message on stderr; a `.txnindex` is read with `TransactionIndex.allAbortedTxns`.

Anything else on stderr, or a non-zero exit, is a finding as well.

`materialise_partition` writes what a store holds for a partition (its live segments, from the metadata table) as
such files, so tests can hand kcompact's outputs to `dump_check`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from compaction.metadata.table import table_in_store
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import get_part, is_parts_key
from compaction.storage.layout import Suffix
from tests.kafka_runtime import run_tool

HARNESS = "tools-harness"
MAIN = "dev.kcompact.tools.DumpCheck"
EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
_VERIFIED = (".log", ".snapshot", ".txnindex", ".index", ".timeindex")
_INDEXES = (".index", ".timeindex")
_KAFKA_NAME = re.compile(r"[0-9]{20}\.(log|index|timeindex|txnindex|snapshot|leader-epoch-checkpoint)|"
                         r"(.*[-.])?leader-epoch-checkpoint")
_PAIR = re.compile(r"\s+(-?\d+) is followed by (-?\d+)")
_STACK_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")  # an exception's frames: its first line is quoted
_MAX_QUOTED_LINES = 60


def dump_check(files: Sequence[Path], workdir: Path) -> None:
    """Runs Kafka's DumpLogSegments and leader-epoch checkpoint reader over `files` in one JVM.

    `files` are Kafka-named (`00000000000000000042.log`, `.index`, `.timeindex`, `.txnindex`, `.snapshot`, and
    `leader-epoch-checkpoint`, possibly prefixed as `<offset>.leader-epoch-checkpoint`); an index needs its `.log`
    (and a time index its `.index`) beside it, as DumpLogSegments opens them. The tool's full output is kept in
    `workdir` (`dump-check.out` / `.err`).

    Raises:
        AssertionError: the tools found an error or mismatch; the message quotes their lines and names the files.
        ValueError: a file that is not Kafka-named, or an index without its log.
    """
    verify, sanity, epochs = _groups(files)
    args = [*(["--verify", *verify] if verify else []), *(["--sanity", *sanity] if sanity else []),
            *(["--epochs", *epochs] if epochs else [])]
    if not args:
        return
    workdir.mkdir(parents=True, exist_ok=True)
    done = run_tool(MAIN, args, jars=[HARNESS], logs_dir=workdir, check=False, timeout=600)
    (workdir / "dump-check.out").write_text(done.stdout)
    (workdir / "dump-check.err").write_text(done.stderr)
    problems = findings(done.stdout, done.stderr)
    if done.returncode != 0 and not problems:
        problems = [f"exit code {done.returncode}", *done.stderr.splitlines()[-20:]]
    if problems:
        quoted = "\n".join(problems[:_MAX_QUOTED_LINES])
        more = len(problems) - _MAX_QUOTED_LINES
        raise AssertionError(
            f"Kafka's DumpLogSegments / leader-epoch reader found problems in {len(files)} files "
            f"(exit code {done.returncode}; full output in {workdir}/dump-check.out and .err):\n{quoted}"
            + (f"\n... and {more} more lines" if more > 0 else "")
        )


def _groups(files: Sequence[Path]) -> tuple[list[str], list[str], list[str]]:
    verify: list[str] = []
    sanity: list[str] = []
    epochs: list[str] = []
    for f in files:
        path = Path(f).resolve()
        if not _KAFKA_NAME.fullmatch(path.name):
            raise ValueError(f"{path}: not a Kafka-named segment file, index, snapshot or leader-epoch-checkpoint")
        if path.name.endswith(EPOCH_CHECKPOINT):
            epochs.append(str(path))
            continue
        if path.suffix in _INDEXES:
            needed = [".log"] if path.suffix == ".index" else [".log", ".index"]
            for s in needed:
                if not path.with_suffix(s).is_file():
                    raise ValueError(f"{path}: DumpLogSegments reads {path.with_suffix(s).name} beside it; "
                                     "there is none")
            sanity.append(str(path))
        assert path.suffix in _VERIFIED
        verify.append(str(path))
    return verify, sanity, epochs


def findings(stdout: str, stderr: str) -> list[str]:
    """The lines of the harness's output that report an error or a mismatch (empty: all is well)."""
    problems = []
    dumping = ""
    for line in stdout.splitlines():
        if line.startswith("Dumping "):
            dumping = line
        elif "isvalid: false" in line or re.search(r"Found \d+ invalid bytes at the end of", line):
            problems.append(f"{dumping}: {line}")
    lines = stderr.splitlines()
    snapshot = ""  # the producer snapshot being read: DumpLogSegments' message about a corrupt one does not name it
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("==== "):
            snapshot = line.removeprefix("==== snapshot ") if line.startswith("==== snapshot ") else ""
            i += 1
        elif not line.strip() or _STACK_FRAME.match(line):
            i += 1
        elif line.startswith("Non-consecutive offsets in "):
            pairs = []
            i += 1
            while i < len(lines) and _PAIR.fullmatch(lines[i]):
                pairs.append(lines[i])
                i += 1
            bad = [p for p in pairs if _not_increasing(p)]
            if bad:
                problems += [line + " (offsets that do not increase)", *bad]
        else:
            problems.append(f"{snapshot}: {line}" if snapshot else line)
            i += 1
    return problems


def _not_increasing(pair: str) -> bool:
    m = _PAIR.fullmatch(pair)
    assert m is not None
    return int(m.group(2)) <= int(m.group(1))


def _file_name(start_offset: int, end_offset: int, suffix: Suffix) -> str:
    """Kafka's file name of a segment's file: the producer snapshot is named by the offset after the segment (the
    snapshot Kafka's RemoteLogManager copies with it), the others by the segment's base offset."""
    if suffix is Suffix.PRODUCER_SNAPSHOT:
        return f"{end_offset + 1:020d}.snapshot"
    return f"{start_offset:020d}.{suffix.value}"


def materialise_partition(store: ObjectStore | str | Path, topic: str, partition: int, dest: Path,
                          version: int | None = None) -> list[Path]:
    """Writes the live segments of `topic`-`partition` (metadata table at `version`, default the latest) into `dest`
    as Kafka-named files, one set per segment: `<base>.log`, `.index`, `.timeindex`, `.txnindex` (when the segment
    has one), `<end + 1>.snapshot` and `<base>.leader-epoch-checkpoint`, each an object of its own or a part of the
    segment's `.indexes` object; kcompact's key filter is left out. Returns the files written, in offset order."""
    opened = store if isinstance(store, ObjectStore) else open_store(str(store))
    segments = table_in_store(opened).live_segments(topic, partition, version)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for seg in segments:
        for obj in seg.object_keys:
            if obj.suffix in (Suffix.BLOOM, Suffix.INDEXES):
                continue
            path = dest / _file_name(seg.start_offset, seg.end_offset, obj.suffix)
            if is_parts_key(obj.key):  # a part of the segment's .indexes object
                path.write_bytes(get_part(opened, obj.key, obj.suffix))
            else:
                opened.get_to_file(obj.key, path)
            written.append(path)
    return written


def dump_check_store(store: ObjectStore | str | Path, partitions: Sequence[tuple[str, int]],
                     workdir: Path) -> list[Path]:
    """`materialise_partition` for each partition into `workdir/<topic>-<partition>`, then one `dump_check` over all
    of them. Returns the files checked."""
    files: list[Path] = []
    for topic, partition in partitions:
        files += materialise_partition(store, topic, partition, workdir / f"{topic}-{partition}")
    dump_check(files, workdir / "dump")
    return files
