"""The example Airflow DAG loads into a DagBag, passes flags the CLI accepts, and retries only exit code 4.

Airflow is not a test dependency of the project venv: it is heavy, and apache-airflow-providers-apache-spark
requires pyspark-client, whose `pyspark` package would replace pyspark itself. `make airflow-test` runs this
file in a venv of its own (.venv-airflow); in the project venv it is skipped.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from compaction.cli import build_parser
from compaction.errors import ExitCode

if importlib.util.find_spec("airflow") is None:
    pytest.skip("Airflow is not installed (kept out of the project venv: its Spark provider pulls pyspark-client, "
                "which clashes with pyspark); run `make airflow-test`", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
DAG_FOLDER = REPO / "examples" / "airflow"


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A throwaway AIRFLOW_HOME, set before airflow is first imported, and kcompact's checkout as KCOMPACT_HOME."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow-home")))
    mp.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    mp.setenv("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
    mp.setenv("KCOMPACT_HOME", str(REPO))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def dag_module(airflow_env: None) -> ModuleType:
    spec = importlib.util.spec_from_file_location("kcompact_dag", DAG_FOLDER / "kcompact_dag.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered_args(task: Any, params: dict[str, Any]) -> list[str]:
    """`application_args` with `{{ params.x }}` filled in, as Jinja would."""
    return [re.sub(r"\{\{\s*params\.(\w+)\s*\}\}", lambda m: str(params[m.group(1)]), a) for a in task.application_args]


def dag_bag() -> Any:
    """A DagBag of the example folder alone (Airflow 3 dropped `include_examples`; LOAD_EXAMPLES is off)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2
        from airflow.models.dagbag import DagBag
    try:
        return DagBag(dag_folder=str(DAG_FOLDER), include_examples=False)
    except TypeError:
        return DagBag(dag_folder=str(DAG_FOLDER))


def test_dag_loads_into_a_dagbag_without_import_errors(airflow_env: None) -> None:
    bag = dag_bag()
    assert bag.import_errors == {}
    assert list(bag.dags) == ["kcompact"]
    dag = bag.dags["kcompact"]  # not get_dag: Airflow 3 looks it up in its database
    assert set(dag.task_ids) == {"plan", "compact", "gc"}
    assert dag.get_task("plan").downstream_task_ids == {"compact"}
    assert dag.get_task("compact").downstream_task_ids == {"gc"}
    assert str(dag.get_task("gc").trigger_rule) in ("all_done", "TriggerRule.ALL_DONE")


def test_every_step_submits_a_real_job_with_flags_the_cli_accepts(dag_module: ModuleType) -> None:
    dag = dag_module.dag
    params = {k: (v.value if hasattr(v, "value") else v) for k, v in dag.params.items()}
    for task_id, command in (("plan", "plan"), ("compact", "compact"), ("gc", "gc")):
        task = dag.get_task(task_id)
        assert Path(task.application) == REPO / "jobs" / f"{command}.py"
        assert Path(task.application).is_file()
        assert Path(task.properties_file).is_file()
        args = build_parser().parse_args([command, *rendered_args(task, params)])
        assert args.store == params["store"]
    compact = build_parser().parse_args(["compact", *rendered_args(dag.get_task("compact"), params)])
    assert str(compact.metrics_file) == params["metrics_file"]


def test_exit_codes_mirror_kcompact_and_only_4_is_retried(dag_module: ModuleType,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    AirflowException, AirflowFailException = dag_module.AirflowException, dag_module.AirflowFailException

    assert dag_module.EXIT_CODES.keys() == {int(c) for c in ExitCode}
    assert dag_module.RETRYABLE_EXIT_CODE == ExitCode.RETRYABLE
    task = dag_module.dag.get_task("compact")
    assert task.retries == 3

    def outcome(message: str) -> type[BaseException]:
        def fail(self: Any, context: Any) -> None:
            raise AirflowException(message)

        monkeypatch.setattr(SparkSubmitOperator, "execute", fail)
        with pytest.raises(AirflowException) as caught:
            task.execute({})
        return caught.type

    submit = "Cannot execute: spark-submit --master yarn jobs/compact.py --store s3://b/p. Error code is: {}."
    for code in (1, 2, 3, 5):
        assert outcome(submit.format(code)) is AirflowFailException, code
    for message in (submit.format(4), submit.format(137), "spark-submit: command not found"):
        assert outcome(message) is AirflowException, message
