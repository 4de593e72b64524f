package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.internals.PluginMetricsImpl;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The metadata manager's failures, against a stand-in for kcompact's metadata process (a shell script speaking the
 * same JSON lines): every one is a RemoteStorageException naming the table, the request and a table version.
 */
class KcompactRemoteLogMetadataManagerTest {

    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.fromString("MWJ6FHTfRYy67jzwZdeqSQ"),
            new TopicPartition("orders", 0));
    private static final RemoteLogSegmentMetadata SEGMENT = new RemoteLogSegmentMetadata(
            new RemoteLogSegmentId(TP, Uuid.fromString("tqimKeZwStOEOwRzT3L5oQ")), 100, 199, 5, 1, 6, 10,
            Map.of(0, 100L));
    private static final String READY = "echo '{\"ok\": true, \"result\": {\"ready\": 7}}'\n";

    @TempDir
    Path tmp;
    private final KcompactRemoteLogMetadataManager rlmm = new KcompactRemoteLogMetadataManager();

    @AfterEach
    void close() {
        rlmm.close();
    }

    private String store() {
        return tmp.resolve("store").toString();
    }

    /** Configures the manager with {@code body} as its "python": a script given the same arguments. Its follower
     * thread waits an hour before it first asks, so a scripted exchange sees only the calls the test makes. */
    private void configure(String body) throws IOException {
        configure(body, "3600000");
    }

    private void configure(String body, String followMs) throws IOException {
        Path script = tmp.resolve("metadata-process");
        Files.writeString(script, "#!/bin/sh\n" + body);
        Files.setPosixFilePermissions(script, PosixFilePermissions.fromString("rwx------"));
        rlmm.configure(Map.of(KcompactRemoteLogMetadataManager.STORE_CONFIG, store(),
                KcompactRemoteLogMetadataManager.PYTHON_CONFIG, script.toString(), "broker.id", "1",
                KcompactRemoteLogMetadataManager.FOLLOW_MS_CONFIG, followMs));
    }

    private static String row(long end, String state) {
        return "{\"segment_id\": \"tqimKeZwStOEOwRzT3L5oQ\", \"topic_id\": \"MWJ6FHTfRYy67jzwZdeqSQ\", "
                + "\"start_offset\": 100, \"end_offset\": " + end + ", \"max_timestamp_ms\": 5, "
                + "\"event_timestamp_ms\": 6, \"segment_size_bytes\": 10, \"state\": \"" + state + "\", "
                + "\"live\": " + state.equals("COPY_SEGMENT_FINISHED") + ", \"writer\": \"broker-1\", "
                + "\"leader_epochs\": [[0, 100]], \"txn_index\": false}";
    }

    private static String partition(long version, String row) {
        return "{\"topic\": \"orders\", \"partition\": 0, \"version\": " + version + ", \"segments\": [" + row
                + "]}";
    }

    /** A stand-in that logs each request's op to {@code ops} ({@code write} for an update) and answers it: a first
     * read with one live segment ending at 199 (version 8); a copy or another write with the segment ending at 299
     * (version 9); a follow with the segment ending at 399 (version 10: another writer's commit). */
    private String logging(Path ops) {
        return READY + "while read line; do printf '%s\\n' \"$line\" >> " + ops.resolveSibling("requests")
                + "; case \"$line\" in\n"
                + "  *'\"op\":\"segments\"'*) echo segments >> " + ops + "; "
                + "echo '{\"ok\": true, \"result\": " + partition(8, row(199, "COPY_SEGMENT_FINISHED")) + "}' ;;\n"
                + "  *'\"op\":\"follow\"'*) echo follow >> " + ops + "; "
                + "echo '{\"ok\": true, \"result\": {\"version\": 10, \"reset\": false, \"partitions\": ["
                + partition(10, row(399, "COPY_SEGMENT_FINISHED")) + "]}}' ;;\n"
                + "  *'\"op\":\"copy\"'*) echo copy >> " + ops + "; "
                + "echo '{\"ok\": true, \"result\": " + partition(9, row(299, "COPY_SEGMENT_FINISHED")) + "}' ;;\n"
                + "  *) echo write >> " + ops + "; "
                + "echo '{\"ok\": true, \"result\": " + partition(9, row(299, "COPY_SEGMENT_FINISHED")) + "}' ;;\n"
                + "esac; done\n";
    }

    /** Every call Kafka makes is timed under its method's name, the Python process's calls under their op, each
     * with its percentiles; a read from memory is recorded in well under a millisecond. */
    @Test
    void everyCallIsTimedWithItsPercentiles() throws Exception {
        configure(logging(tmp.resolve("ops")));
        try (Metrics registry = new Metrics()) {
            rlmm.withPluginMetrics(new PluginMetricsImpl(registry, Map.of()));
            rlmm.highestOffsetForEpoch(TP, 0);
            for (int i = 0; i < 1000; i++) {
                rlmm.remoteLogSegmentMetadata(TP, 0, 150);
            }
            rlmm.listRemoteLogSegments(TP);
            rlmm.listRemoteLogSegments(TP, 0);
            rlmm.nextSegmentWithTxnIndex(TP, 0, 100);
            rlmm.remoteLogSize(TP, 0);
            copy(SEGMENT);
            Map<String, Double> calls = new TreeMap<>();
            Map<String, Double> p99 = new TreeMap<>();
            for (KafkaMetric metric : registry.metrics().values()) {
                String op = metric.metricName().tags().get("op");
                double value = ((Number) metric.metricValue()).doubleValue();
                if (metric.metricName().name().equals("calls-total")) {
                    calls.put(op, value);
                } else if (metric.metricName().name().equals("latency-p99-ms")) {
                    p99.put(op, value);
                }
            }
            assertEquals(Map.of("addRemoteLogSegmentMetadata", 1.0, "copy", 1.0, "highestOffsetForEpoch", 1.0,
                    "listRemoteLogSegments", 1.0, "listRemoteLogSegments-epoch", 1.0, "nextSegmentWithTxnIndex", 1.0,
                    "remoteLogSegmentMetadata", 1000.0, "remoteLogSize", 1.0, "segments", 1.0,
                    "updateRemoteLogSegmentMetadata", 1.0), calls);
            assertEquals(calls.keySet(), p99.keySet());
            assertTrue(p99.get("remoteLogSegmentMetadata") < 1, "a read from memory: " + p99);
            assertTrue(p99.get("addRemoteLogSegmentMetadata") < 1, "a copy held in memory: " + p99);
            assertTrue(p99.get("segments") > 0, "a call of the process: " + p99);
        }
    }

    @Test
    void aPartitionIsReadOnceAndTheBrokersOwnWriteAnswersWithItsNewRows() throws Exception {
        Path ops = tmp.resolve("ops");
        configure(logging(ops));
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 0));
        assertTrue(rlmm.remoteLogSegmentMetadata(TP, 0, 150).isPresent());
        assertEquals(10L, rlmm.remoteLogSize(TP, 0));
        assertEquals(List.of("segments"), Files.readAllLines(ops));
        copy(SEGMENT);
        assertEquals(Optional.of(299L), rlmm.highestOffsetForEpoch(TP, 0));
        assertTrue(rlmm.listRemoteLogSegments(TP).hasNext());
        assertEquals(List.of("segments", "copy"), Files.readAllLines(ops));
    }

    /** A copy's add is held in the broker, shown only by the listing of its partition (as COPY_SEGMENT_STARTED, as
     * Kafka's own manager lists it): its finish commits it, one request for the whole copy. */
    @Test
    void aCopyIsHeldUntilItFinishesThenCommittedInOneRequest() throws Exception {
        Path ops = tmp.resolve("ops");
        RemoteLogSegmentMetadata next = nextCopyHeld(ops);
        assertEquals(List.of("segments"), Files.readAllLines(ops), "nothing sent at the add");
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 0), "not live before its finish");
        List<RemoteLogSegmentMetadata> listed = new ArrayList<>();
        rlmm.listRemoteLogSegments(TP).forEachRemaining(listed::add);
        assertEquals(List.of(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, RemoteLogSegmentState.COPY_SEGMENT_STARTED),
                listed.stream().map(RemoteLogSegmentMetadata::state).toList());
        assertEquals(next.remoteLogSegmentId(), listed.get(1).remoteLogSegmentId());
        List<RemoteLogSegmentId> ofEpoch = new ArrayList<>();
        rlmm.listRemoteLogSegments(TP, 0).forEachRemaining(s -> ofEpoch.add(s.remoteLogSegmentId()));
        assertFalse(ofEpoch.contains(next.remoteLogSegmentId()), "the epoch's listing holds live rows only");
        finish(next, RemoteLogSegmentState.COPY_SEGMENT_FINISHED);
        assertEquals(List.of("segments", "copy"), Files.readAllLines(ops));
        String sent = Files.readString(tmp.resolve("requests"));
        assertTrue(sent.contains("\"op\":\"copy\"") && sent.contains("\"segment_id\":\"AAAAAAAAAAAAAAAAAAAAAQ\"")
                && sent.contains("\"start_offset\":200") && sent.contains("\"leader_epochs\":[[0,200]]"), sent);
    }

    /** A copy that failed (Kafka deletes what it wrote: DELETE_SEGMENT_STARTED, then DELETE_SEGMENT_FINISHED) was
     * never committed, so nothing is; it leaves the listing, and a finish after its deletion is refused. */
    @Test
    void aFailedCopyIsDroppedWithoutACommit() throws Exception {
        Path ops = tmp.resolve("ops");
        RemoteLogSegmentMetadata next = nextCopyHeld(ops);
        finish(next, RemoteLogSegmentState.DELETE_SEGMENT_STARTED);
        assertFalse(listed(TP).contains(next.remoteLogSegmentId()));
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> finish(next, RemoteLogSegmentState.COPY_SEGMENT_FINISHED));
        assertTrue(e.getMessage().contains("InvalidStateTransitionError") && e.getMessage().contains(
                "from DELETE_SEGMENT_STARTED to COPY_SEGMENT_FINISHED"), e.getMessage());
        finish(next, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED);
        assertEquals(List.of("segments"), Files.readAllLines(ops), "nothing committed");
    }

    /** A deposed leader's add, when the partition's rows already hold a newer leader epoch, is refused at once (the
     * commit would refuse it), and Kafka copies nothing for it; the current leader's is held. */
    @Test
    void aDeposedLeadersAddIsRefusedFromTheRowsHeld() throws Exception {
        Path ops = tmp.resolve("ops");
        configure(READY + "while read line; do echo segments >> " + ops + "; echo '{\"ok\": true, \"result\": "
                + partition(8, row(199, "COPY_SEGMENT_FINISHED").replace("[[0, 100]]", "[[0, 100], [3, 150]]"))
                + "}'; done\n");
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 3));
        RemoteLogSegmentMetadata deposed = segment("AAAAAAAAAAAAAAAAAAAAAQ", 200, 299, Map.of(2, 200L));
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rlmm.addRemoteLogSegmentMetadata(deposed));
        assertTrue(e.getMessage().contains("FencedError") && e.getMessage().contains(
                "expected leader epoch 3 or newer, found 2 (segment AAAAAAAAAAAAAAAAAAAAAQ [200, 299] from broker-1"),
                e.getMessage());
        assertFalse(listed(TP).contains(deposed.remoteLogSegmentId()));
        RemoteLogSegmentMetadata current = segment("AAAAAAAAAAAAAAAAAAAAAg", 200, 299, Map.of(3, 200L));
        rlmm.addRemoteLogSegmentMetadata(current);
        assertTrue(listed(TP).contains(current.remoteLogSegmentId()));
        assertEquals(List.of("segments"), Files.readAllLines(ops), "both decided without the process");
    }

    /** A partition stopped (deleted, or moved off this broker) loses the copies held for it: one finishing after is
     * sent as an update of a row the table does not have, and refused there. A leadership change keeps them: a copy
     * in flight when the broker became a follower still commits, where its leader epoch decides. */
    @Test
    void aStoppedPartitionsHeldCopiesGoALeadershipChangeKeepsThem() throws Exception {
        Path ops = tmp.resolve("ops");
        configure(logging(ops));
        RemoteLogSegmentMetadata stopped = segment("AAAAAAAAAAAAAAAAAAAAAQ", 200, 299, Map.of(0, 200L));
        rlmm.addRemoteLogSegmentMetadata(stopped);
        rlmm.onStopPartitions(Set.of(TP));
        finish(stopped, RemoteLogSegmentState.COPY_SEGMENT_FINISHED);
        assertEquals(List.of("write"), Files.readAllLines(ops), "an update, not a copy");
        RemoteLogSegmentMetadata followed = segment("AAAAAAAAAAAAAAAAAAAAAg", 200, 299, Map.of(0, 200L));
        rlmm.addRemoteLogSegmentMetadata(followed);
        rlmm.onPartitionLeadershipChanges(Set.of(), Set.of(TP));
        finish(followed, RemoteLogSegmentState.COPY_SEGMENT_FINISHED);
        assertEquals(List.of("write", "copy"), Files.readAllLines(ops));
    }

    /** The logging stand-in configured, the partition read (one live segment to 199), and the next segment's copy
     * added: held. */
    private RemoteLogSegmentMetadata nextCopyHeld(Path ops) throws Exception {
        configure(logging(ops));
        rlmm.highestOffsetForEpoch(TP, 0);
        RemoteLogSegmentMetadata next = segment("AAAAAAAAAAAAAAAAAAAAAQ", 200, 299, Map.of(0, 200L));
        rlmm.addRemoteLogSegmentMetadata(next);
        return next;
    }

    private static RemoteLogSegmentMetadata segment(String id, long start, long end, Map<Integer, Long> epochs) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TP, Uuid.fromString(id)), start, end, 5, 1, 6, 10,
                epochs.isEmpty() ? Map.of(0, start) : epochs);
    }

    private List<RemoteLogSegmentId> listed(TopicIdPartition tp) throws RemoteStorageException {
        List<RemoteLogSegmentId> ids = new ArrayList<>();
        rlmm.listRemoteLogSegments(tp).forEachRemaining(s -> ids.add(s.remoteLogSegmentId()));
        return ids;
    }

    private void finish(RemoteLogSegmentMetadata segment, RemoteLogSegmentState state) throws RemoteStorageException {
        rlmm.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(segment.remoteLogSegmentId(), 7,
                Optional.empty(), state, 1));
    }

    /** A whole copy as Kafka makes it: its add, then its COPY_SEGMENT_FINISHED. */
    private void copy(RemoteLogSegmentMetadata segment) throws RemoteStorageException {
        rlmm.addRemoteLogSegmentMetadata(segment);
        finish(segment, RemoteLogSegmentState.COPY_SEGMENT_FINISHED);
    }

    @Test
    void aNewLeadersPartitionsAreReadTogetherAtOnce() throws Exception {
        Path ops = tmp.resolve("ops");
        String row = row(199, "COPY_SEGMENT_FINISHED");
        configure(READY + "while read line; do case \"$line\" in\n"
                + "  *'\"op\":\"load\"'*) echo load >> " + ops + "; "
                + "echo '{\"ok\": true, \"result\": {\"version\": 8, \"partitions\": [" + partition(8, row)
                + "]}}' ;;\n"
                + "  *) echo other >> " + ops + "; echo '{\"ok\": false, \"type\": \"X\", \"error\": \"x\"}' ;;\n"
                + "esac; done\n");
        rlmm.onPartitionLeadershipChanges(Set.of(TP), Set.of());
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!Files.exists(ops) && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        Thread.sleep(100);
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 0));
        assertEquals(List.of("load"), Files.readAllLines(ops));
    }

    @Test
    void aLeadershipChangeDropsTheRowsReadBefore() throws Exception {
        // becoming a follower (a leader's partitions are read again at once: the test above)
        Path ops = tmp.resolve("ops");
        configure(logging(ops));
        rlmm.highestOffsetForEpoch(TP, 0);
        rlmm.onPartitionLeadershipChanges(Set.of(), Set.of(TP));
        rlmm.highestOffsetForEpoch(TP, 0);
        rlmm.onPartitionLeadershipChanges(Set.of(), Set.of(TP));
        rlmm.highestOffsetForEpoch(TP, 0);
        rlmm.highestOffsetForEpoch(TP, 0);
        assertEquals(List.of("segments", "segments", "segments"), Files.readAllLines(ops));
    }

    @Test
    void theFollowerTakesInAnotherWritersCommitWithoutReadingThePartitionAgain() throws Exception {
        Path ops = tmp.resolve("ops");
        configure(logging(ops), "20");
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 0));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!rlmm.highestOffsetForEpoch(TP, 0).equals(Optional.of(399L)) && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertEquals(Optional.of(399L), rlmm.highestOffsetForEpoch(TP, 0));
        assertTrue(Files.readAllLines(ops).stream().filter(op -> op.equals("segments")).count() == 1,
                "one first read, then only follows: " + Files.readAllLines(ops));
    }

    @Test
    void anOlderAnswerNeverReplacesANewerView() throws Exception {
        Path ops = tmp.resolve("ops");
        // the follower answers version 10 first; a write then answers version 9 (it was committed before)
        configure(logging(ops), "20");
        rlmm.highestOffsetForEpoch(TP, 0);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!rlmm.highestOffsetForEpoch(TP, 0).equals(Optional.of(399L)) && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        copy(SEGMENT);
        assertEquals(Optional.of(399L), rlmm.highestOffsetForEpoch(TP, 0));
    }

    @Test
    void aRefusedRequestNamesTheTableVersionTheProcessRead() throws Exception {
        configure(READY + "while read line; do echo '{\"ok\": false, \"type\": \"CommitConflictError\", "
                + "\"error\": \"orders-0: expected commit_seq 2, found 3\", \"version\": 9}'; done\n");
        RemoteStorageException e = assertThrows(RemoteStorageException.class, () -> copy(SEGMENT));
        assertTrue(e.getMessage().startsWith("kcompact metadata table " + store()
                + "/_kcompact_metadata (copy, table version 9): CommitConflictError: orders-0: expected commit_seq 2, "
                + "found 3"), e.getMessage());
    }

    @Test
    void aListingThenAFailureNamesTheLastVersionRead() throws Exception {
        configure(READY + "read line; echo '{\"ok\": true, \"result\": {\"version\": 8, \"segments\": []}}'\n"
                + "read line; exit 3\n");
        assertTrue(rlmm.highestOffsetForEpoch(TP, 0).isEmpty());
        RemoteStorageException e = assertThrows(RemoteStorageException.class, () -> copy(SEGMENT));
        assertTrue(e.getMessage().contains("/_kcompact_metadata (copy, last table version read 8): "
                + "the metadata process exited with 3"), e.getMessage());
    }

    @Test
    void anAnswerWithoutAVersionNamesTheLastOneRead() throws Exception {
        configure(READY + "while read line; do echo '{\"ok\": false, \"type\": \"TransientStoreError\", "
                + "\"error\": \"reading the table failed\", \"version\": null}'; done\n");
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rlmm.remoteLogSegmentMetadata(TP, 0, 150));
        assertTrue(e.getMessage().contains("(segments, table version 7): TransientStoreError"), e.getMessage());
    }

    @Test
    void aMetadataProcessThatDiesMidCallFailsThatCallAndTheNextStartsANewOne() throws Exception {
        Path ops = tmp.resolve("ops");
        Path died = tmp.resolve("died-once");
        configure("if [ ! -e " + died + " ]; then touch " + died + "; " + READY + "read line; exit 9; fi\n"
                + logging(ops));
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rlmm.highestOffsetForEpoch(TP, 0));
        assertTrue(e.getMessage().contains("(segments, last table version read 7): the metadata process exited with 9"),
                e.getMessage());
        assertEquals(Optional.of(199L), rlmm.highestOffsetForEpoch(TP, 0));
        assertEquals(List.of("segments"), Files.readAllLines(ops));
    }
}
