package dev.kcompact.tiered;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/**
 * The Python process that reads and writes kcompact's metadata table for the broker
 * ({@code python -m compaction.remote_log_metadata}): one JSON request per line on its stdin, one answer per line
 * on its stdout, in order. Requests are serialized; the process ends when the pipe closes. If it dies (killed, out of
 * memory) the call in flight fails and the next call starts a new one.
 *
 * <p>Every failure is a {@link RemoteStorageException} naming the table, the request and a table version: the one
 * the process read when it refused the request, or else the last one an answer named (-1 before any).
 */
final class MetadataPipe implements AutoCloseable {

    private static final ObjectMapper JSON = new ObjectMapper();

    private final String python;
    private final String store;
    private final String endpointUrl;
    private Process process;
    private BufferedWriter requests;
    private BufferedReader answers;
    private boolean broken;
    private boolean closed;
    private long lastVersion = -1;
    private final AtomicInteger pending = new AtomicInteger();
    private final AtomicLong restarts = new AtomicLong();

    /** A failed call, with the kind of failure for the metrics: the kcompact error type the process answered
     * ({@code FencedError}, {@code CommitConflictError}, ...), or {@code ProcessGone} when the process died or its
     * pipe broke. */
    static final class CallFailed extends RemoteStorageException {
        private final String kind;

        CallFailed(String kind, String message, Throwable cause) {
            super(message, cause);
            this.kind = kind;
        }

        String kind() {
            return kind;
        }
    }

    /** Starts the process for {@code store} ({@code endpointUrl}: an S3 endpoint other than boto3's own, or null). */
    MetadataPipe(String python, String store, String endpointUrl) throws IOException, RemoteStorageException {
        this.python = python;
        this.store = store;
        this.endpointUrl = endpointUrl;
        start();
    }

    private void start() throws IOException, RemoteStorageException {
        process = PythonModule.start(python, "compaction.remote_log_metadata", store, endpointUrl);
        requests = new BufferedWriter(new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
        answers = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        broken = false;
        readAnswer("start");
    }

    /** A process that died or whose pipe broke (the call in flight failed with it) is replaced by a new one: the
     * table is the state, the process holds none a new one would miss. */
    private void restartIfGone(String op) throws RemoteStorageException {
        if (!broken && process.isAlive()) {
            return;
        }
        process.destroyForcibly();
        restarts.incrementAndGet();
        try {
            start();
        } catch (IOException e) {
            broken = true;
            throw new CallFailed("ProcessGone", where(op) + ": restarting the metadata process failed (" + e + ")", e);
        }
    }

    ObjectNode request(String op) {
        return JSON.createObjectNode().put("op", op);
    }

    /** Calls waiting for the process or in flight. */
    int pending() {
        return pending.get();
    }

    /** The table version the last answer named (-1 before any). */
    synchronized long lastVersion() {
        return lastVersion;
    }

    /** Processes started to replace one that died. */
    long restarts() {
        return restarts.get();
    }

    /** Sends {@code request} and returns its {@code result}; a kcompact error becomes a {@link CallFailed}. Calls are
     * served one at a time, in the order they get the pipe. */
    JsonNode call(ObjectNode request) throws RemoteStorageException {
        pending.incrementAndGet();
        try {
            return callAlone(request);
        } finally {
            pending.decrementAndGet();
        }
    }

    private synchronized JsonNode callAlone(ObjectNode request) throws RemoteStorageException {
        String op = request.get("op").asText();
        if (closed) {
            throw new RemoteStorageException(where(op) + ": the metadata manager is closed (the broker is stopping)");
        }
        restartIfGone(op);
        try {
            requests.write(JSON.writeValueAsString(request));
            requests.newLine();
            requests.flush();
        } catch (IOException e) {
            broken = true;
            throw new CallFailed("ProcessGone", where(op) + ": " + gone() + " (" + e + ")", e);
        }
        return readAnswer(op);
    }

    private JsonNode readAnswer(String op) throws RemoteStorageException {
        String line;
        try {
            line = answers.readLine();
        } catch (IOException e) {
            broken = true;
            throw new CallFailed("ProcessGone", where(op) + ": reading the answer failed (" + e + ")", e);
        }
        if (line == null) {
            broken = true;
            throw new CallFailed("ProcessGone", where(op) + ": " + gone(), null);
        }
        JsonNode answer;
        try {
            answer = JSON.readTree(line);
        } catch (IOException e) {
            broken = true;
            throw new RemoteStorageException(where(op) + ": not an answer: " + line, e);
        }
        if (!answer.path("ok").asBoolean()) {
            throw refusal(op, answer);
        }
        JsonNode result = answer.get("result");
        lastVersion = versionOf(result, lastVersion);
        return result;
    }

    /** The failure an error answer to {@code op} stands for (a whole answer's, or one element of a {@code batch}'s),
     * naming the table version the process read. */
    CallFailed refusal(String op, JsonNode answer) {
        long version = versionOf(answer, lastVersion);
        String kind = answer.path("type").asText();
        return new CallFailed(kind, table(op, "table version " + version) + ": " + kind + ": "
                + answer.path("error").asText(), null);
    }

    /** The table version an answer's result names (an add's or update's new version, a listing's, the start's), or an
     * error answer's. */
    private static long versionOf(JsonNode result, long otherwise) {
        if (result == null) {
            return otherwise;
        }
        if (result.isIntegralNumber()) {
            return result.asLong();
        }
        JsonNode version = result.has("version") ? result.get("version") : result.path("ready");
        return version.isIntegralNumber() ? version.asLong() : otherwise;
    }

    private String gone() {
        return "the metadata process " + PythonModule.gone(process);
    }

    private String where(String op) {
        return table(op, "last table version read " + lastVersion);
    }

    private String table(String op, String version) {
        return "kcompact metadata table " + store + "/_kcompact_metadata (" + op + ", " + version + ")";
    }

    @Override
    public synchronized void close() {
        closed = true;
        try {
            requests.close();
        } catch (IOException ignored) {
            // the process is ending either way
        }
        process.destroy();
    }
}
