package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeSet;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * What the plugin sends its Python processes, against the pipes' schema ({@code compaction/pipes.json}, which the
 * Python side checks every request against): each request the manager and the store send, through the real
 * {@code compaction.remote_log_metadata} and {@code compaction.remote_storage} of this checkout on a local store, is
 * recorded on its way in and must carry exactly its op's fields; and the answers they read back are the real ones.
 */
class PipeSchemaTest {

    private static final Path REPO = Path.of("../..").toAbsolutePath().normalize();
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Uuid TOPIC_ID = Uuid.fromString("MWJ6FHTfRYy67jzwZdeqSQ");

    @TempDir
    Path tmp;

    private static JsonNode schema() throws IOException {
        return JSON.readTree(REPO.resolve("compaction/pipes.json").toFile());
    }

    /** A "python" that runs this checkout's kcompact, its stdin copied to {@code log} on the way; with {@code gate},
     * the first request is held (and {@code gate}.held written) until {@code gate} exists. */
    private String python(Path log, Path gate) throws IOException {
        Path python = REPO.resolve(".venv/bin/python");
        assertTrue(Files.isExecutable(python), python + " is missing: run `make venv` first");
        String hold = gate == null ? "cat" : "{ IFS= read -r first; touch " + gate + ".held; while [ ! -e " + gate
                + " ]; do sleep 0.05; done; printf '%s\\n' \"$first\"; cat; }";
        Path script = tmp.resolve("python");
        Files.writeString(script, "#!/bin/sh\n" + hold + " | tee -a " + log + " | PYTHONPATH=" + REPO + " "
                + python + " \"$@\"\n");
        Files.setPosixFilePermissions(script, PosixFilePermissions.fromString("rwx------"));
        return script.toString();
    }

    private static List<JsonNode> requests(Path log) throws IOException {
        List<JsonNode> found = new ArrayList<>();
        for (String line : Files.readAllLines(log)) {
            if (!line.isBlank()) {
                found.add(JSON.readTree(line));
            }
        }
        return found;
    }

    private static Set<String> fields(JsonNode node) {
        Set<String> names = new TreeSet<>();
        node.fieldNames().forEachRemaining(names::add);
        return names;
    }

    private static Set<String> expected(JsonNode list) {
        Set<String> names = new TreeSet<>();
        list.forEach(n -> names.add(n.asText()));
        return names;
    }

    private static TopicIdPartition tp(int partition) {
        return new TopicIdPartition(TOPIC_ID, new TopicPartition("orders", partition));
    }

