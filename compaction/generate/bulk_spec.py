"""What determines a bulk log dir (`BulkSpec`), and the record layout its bounds follow.

Keys are `key-%010d`: `KEY_BYTES` bytes, at most `MAX_KEYS` ids. `RECORD_BOUND` bounds a record's size without
its value, so `BulkSpec.batch_bound` bounds a batch and the generator sizes its buffers from the spec alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compaction.errors import ConfigError
from compaction.format.batch import INT32_MAX, RECORD_BATCH_OVERHEAD
from compaction.format.codecs import Codec
from compaction.format.indexes import DEFAULT_INDEX_INTERVAL_BYTES
from compaction.generate.topics import TopicSpec

KEY_ORDERS = ("sequential", "uniform")
UPDATE_SPREADS = ("clustered", "random")
KEY_PREFIX = b"key-"
KEY_DIGITS = 10
KEY_BYTES = len(KEY_PREFIX) + KEY_DIGITS  # 14
MAX_KEYS = 10**KEY_DIGITS
RECORD_BOUND = 5 + 1 + 10 + 5 + 1 + KEY_BYTES + 5 + 1
"""Upper bound of a record's size without its value: length, attributes, ts delta, offset delta, key, value
length, header count varints."""


@dataclass(frozen=True)
class BulkSpec:
    """Everything that determines a bulk log dir. Validated on construction (ConfigError, exit code 2)."""

    topics: tuple[TopicSpec, ...] = (TopicSpec("bench", 1),)
    records_per_partition: int = 1_000_000
    keys: int = 1_000_000
    value_bytes: int = 100
    records_per_batch: int = 100
    segment_bytes: int = 128 * 2**20
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    codec: Codec = Codec.NONE
    tombstone_ratio: float = 0.03
    key_order: str = "sequential"
    update_fraction: float = 0.0
    update_spread: str = "clustered"
    start_ms: int = 1_700_000_000_000
    ms_per_record: int = 50
    seed: int = 42

    def __post_init__(self) -> None:
        problems = []
        if not self.topics:
            problems.append("at least one topic is needed")
        for t in self.topics:
            if t.partitions < 1:
                problems.append(f"topic {t.name!r} needs at least one partition")
        if self.records_per_partition < 0:
            problems.append(f"--records must be >= 0, got {self.records_per_partition}")
        if not 1 <= self.keys < MAX_KEYS:
            problems.append(f"--keys must be in [1, {MAX_KEYS - 1}] (keys are key-%010d), got {self.keys}")
        if self.value_bytes < 0:
            problems.append(f"--value-bytes must be >= 0, got {self.value_bytes}")
        if self.records_per_batch < 1:
            problems.append(f"--records-per-batch must be >= 1, got {self.records_per_batch}")
        elif self.batch_bound > INT32_MAX:
            problems.append("--records-per-batch × --value-bytes: a batch would exceed 2 GiB")
        if not 1 <= self.segment_bytes <= INT32_MAX:
            problems.append(f"--segment-bytes must be in [1, {INT32_MAX}], got {self.segment_bytes}")
        if self.index_interval_bytes < 0:
            problems.append(f"index interval must be >= 0, got {self.index_interval_bytes}")
        if not 0.0 <= self.tombstone_ratio <= 1.0:
            problems.append(f"--tombstone-ratio must be in [0, 1], got {self.tombstone_ratio}")
        if self.key_order not in KEY_ORDERS:
            problems.append(f"--key-order must be one of {', '.join(KEY_ORDERS)}, got {self.key_order!r}")
        if not 0.0 <= self.update_fraction <= 1.0:
            problems.append(f"--update-fraction must be in [0, 1], got {self.update_fraction}")
        if self.update_spread not in UPDATE_SPREADS:
            problems.append(
                f"--update-spread must be one of {', '.join(UPDATE_SPREADS)}, got {self.update_spread!r}"
            )
        if self.ms_per_record < 0:
            problems.append(f"--ms-per-record must be >= 0, got {self.ms_per_record}")
        if self.codec not in tuple(Codec):
            problems.append(f"unknown codec {self.codec!r}")
        if problems:
            raise ConfigError("bulk generate: " + "; ".join(problems))

    def ending_at(self, now_ms: int) -> BulkSpec:
        """This spec with its clock moved so that the last record (updates included) is stamped `now_ms`."""
        return dataclasses.replace(self, start_ms=now_ms - max(self.log_end_offset - 1, 0) * self.ms_per_record)

    @property
    def updates_per_partition(self) -> int:
        """Records appended after `records_per_partition`, each rewriting a distinct key."""
        return round(self.update_fraction * self.keys)

    @property
    def log_end_offset(self) -> int:
        return self.records_per_partition + self.updates_per_partition

    @property
    def batch_bound(self) -> int:
        """Upper bound of an uncompressed batch's size."""
        return RECORD_BATCH_OVERHEAD + self.records_per_batch * (RECORD_BOUND + self.value_bytes)
