"""A fresh process compiles no kernel: every signature a run calls is in the caches `compaction.prebuild.kernels` fills.

One fresh interpreter, with `KCOMPACT_PREBUILT_KERNELS_ONLY=1` in its environment (its local-mode executors inherit
it), tiers a generated log and uploads its active segments as WAL objects, then runs what users run on it: compact
and verify under the three strategies, read_partition in both isolations, the topic table, the WAL roll and gc. A kernel
called with argument types that `build.py` did not warm raises `KernelNotBuilt` instead of compiling, so the
process fails naming it. This is the check behind "a fresh clone's first run compiles nothing".
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compaction.kernels.cache import PREBUILT_ONLY

ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 1_790_000_000_000
CONFIG = """
defaults:
  cleanup.policy: compact
  min.cleanable.dirty.ratio: 0.0
  delete.retention.ms: 0
topics:
  orders: {}
  users:
    compaction.strategy: header
    compaction.strategy.header: version
  events:
    compaction.strategy: timestamp
"""


@pytest.mark.spark
def test_a_fresh_process_runs_everything_on_prebuilt_kernels(tmp_path: Path) -> None:
    (tmp_path / "kcompact.yaml").write_text(CONFIG)
    script = textwrap.dedent(f"""
        from pathlib import Path

        import compaction
        from compaction.generate.workload import TopicSpec, WorkloadSpec, generate_logdir
        from compaction.metadata import table_in_store
        from compaction.spark.session import build_session
        from compaction.storage import open_store
        from compaction.tier import tier_logdir
        from compaction.wal.roll import roll
        from compaction.wal.upload import upload_logdir
        from compaction.config import load_config

        root, now = Path({str(tmp_path)!r}), {NOW_MS}
        config = str(root / "kcompact.yaml")
        spec = WorkloadSpec(topics=(TopicSpec("orders", 2), TopicSpec("users", 1), TopicSpec("events", 1)),
                            records_per_partition=600, keys=60, segment_bytes=8 * 1024).ending_at(now - 60_000)
        generate_logdir(root / "logs", spec)
        store = open_store(str(root / "store"))
        tier_logdir(root / "logs", store, table_in_store(store, create=True), now)
        upload_logdir(root / "logs", store, now)
        before = table_in_store(store).version()
        spark = build_session()
        compaction.compact(spark, store, config, now)
        for isolation in ("read_uncommitted", "read_committed"):
            assert compaction.read_partition(spark, store, "orders", 0, isolation=isolation).count() > 0
        compaction.table(spark, store, config, "users", str(root / "users-table"), now)
        for topic in ("orders", "users", "events"):
            checked = compaction.verify(store, topic, 0, before, config=config, spark=spark)
            assert checked.ok, checked.to_dict()
        roll(spark, store, load_config(config), now + 30 * 86_400_000)
        compaction.gc(store, config, now + 2 * 86_400_000)
        spark.stop()
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{PREBUILT_ONLY: "1"})
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-6000:]
