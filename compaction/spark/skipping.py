"""The filter test on Spark (skipping clean segments): each clean segment's filter against its partition's
dirty keys, on executors.

The dirty keys can be tens of millions, so neither they nor the filters go through the driver. Shape:

1. `mapInArrow` over the dirty keys (the persisted per-key aggregate of the scan, already spread over the
   cluster) replaces each key by its 64-bit hash (`compaction.bloom.hashing`) and its partition by a small
   int: 12 bytes a key from here on, whatever the key size.
2. The clean segments of a partition are cut into *probe batches*; a broadcast join copies each hash to every
   batch of its partition, and a cogroup on (partition, batch) hands one task all the hashes and the filter
   keys of one batch. The task reads each filter once (a GET of ~1.2 bytes per key at 1%) and counts the
   positives with the compiled probe. A batch with no dirty key still gets a task (the cogroup), since its
   filters' headers alone may decide (a passed delete horizon, transactional batches).

Why this shape: reading filters is the cost this stage exists to keep small. Testing inside the key aggregate's
own partitions needs no shuffle, but every task then reads every filter, once per shuffle partition (200 on a
typical cluster), which on a 1%-change round outweighs everything the filters save; a broadcast of the hashes
would go through the driver; one filter per batch copies the hashes once per filter. Copying hashes to a few
batches is cheap while it stays rare: when 1% of the keys change, the hashes are ~10% of the filters' bytes. So
a partition's filters are cut into ceil(D x C / `PROBES_PER_TASK`) batches (D dirty keys, C filters), one unless
the probing itself (~35 ns a test) would keep one task busy for seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compaction.spark.local import local_frame
from compaction.storage.base import StoreSpec, StoreStats

PROBES_PER_TASK = 200_000_000
"""Dirty keys x filters one probe task tests: seconds of probing, at ~35 ns a test."""

_ARROW_HASHES = pa.schema([pa.field("tp", pa.int32(), False), pa.field("h", pa.int64(), False)])
_PROBED = pa.schema(
    [
        pa.field("tp", pa.int32(), False),
        pa.field("segment_id", pa.string(), False),
        pa.field("readable", pa.bool_(), False),
        pa.field("positives", pa.int64(), False),
        pa.field("filter_bytes", pa.int64(), False),
        pa.field("keys", pa.int64(), False),
        pa.field("horizon_ms", pa.int64(), False),
        pa.field("transactional", pa.bool_(), False),
        pa.field("gets", pa.int64(), False),
        pa.field("bytes_read", pa.int64(), False),
    ]
)

_PROBED_DDL = ("tp int, segment_id string, readable boolean, positives bigint, filter_bytes bigint, keys bigint, "
               "horizon_ms bigint, transactional boolean, gets bigint, bytes_read bigint")


@dataclass(frozen=True)
class FilterProbe:
    """One clean segment (of the partition of index `partition_index`) whose filter, at `filter_key`, is tested."""

    partition_index: int
    segment_id: str
    filter_key: str


@dataclass(frozen=True)
class ProbeResult:
    """What one filter said: `readable` False if it was missing or unreadable (then nothing else is known)."""

    readable: bool
    positives: int = 0
    filter_bytes: int = 0
    keys: int = 0
    horizon_ms: int = -1
    transactional: bool = False


@dataclass(frozen=True)
class ProbeOutcome:
    """Per (partition index, segment id) the result, and per partition index the store requests the probing
    made."""

    results: dict[tuple[int, str], ProbeResult] = field(default_factory=dict)
    requests: dict[int, StoreStats] = field(default_factory=dict)


def probe_batches(probes: Sequence[FilterProbe], dirty_keys: Mapping[int, int]) -> list[list[FilterProbe]]:
    """The probes of each partition cut into ceil(D x C / PROBES_PER_TASK) contiguous batches. Pure."""
    by_partition: dict[int, list[FilterProbe]] = {}
    for p in probes:
        by_partition.setdefault(p.partition_index, []).append(p)
    batches: list[list[FilterProbe]] = []
    for index, items in by_partition.items():
        work = dirty_keys.get(index, 0) * len(items)
        n = min(len(items), max(1, math.ceil(work / PROBES_PER_TASK)))
        size = math.ceil(len(items) / n)
        batches.extend(items[i : i + size] for i in range(0, len(items), size))
    return batches


def _hash_keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from compaction.bloom.hashing import key_hashes

    for b in batches:
        yield pa.RecordBatch.from_arrays([b["tp"], pa.array(key_hashes(b["key"]).view(np.int64))],
                                         schema=_ARROW_HASHES)


def _prober(spec: StoreSpec, batches: Sequence[Sequence[FilterProbe]]) -> Callable[[pa.Table], pa.Table]:
    from compaction.bloom.segment import read_filter
    from compaction.errors import KcompactError

    def probe(hashes: pa.Table) -> pa.Table:
        batch = batches[hashes["batch"][0].as_py()]
        mask = hashes["h"].is_valid()
        values = hashes["h"].filter(mask).to_numpy().view(np.uint64) if hashes.num_rows else np.empty(0, np.uint64)
        store = spec.open()
        rows = []
        for p in batch:
            before = replace(store.stats)
            try:
                f, size = read_filter(store, p.filter_key)
            except KcompactError:  # the store failed past its retries: read the segment, as without a filter
                f, size = None, 0
            used = store.stats - before
            row = {"tp": p.partition_index, "segment_id": p.segment_id, "readable": f is not None, "positives": 0,
                   "filter_bytes": size, "keys": 0, "horizon_ms": -1, "transactional": False,
                   "gets": used.gets, "bytes_read": used.bytes_read}
            if f is not None:
                row |= {"positives": f.positives(values), "keys": f.n, "horizon_ms": f.facts.horizon_ms,
                        "transactional": f.facts.transactional}
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=_PROBED)

    return probe


def probe_filters(
    spark: SparkSession,
    spec: StoreSpec,
    keys: DataFrame,
    probes: Sequence[FilterProbe],
    dirty_keys: Mapping[int, int],
) -> ProbeOutcome:
    """Test every probe's filter against the dirty keys of its partition (`keys` rows with `dirty` set).

    `keys` has columns tp (the partition index), key, dirty; `dirty_keys` counts them per partition index (to
    size the batches). Reads only
    filters; the driver receives one small typed row per filter.
    """
    if not probes:
        return ProbeOutcome()
    batches = probe_batches(probes, dirty_keys)
    pairs = local_frame(spark, [(b[0].partition_index, i) for i, b in enumerate(batches)], "tp int, batch int")
    hashes = keys.filter(F.col("dirty")).select("tp", "key").mapInArrow(_hash_keys, "tp int, h long")
    # every batch present (its filters' headers alone may decide): one row with a null hash each
    markers = local_frame(spark, [(b[0].partition_index, None, i) for i, b in enumerate(batches)],
                          "tp int, h long, batch int")
    copied = hashes.join(F.broadcast(pairs), "tp").select("tp", "h", "batch").unionByName(markers)
    probed = copied.groupBy("batch").applyInArrow(_prober(spec, batches), _PROBED_DDL).collect()
    results: dict[tuple[int, str], ProbeResult] = {}
    requests: dict[int, StoreStats] = {}
    for row in probed:
        results[(row.tp, row.segment_id)] = ProbeResult(row.readable, row.positives, row.filter_bytes, row.keys,
                                                         row.horizon_ms, row.transactional)
        requests[row.tp] = requests.get(row.tp, StoreStats()) + StoreStats(gets=row.gets, bytes_read=row.bytes_read)
    return ProbeOutcome(results, requests)
