"""spark-submit entry point for `kcompact verify`, with the CLI's flags:

    spark-submit jobs/verify.py --store s3://bucket/prefix --topic orders --partition 0 --before 41

Verify needs no Spark (it reads one partition on the driver); the entry point exists so a scheduler that
launches every step through spark-submit can run it the same way. It exits with kcompact's exit codes:
0 OK, 5 a key was lost or changed (see `kcompact --help`).
"""

from __future__ import annotations

import sys

from compaction.cli import run

if __name__ == "__main__":
    run(["verify", *sys.argv[1:]])
