"""Writing Kafka log dirs: what `kcompact generate`, the demo, the tests and the benchmarks read.

- `logdir`: `LogDirWriter`, the one writer of a partition directory's files (segments and their indexes,
  producer snapshots, leader-epoch-checkpoint, partition.metadata) and Kafka's roll rule;
- `topics`: the topics of a generated log dir and their deterministic topic ids;
- `workload`: a realistic mixture (Zipf keys, idempotent and transactional producers, every codec, headers,
  epoch changes), record by record: `kcompact generate`;
- `bulk` (with `bulk_spec`, `bulk_records`, `bulk_segments`, `bulk_report`): a plain workload at millions of records a
  second: `kcompact generate --bulk`.

Both generators are pure functions of their spec, the clock included: `start_ms` (or `spec.ending_at(now_ms)`)
stamps the first record, so the same spec and clock always write the same bytes.
"""

from compaction.generate.topics import TopicSpec
from compaction.generate.workload import PartitionTruth, WorkloadSpec, generate_logdir

__all__ = ["PartitionTruth", "TopicSpec", "WorkloadSpec", "generate_logdir"]
