"""spark-submit entry point for `kcompact verify`, with the CLI's flags:

    spark-submit jobs/verify.py --store s3://bucket/prefix --topic orders --partition 0 --before 41

Thin by design: it hands its arguments to the CLI, whose verify compares the two versions on Spark
(`compaction.spark.verify`: the executors read the segments, the driver stays small whatever the partition's
size), keeping spark-submit's master, and exits with kcompact's exit codes: 0 OK, 5 a key was lost or changed,
2 a usage error (see `kcompact --help`).
"""

from __future__ import annotations

import sys

from compaction.cli import run

if __name__ == "__main__":
    run(["verify", *sys.argv[1:]])
