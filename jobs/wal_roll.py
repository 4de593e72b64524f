"""spark-submit entry point for `kcompact wal roll`, with the CLI's flags:

    spark-submit --master yarn jobs/wal_roll.py --store s3://bucket/prefix --config conf/kcompact.yaml

Thin by design: it hands its arguments to the CLI, which builds the session (keeping spark-submit's
master), rolls the WAL into tiered segments and exits with kcompact's exit codes (see `kcompact --help`).
"""

from __future__ import annotations

import sys

from compaction.cli import run

if __name__ == "__main__":
    run(["wal", "roll", *sys.argv[1:]])
