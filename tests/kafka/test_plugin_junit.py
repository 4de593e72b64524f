"""The tiered plugin's own JUnit tests (`kafka/tiered-plugin/src/test`), run by Maven against the pinned Kafka:
the managers' pipes to their Python processes, the listing cache, the store setting checks. `make kafka` builds
the jar with `-DskipTests`; this is where the tests run."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plugins_junit_tests_pass() -> None:
    done = subprocess.run(
        ["mvn", "-B", "-q", "-Dmaven.wagon.http.retryHandler.count=0", "-f", str(ROOT / "kafka/tiered-plugin/pom.xml"),
         "test"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"mvn test failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