    private static RemoteLogSegmentMetadata segment(int partition, String id) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tp(partition), Uuid.fromString(id)), 100, 199, 5, 1,
                6, 10, Map.of(0, 100L));
    }

    /** Every op the manager sends, a {@code batch} among them (two copies queued while a first is held), and the
     * follower's {@code follow}: each request's fields are its op's in the schema, a batch's inner writes too.
     * ({@code add}, a COPY_SEGMENT_STARTED row alone, stays in the schema for a plugin older than its {@code copy}.) */
    @Test
    @Timeout(120)
    void everyRequestTheManagerSendsCarriesItsOpsFields() throws Exception {
        Path log = tmp.resolve("requests.jsonl");
        Path gate = tmp.resolve("gate");
        KcompactRemoteLogMetadataManager rlmm = new KcompactRemoteLogMetadataManager();
        try {
            rlmm.configure(Map.of(KcompactRemoteLogMetadataManager.STORE_CONFIG, tmp.resolve("store").toString(),
                    KcompactRemoteLogMetadataManager.PYTHON_CONFIG, python(log, gate), "broker.id", "1",
                    KcompactRemoteLogMetadataManager.FOLLOW_MS_CONFIG, "200"));
            List<Thread> writers = new ArrayList<>();
            String[] ids = {"tqimKeZwStOEOwRzT3L5oQ", "AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg"};
            for (int p = 0; p < 3; p++) {
                RemoteLogSegmentMetadata s = segment(p, ids[p]);
                Thread t = new Thread(() -> {
                    try {
                        rlmm.addRemoteLogSegmentMetadata(s);
                        rlmm.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(s.remoteLogSegmentId(),
                                7, Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1));
                    } catch (Exception e) {
                        throw new RuntimeException(e);
                    }
                });
                t.start();
                writers.add(t);
            }
            // A copy is held and two wait behind it, queued: once it is answered, they go as one batch.
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (!(Files.exists(Path.of(gate + ".held"))
                    && writers.stream().filter(t -> t.getState() == Thread.State.BLOCKED).count() >= 2)) {
                assertTrue(System.nanoTime() < deadline, "no request held with two writers queued behind it");
                Thread.sleep(10);
            }
            Files.createFile(gate);
            for (Thread t : writers) {
                t.join(60_000);
            }
            RemoteLogSegmentMetadata first = segment(0, ids[0]);
            Iterator<RemoteLogSegmentMetadata> listed = rlmm.listRemoteLogSegments(tp(0));
            assertEquals(first.remoteLogSegmentId(), listed.next().remoteLogSegmentId(), "a real answer, read back");
            rlmm.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(first.remoteLogSegmentId(), 8,
                    Optional.empty(), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 1));
            rlmm.onPartitionLeadershipChanges(Set.of(tp(1)), Set.of());
            assertTrue(!rlmm.listRemoteLogSegments(tp(5)).hasNext(), "a partition never written: read by segments");
            deadline = System.nanoTime() + 30_000_000_000L;
            while (requests(log).stream().map(r -> r.get("op").asText()).distinct().count() < 6
                    && System.nanoTime() < deadline) {
                Thread.sleep(50);
            }
        } finally {
            rlmm.close();
        }
        JsonNode schema = schema().get("metadata");
        Set<String> ops = new TreeSet<>();
        for (JsonNode request : requests(log)) {
            String op = request.get("op").asText();
            ops.add(op);
            assertEquals(expected(schema.get("requests").get(op)), fields(request), op + ": " + request);
            for (JsonNode inner : request.path("requests")) {
                assertEquals(expected(schema.get("requests").get(inner.get("op").asText())), fields(inner),
                        "in a batch: " + inner);
            }
            for (JsonNode partition : request.path("partitions")) {
                assertEquals(expected(schema.get("load_partition")), fields(partition), "in a load: " + partition);
            }
        }
        assertEquals(expected(JSON.valueToTree(List.of("batch", "copy", "follow", "load", "segments", "update"))), ops);
    }

    /** Every op the store sends: put_file, put, get, list, delete. */
    @Test
    @Timeout(120)
    void everyRequestTheStoreSendsCarriesItsOpsFields() throws Exception {
        Path log = tmp.resolve("requests.jsonl");
        String key = "orders-MWJ6FHTfRYy67jzwZdeqSQ/3/00000000000000000100-tqimKeZwStOEOwRzT3L5oQ.log";
        try (PythonStore store = new PythonStore("file://" + tmp.resolve("store"),
                new PythonStore.Settings(python(log, null), null, 4, 2))) {
            store.putFile(key, Files.writeString(tmp.resolve("s.log"), "0123456789"));
            store.putBytes(key + "-epochs", ByteBuffer.wrap("0\n".getBytes(StandardCharsets.UTF_8)));
            try (InputStream in = store.open(key, 2, 6)) {
                assertEquals("2345", new String(in.readAllBytes(), StandardCharsets.UTF_8));
            }
            assertEquals(1, store.list("orders-MWJ6FHTfRYy67jzwZdeqSQ/3/", ".log").get().size());
            store.delete(key);
        }
        JsonNode schema = schema().get("store");
        Set<String> ops = new TreeSet<>();
        for (JsonNode request : requests(log)) {
            String op = request.get("op").asText();
            ops.add(op);
            assertEquals(expected(schema.get("requests").get(op)), fields(request), op + ": " + request);
        }
        assertEquals(expected(JSON.valueToTree(List.of("delete", "get", "list", "put", "put_file"))), ops);
    }

    @Test
    void theWriterOfABrokersRowsIsTheSchemas() throws Exception {
        assertEquals(schema().get("writer_prefix").asText(), SegmentRow.WRITER_PREFIX);
    }
}
