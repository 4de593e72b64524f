"""MECHANISM: executor-side rewriting of segments (filtering and re-encoding batches). Imports no pyspark.

`rewrite_group` turns one group of consecutive segments into one cleaned segment; the decisions it carries
out come from `compaction.strategies`.
"""

from __future__ import annotations

from compaction.rewrite.group import RewriteOutput, SegmentInput, rewrite_group
from compaction.rewrite.stats import RewriteStats
from compaction.strategies.retention import ActiveProducer
from compaction.strategies.transactions import TransactionState

__all__ = ["ActiveProducer", "RewriteOutput", "RewriteStats", "SegmentInput", "TransactionState", "rewrite_group"]
