#!/usr/bin/env bash
# `make delta-readers-test`'s setup: .venv-delta, a venv of pyspark 4.2.0 and delta-spark (no delta-spark
# supports the project's pyspark 4.3), and .delta-jars, the JVM side of delta-spark and hadoop-aws from Maven
# Central (tests/delta_readers/pom.xml, pinned) less the jars pyspark already ships. Cached: a rerun with unchanged
# pins does nothing. If Maven Central cannot serve an artifact, this fails at once (no retries), naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3.11}
VENV=.venv-delta
JARS=.delta-jars
POM=tests/delta_readers/pom.xml
PINS=(pyspark==4.2.0 delta-spark==4.4.0 py4j==0.10.9.9 importlib_metadata==8.7.1 zipp==4.1.2)
MVN=(mvn -B -q -Dmaven.wagon.http.retryHandler.count=0 -Dmaven.wagon.httpconnectionManager.ttlSeconds=5
     -Dorg.slf4j.simpleLogger.log.org.apache.maven.cli.transfer.Slf4jMavenTransferListener=warn)

command -v mvn >/dev/null || { echo "make delta-readers-test: needs Maven (mvn) on PATH" >&2; exit 2; }
command -v java >/dev/null || { echo "make delta-readers-test: needs a JDK 17 (java) on PATH" >&2; exit 2; }

want="${PINS[*]}"
if [[ "$(cat "$VENV/.installed" 2>/dev/null)" != "$want" ]]; then
    echo "make delta-readers-test: building $VENV (${PINS[*]}; pyspark is a ~450 MB sdist)"
    test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "${PINS[@]}"
    "$VENV/bin/pip" check
    echo "$want" > "$VENV/.installed"
fi

want=$(cat "$POM" "$VENV/.installed" | sha256sum | cut -c1-16)
if [[ "$(cat "$JARS/.resolved" 2>/dev/null)" != "$want" ]]; then
    echo "make delta-readers-test: resolving delta-spark and hadoop-aws into $JARS (~720 MB the first time)"
    rm -rf "$JARS"; mkdir -p "$JARS"
    log=$(mktemp)
    "${MVN[@]}" -f "$POM" dependency:copy-dependencies -DoutputDirectory="$PWD/$JARS" -DincludeScope=runtime \
        >"$log" 2>&1 || {
        what=$(grep -oE "(Could not (resolve|transfer|find) artifact|Failed to collect dependencies at|Could not resolve dependencies for project) [^ ]+" "$log" | head -1 || true)
        echo "make delta-readers-test: Maven Central did not serve what delta-spark needs: ${what:-see below}" >&2
        tail -20 "$log" >&2
        exit 2
    }
    rm -f "$log"
    spark_jars=$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    artifact() { basename "$1" | sed -E 's/-[0-9][0-9A-Za-z.+_-]*\.jar$//'; }
    for jar in "$JARS"/*.jar; do
        name=$(artifact "$jar")
        if compgen -G "$spark_jars/$name-[0-9]*.jar" >/dev/null; then rm "$jar"; fi
    done
    echo "$want" > "$JARS/.resolved"
fi
