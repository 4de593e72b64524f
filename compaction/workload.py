"""The realistic log-dir generator under its first name: `compaction.generate.workload` is where it lives.

Kept so that existing callers (the tests, docs/notebook.md) keep importing `compaction.workload`.
"""

from compaction.generate.topics import TopicSpec
from compaction.generate.workload import PartitionTruth, WorkloadSpec, generate_logdir

__all__ = ["PartitionTruth", "TopicSpec", "WorkloadSpec", "generate_logdir"]
