#!/usr/bin/env bash
# `make kafka`: Kafka's own jars from Maven Central into .kafka/libs (kafka/runtime/pom.xml, at the version pinned
# in kafka/pom.xml), then the Java harnesses under kafka/ (each a Maven module against the same pinned Kafka) into
# .kafka/. Cached: a rerun
# with unchanged poms and sources does nothing. If Maven Central cannot serve an artifact, this fails at once
# (no retries), naming the artifact; the tests that need Kafka fail with it rather than being skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.kafka
LIBS=$OUT/libs
MVN=(mvn -B -q -Dmaven.wagon.http.retryHandler.count=0 -Dmaven.wagon.httpconnectionManager.ttlSeconds=5
     -Dorg.slf4j.simpleLogger.log.org.apache.maven.cli.transfer.Slf4jMavenTransferListener=warn)

command -v mvn >/dev/null || { echo "make kafka: needs Maven (mvn) on PATH" >&2; exit 2; }
command -v java >/dev/null || { echo "make kafka: needs a JDK 17 (java) on PATH" >&2; exit 2; }

fail_naming_artifact() {  # $1: Maven's log
    local what
    what=$(grep -oE "(Could not (find|transfer) artifact|artifacts? could not be resolved:) [^ ,]+" "$1" | head -1 || true)
    [[ -n "$what" ]] || what=$(grep -oE "(Could not resolve artifact|Failed to collect dependencies at|Could not resolve dependencies for project) [^ ]+" "$1" | head -1 || true)
    echo "make kafka: Maven Central did not serve what Kafka needs: ${what:-see below}" >&2
    tail -20 "$1" >&2
    exit 2
}

stamp_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

want=$(stamp_of kafka/pom.xml kafka/runtime/pom.xml)
if [[ "$(cat "$LIBS/.resolved" 2>/dev/null)" != "$want" ]]; then
    echo "make kafka: resolving Kafka's jars from Maven Central into $LIBS (~55 MB the first time)"
    rm -rf "$LIBS"; mkdir -p "$LIBS"
    log=$(mktemp)
    "${MVN[@]}" -f kafka/runtime/pom.xml dependency:copy-dependencies -DoutputDirectory="$PWD/$LIBS" \
        -DincludeScope=runtime >"$log" 2>&1 || fail_naming_artifact "$log"
    rm -f "$log"
    echo "$want" > "$LIBS/.resolved"
fi

# Each harness: kafka/<name>/pom.xml with sources under kafka/<name>/src, packaged into .kafka/<name>.jar.
for pom in kafka/*/pom.xml; do
    name=$(basename "$(dirname "$pom")")
    [[ "$name" == runtime ]] && continue
    jar=$OUT/$name.jar
    want=$(stamp_of "$pom" kafka/pom.xml kafka/runtime/pom.xml $(find "kafka/$name/src" -type f | sort))
    [[ -f "$jar" && "$(cat "$jar.built" 2>/dev/null)" == "$want" ]] && continue
    echo "make kafka: building $jar"
    log=$(mktemp)
    "${MVN[@]}" -f "$pom" package -DskipTests >"$log" 2>&1 || {
        grep -qE "Could not (resolve|transfer|find)|Failed to collect" "$log" && fail_naming_artifact "$log"
        echo "make kafka: building $pom failed" >&2; tail -40 "$log" >&2; exit 2; }
    rm -f "$log"
    # a new file renamed over the old: a broker or harness running from the old jar keeps reading its inode
    cp "kafka/$name/target/$name.jar" "$jar.tmp" && mv -f "$jar.tmp" "$jar"
    echo "$want" > "$jar.built"
done
