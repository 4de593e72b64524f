"""conf/spark-defaults.conf, the properties file README and docs/operating.md pass to spark-submit: a file Spark reads
line by line (`key value`, `#` comments), checked here without a cluster (tests/cluster runs it on one)."""

from __future__ import annotations

import re
from pathlib import Path

from compaction.spark.session import LOCAL_DEFAULTS, NO_HUGE_PAGE_REQUESTS, WORKER_HUGE_PAGES

CONF = Path(__file__).resolve().parents[2] / "conf" / "spark-defaults.conf"


def settings() -> list[tuple[str, str]]:
    """Every setting of the file, in order: each line that is not blank or a comment split at its first blank."""
    found = []
    for number, line in enumerate(CONF.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"(spark\.[A-Za-z0-9_.]+)\s+(\S.*)", line)
        assert match, f"{CONF.name}:{number} is neither a comment nor `spark.<key> <value>`: {line[:80]!r}"
        found.append((match[1], match[2]))
    return found


def test_every_line_is_a_comment_or_one_spark_setting() -> None:
    keys = [key for key, _value in settings()]
    assert len(keys) >= 20
    assert len(set(keys)) == len(keys), "a key set twice: Spark keeps the last"


def test_the_submitted_workers_numpy_is_set_as_a_local_sessions() -> None:
    values = dict(settings())
    assert values[WORKER_HUGE_PAGES] == LOCAL_DEFAULTS[WORKER_HUGE_PAGES] == NO_HUGE_PAGE_REQUESTS
    assert "spark.executorEnv.GLIBC_TUNABLES" not in values
