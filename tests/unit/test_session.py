"""The log4j2 option `build_session` adds to the driver's Java options (no JVM here)."""

from __future__ import annotations

from pathlib import Path

from compaction.spark.session import LOG4J2_CONFIG, with_log4j2_config


def test_the_shipped_configuration_is_where_the_builder_looks() -> None:
    assert LOG4J2_CONFIG.is_file()
    assert "rootLogger.level = warn" in LOG4J2_CONFIG.read_text()


def test_the_option_is_a_file_uri_appended_to_the_callers_options(tmp_path: Path) -> None:
    config = tmp_path / "with space" / "log4j2.properties"
    option = f"-Dlog4j2.configurationFile={config.as_uri()}"
    assert with_log4j2_config("", config) == option
    assert with_log4j2_config("-Xss4m", config) == f"-Xss4m {option}"
    assert " " not in option.split("=", 1)[1], "one token in Spark's option string, unquoted"


def test_a_configuration_the_caller_chose_is_kept(tmp_path: Path) -> None:
    theirs = "-Dlog4j2.configurationFile=/etc/spark/log4j2.properties -Xss4m"
    assert with_log4j2_config(theirs, tmp_path / "log4j2.properties") == theirs
