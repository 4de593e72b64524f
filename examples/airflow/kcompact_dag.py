"""kcompact as an Airflow DAG: plan → compact → gc, each step a spark-submit of one of kcompact's `jobs/` (compact
also applies retention.ms / retention.bytes to compact,delete topics first, as Kafka's cleaner does).

Copy this file into your DAGs folder. It needs apache-airflow (2.11+ or 3.x) and
apache-airflow-providers-apache-spark on the scheduler and workers, and a Spark connection (`spark_default`:
master, e.g. `yarn`), and kcompact checked out on the workers at $KCOMPACT_HOME (default /opt/kcompact)
with a packed environment next to it (see conf/spark-defaults.conf, passed as --properties-file). The
DAG file itself imports nothing from kcompact, so Airflow can parse it anywhere.

Parameters (DAG params; override them when triggering a run): `store` (s3://bucket/prefix), `config` (the
kcompact YAML), `metrics_file` (Prometheus textfile, written by compact), `html_report`.

What the DAG does with kcompact's exit codes (`kcompact --help`); spark-submit runs in client mode so the
driver's exit code is spark-submit's:

| code | meaning                                                     | task                                   |
|------|-------------------------------------------------------------|----------------------------------------|
| 0    | success, or nothing to do                                   | success                                |
| 1    | internal error (a bug)                                      | fails, not retried                     |
| 2    | configuration or usage error                                | fails, not retried: fix the config     |
| 3    | corrupt input: that partition quarantined, others committed | fails, not retried: alert, investigate |
| 4    | fenced or conflicting commit, transient store error         | retried with backoff: a rerun is safe  |
| else | spark-submit itself failed (no exit code from kcompact)     | retried                                |

gc runs whatever compact's outcome (trigger rule all_done): it deletes only what committed runs replaced,
once past file.delete.delay.ms, so it is safe after a failed or partial compaction.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

try:  # Airflow 3
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.exceptions import AirflowException, AirflowFailException

KCOMPACT_HOME = os.environ.get("KCOMPACT_HOME", "/opt/kcompact")

# kcompact's exit codes (compaction.errors.ExitCode), mirrored so the DAG file does not import kcompact.
EXIT_CODES = {
    0: "success or nothing to do",
    1: "internal error",
    2: "configuration or usage error",
    3: "corrupt input (partition quarantined, the others committed)",
    4: "fenced or conflicting commit, or transient store error (rerun is safe)",
    5: "verification failed",
}
RETRYABLE_EXIT_CODE = 4

_ERROR_CODE = re.compile(r"Error code is: (-?\d+)")


def kcompact_exit_code(error: BaseException) -> int | None:
    """The exit code in SparkSubmitHook's "Cannot execute: ... Error code is: N." error, if any."""
    match = _ERROR_CODE.search(str(error))
    return int(match.group(1)) if match else None


def is_retryable(code: int | None) -> bool:
    """Retry kcompact's retryable code, and failures that are not kcompact's (no or unknown exit code)."""
    return code is None or code == RETRYABLE_EXIT_CODE or code not in EXIT_CODES


class KcompactSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator that fails for good (no retry) on kcompact's non-retryable exit codes."""

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowException as exc:
            code = kcompact_exit_code(exc)
            if is_retryable(code):
                raise
            raise AirflowFailException(
                f"kcompact exited with {code}: {EXIT_CODES.get(code or 0)}; not retried") from exc


def _job(task_id: str, script: str, args: list[str], **kwargs: Any) -> KcompactSubmitOperator:
    return KcompactSubmitOperator(
        task_id=task_id,
        application=f"{KCOMPACT_HOME}/jobs/{script}",
        application_args=args,
        properties_file=f"{KCOMPACT_HOME}/conf/spark-defaults.conf",
        deploy_mode="client",
        name=f"kcompact-{task_id}",
        conn_id="spark_default",
        **kwargs,
    )


STORE_ARGS = ["--store", "{{ params.store }}", "--config", "{{ params.config }}"]

with DAG(
    dag_id="kcompact",
    description="Compact Kafka topics tiered to object storage: plan, compact on Spark, gc replaced segments",
    schedule=timedelta(hours=1),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # runs of one store take turns; a second would only be fenced (exit 4)
    params={
        "store": "s3://my-bucket/kcompact",
        "config": f"{KCOMPACT_HOME}/conf/kcompact.yaml",
        "metrics_file": "/var/lib/node_exporter/textfile/kcompact.prom",
        "html_report": "/var/log/kcompact/last-run.html",
    },
    default_args={"retries": 3, "retry_delay": timedelta(minutes=2), "retry_exponential_backoff": True},
    tags=["kafka", "compaction", "spark"],
    doc_md=__doc__,
) as dag:
    plan = _job("plan", "plan.py", [*STORE_ARGS])
    compact = _job("compact", "compact.py", [
        *STORE_ARGS, "--metrics-file", "{{ params.metrics_file }}", "--html-report", "{{ params.html_report }}",
    ])
    gc = _job("gc", "gc.py", [*STORE_ARGS], trigger_rule="all_done")
    plan >> compact >> gc
