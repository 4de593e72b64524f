#!/usr/bin/env bash
# `make delta`: .delta-jars, the JVM side of delta-spark (the PyPI package pinned in pyproject.toml) and of
# hadoop-aws (s3a://) from Maven Central (delta/pom.xml, pinned), less the jars pyspark already ships. Every session
# kcompact launches puts them on its driver's class path (compaction/spark/delta.py). Then kcompact's own LogStore for
# s3a:// (delta/logstore/, a conditional put per commit) is compiled against them into $JARS/kcompact-logstore.jar.
# Cached: a rerun with unchanged pins and sources does nothing. If Maven Central cannot serve an artifact, this fails
# at once (no retries), naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
JARS=.delta-jars
POM=delta/pom.xml
MVN=(mvn -B -q -Dmaven.wagon.http.retryHandler.count=0 -Dmaven.wagon.httpconnectionManager.ttlSeconds=5
     -Dorg.slf4j.simpleLogger.log.org.apache.maven.cli.transfer.Slf4jMavenTransferListener=warn)

command -v mvn >/dev/null || { echo "make delta: needs Maven (mvn) on PATH" >&2; exit 2; }
spark_jars=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
want=$( (cat "$POM"; ls "$spark_jars") | sha256sum | cut -c1-16)
if [[ "$(cat "$JARS/.resolved" 2>/dev/null)" != "$want" ]]; then
    echo "make delta: resolving delta-spark and hadoop-aws into $JARS (~720 MB the first time)"
    rm -rf "$JARS"; mkdir -p "$JARS"
    log=$(mktemp)
    "${MVN[@]}" -f "$POM" dependency:copy-dependencies -DoutputDirectory="$PWD/$JARS" -DincludeScope=runtime \
        >"$log" 2>&1 || {
        what=$(grep -oE "(Could not (resolve|transfer|find) artifact|Failed to collect dependencies at|Could not resolve dependencies for project) [^ ]+" "$log" | head -1 || true)
        echo "make delta: Maven Central did not serve what delta-spark needs: ${what:-see below}" >&2
        tail -20 "$log" >&2
        exit 2
    }
    rm -f "$log"
    artifact() { basename "$1" | sed -E 's/-[0-9][0-9A-Za-z.+_-]*\.jar$//'; }
    for jar in "$JARS"/*.jar; do
        name=$(artifact "$jar")
        if compgen -G "$spark_jars/$name-[0-9]*.jar" >/dev/null; then rm "$jar"; fi
    done
    echo "$want" > "$JARS/.resolved"
fi

LOGSTORE=delta/logstore
built=$( (echo "$want"; find "$LOGSTORE" -name '*.java' -print0 | sort -z | xargs -0 cat) | sha256sum | cut -c1-16)
if [[ "$(cat "$JARS/.logstore" 2>/dev/null)" != "$built" ]]; then
    echo "make delta: building $JARS/kcompact-logstore.jar"
    classes=$(mktemp -d)
    classpath=$(ls "$JARS"/delta-storage-*.jar "$spark_jars"/hadoop-client-api-*.jar | paste -sd: -)
    javac -nowarn --release 17 -cp "$classpath" -d "$classes" $(find "$LOGSTORE" -name '*.java')
    jar cf "$JARS/kcompact-logstore.jar" -C "$classes" .
    rm -rf "$classes"
    echo "$built" > "$JARS/.logstore"
fi
