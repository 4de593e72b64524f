"""Per-segment key filters and what they let a compaction round leave unread.

Re-reading cleaned remote segments every round is what makes tiered compaction expensive; a filter per segment
lets a round skip the ones that cannot hold a changed key. `filter` is the bloom filter and its stored format,
`hashing` the stable key hash, `segment` a segment's filter from its scan and its object key, `sizing` the rate
derived from the data, `skipping` the policy that decides when a cleaned segment may be kept as it is.
No pyspark here: all of it runs on executors too.
"""

from __future__ import annotations

from compaction.bloom.filter import FilterFacts, FilterFormatError, KeyFilter, filter_shape
from compaction.bloom.segment import filter_key, read_filter, segment_filter
from compaction.bloom.skipping import Verdict, regroup_around, verdict

__all__ = [
    "FilterFacts",
    "FilterFormatError",
    "KeyFilter",
    "Verdict",
    "filter_key",
    "filter_shape",
    "read_filter",
    "regroup_around",
    "segment_filter",
    "verdict",
]
