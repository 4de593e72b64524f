"""spark-submit entry point for `kcompact verify`, with the CLI's flags, on Spark:

    spark-submit jobs/verify.py --store s3://bucket/prefix --topic orders --partition 0 --before 41

The executors read the segments and compare the two versions (`compaction.spark.verify`), so the driver stays
small whatever the partition's size; the verdict and its output are the CLI's. Thin by design: parse the
arguments, build the session (keeping spark-submit's master), call `compaction.verify.verify_partition`, exit
with kcompact's codes: 0 OK, 5 a key was lost or changed, 2 a usage error (a --before gc made unreadable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from compaction.config import load_config
from compaction.errors import ExitCode, KcompactError
from compaction.spark.session import build_session
from compaction.storage import open_store
from compaction.verify import verify_partition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="./kcompact-store")
    parser.add_argument("--endpoint-url", default=None,
                        help="S3 endpoint (default: AWS_ENDPOINT_URL or the AWS default)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", required=True, type=int)
    parser.add_argument("--before", required=True, type=int, metavar="VERSION")
    parser.add_argument("--after", type=int, default=None, metavar="VERSION")
    parser.add_argument("--config", default=None, help="kcompact YAML config: the topic's compaction.strategy")
    parser.add_argument("--max-keys", type=int, default=20, help="keys listed in the text output")
    parser.add_argument("--json", action="store_true", help="print the verdict and the listed keys as JSON")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2])")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config).for_topic(args.topic) if args.config is not None else None
        store = open_store(args.store, endpoint_url=args.endpoint_url)
        spark = build_session(args.master, "kcompact-verify")
        try:
            report = verify_partition(store, args.topic, args.partition, args.before, args.after, config=config,
                                      spark=spark)
        finally:
            spark.stop()
    except KcompactError as exc:
        print(f"kcompact verify: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    if args.json:
        print(json.dumps({"store": args.store, **report.to_dict()}, indent=2))
    else:
        for line in report.render_text(args.max_keys):
            print(line)
    return ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as `kcompact`: deltalake's runtime may abort the interpreter's teardown (delta-rs#2184)
