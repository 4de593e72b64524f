"""spark-submit entry point for `kcompact table`, with the CLI's flags:

    spark-submit --master yarn jobs/table.py --store s3://bucket/prefix --config conf/kcompact.yaml \
        --topic orders --table s3://bucket/tables/orders

Thin by design: it hands its arguments to the CLI, which builds the session (keeping spark-submit's
master), runs the step and exits with kcompact's exit codes (see `kcompact --help`).
"""

from __future__ import annotations

import sys

from compaction.cli import run

if __name__ == "__main__":
    run(["table", *sys.argv[1:]])
