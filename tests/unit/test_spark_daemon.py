"""`compaction.spark.daemon.without_spark_zips`: Spark's zips leave the workers' path only when they hold the very
pyspark the path imports without them."""

from __future__ import annotations

from pathlib import Path

from compaction.spark.daemon import without_spark_zips


def _package(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    return root / name


def _zips(lib: Path) -> list[str]:
    lib.mkdir(parents=True)
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / name).write_bytes(b"")
    return [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]


def test_a_pip_installs_zips_leave_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    zips = _zips(_package(site, "pyspark") / "python" / "lib")
    _package(site, "py4j")
    path = [*zips, str(tmp_path / "jars" / "spark-core.jar"), str(site)]
    assert without_spark_zips(path) == [str(tmp_path / "jars" / "spark-core.jar"), str(site)]


def test_a_distributions_zips_stay_when_the_environment_has_no_pyspark(tmp_path: Path) -> None:
    zips = _zips(tmp_path / "spark-home" / "python" / "lib")
    site = tmp_path / "site-packages"
    _package(site, "compaction")
    path = [*zips, str(site)]
    assert without_spark_zips(path) == path


def test_zips_of_another_spark_stay_beside_an_installed_pyspark(tmp_path: Path) -> None:
    """SPARK_HOME elsewhere than the installed package: its zips may hold another version, so they keep their place."""
    zips = _zips(tmp_path / "spark-home" / "python" / "lib")
    site = tmp_path / "site-packages"
    _package(site, "pyspark")
    _package(site, "py4j")
    path = [*zips, str(site)]
    assert without_spark_zips(path) == path


def test_the_zips_stay_when_py4j_is_only_zipped(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    zips = _zips(_package(site, "pyspark") / "python" / "lib")
    path = [*zips, str(site)]
    assert without_spark_zips(path) == path


def test_a_path_without_zips_is_left_as_it_is(tmp_path: Path) -> None:
    assert without_spark_zips([str(tmp_path), "/nowhere"]) == [str(tmp_path), "/nowhere"]
