"""spark-submit entry point: write a partition's consumer view (as `kcompact read` sees it) to Parquet.

    spark-submit jobs/read_partition.py --store s3://bucket/prefix --topic orders --partition 0 --out /tmp/orders-0

Thin by design: parse arguments, build the session, call `compaction.read_partition`, exit with kcompact's codes.
"""

from __future__ import annotations

import argparse
import sys

from compaction import read_partition
from compaction.errors import KcompactError
from compaction.spark.session import build_session
from compaction.storage import open_store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="./kcompact-store")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", required=True, type=int)
    parser.add_argument("--from-offset", type=int, default=0)
    parser.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"])
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2])")
    args = parser.parse_args(argv)
    spark = build_session(args.master, "kcompact-read-partition")
    try:
        df = read_partition(spark, open_store(args.store), args.topic, args.partition,
                            from_offset=args.from_offset, isolation=args.isolation)
        df.write.mode("overwrite").parquet(args.out)
    except KcompactError as exc:
        print(f"read_partition: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
