package dev.kcompact.tiered;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedInputStream;
import java.io.BufferedWriter;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.OutputStreamWriter;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * kcompact's store reached through kcompact's Python side ({@code python -m compaction.remote_storage}): for
 * {@code s3://bucket/prefix}, the objects are written and read by the same client, retries, create-only conditional
 * PUTs and multipart uploads as {@code kcompact compact} uses, and the plugin needs no S3 client of its own.
 * (AWS SDK for Java v2's S3 client, 2.57.8, resolves to 46 jars and 15 MB, and would be a second S3 client, with its
 * own retry, conditional-create and multipart code, to keep in step with kcompact's.)
 *
 * <p>One process per store, JSON lines on its stdin and stdout. Requests carry an id that the answer repeats, and
 * several are in flight at once (the process serves them from a thread pool), so a long upload does not hold up a
 * consumer's fetch. A read's bytes follow its answer line as they are. A copy passes the broker's local file paths; a read asks for {@code chunkBytes} at a time, so a
 * fetch that reads the first megabyte of a segment's tail does not download the whole tail (a segment's reads go
 * through {@link ChunkCache}, which shares the chunks among the broker's successive fetches; {@link #fetch} is its
 * way in). If the process dies
 * (killed, out of memory) every call in flight fails with an {@link IOException} naming its exit, and the next call
 * starts a new one.
 */
final class PythonStore implements SegmentStore {

    /** How to start the process: the Python with kcompact installed, the S3 endpoint (null: boto3's own), the
     * bytes a read asks for at a time, and the requests served at once. */
    record Settings(String python, String endpointUrl, int chunkBytes, int threads) {
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    /** An answer line, and the bytes that followed it (a {@code get}'s; empty for every other answer). */
    private record Answer(JsonNode json, byte[] payload) {
    }

    private final String store;
    private final Settings settings;
    private final AtomicLong ids = new AtomicLong();
    private final AtomicLong restarts = new AtomicLong();
    private final AtomicLong gets = new AtomicLong();
    private final AtomicLong bytesFetched = new AtomicLong();
    private final AtomicLong lists = new AtomicLong();
    private Worker worker;
    private boolean closed;

    PythonStore(String store, Settings settings) throws IOException {
        this.store = store;
        this.settings = settings;
        worker = new Worker();
    }

    @Override
    public String uri(String key) {
        return store + "/" + key;
    }

    @Override
    public void putFile(String key, Path source) throws IOException {
        call(request("put_file", key).put("path", source.toAbsolutePath().toString()));
    }

    @Override
    public void putBytes(String key, ByteBuffer data) throws IOException {
        ByteBuffer copy = data.duplicate();
        byte[] bytes = new byte[copy.remaining()];
        copy.get(bytes);
        call(request("put", key).put("data", Base64.getEncoder().encodeToString(bytes)));
    }

    /** The first chunk is read at once, so a missing object fails here, not at the stream's first read. */
    @Override
    public InputStream open(String key, long start, long end) throws IOException {
        return new ChunkedStream(key, start, end);
    }

    @Override
    public void delete(String key) throws IOException {
        call(request("delete", key));
    }

    private ObjectNode request(String op, String key) {
        return JSON.createObjectNode().put("op", op).put("key", key);
    }

    /**
     * The bytes {@code [start, end)} of {@code key}, cut short at its end, as a future completed on the thread that
     * reads the process's answers: {@link ChunkCache} keeps several reads in flight without a thread each. Every
     * read of an object's bytes is one of these, counted in {@link #gets()} and {@link #bytesFetched()}.
     */
    CompletableFuture<byte[]> fetch(String key, long start, long end) {
        gets.incrementAndGet();
        return send(request("get", key).put("start", start).put("end", end)).thenApply(answer -> {
            bytesFetched.addAndGet(answer.payload().length);
            return answer.payload();
        });
    }

    /** An object a listing found: its key and size. */
    record Listed(String key, long size) {
    }

    /** The objects under {@code prefix} whose key ends with {@code suffix}, in key order (the store process lists
     * them: one LIST request per 1,000 objects on S3), answered as {@link #fetch} is; counted in {@link #lists()}. */
    CompletableFuture<List<Listed>> list(String prefix, String suffix) {
        lists.incrementAndGet();
        ObjectNode request = JSON.createObjectNode().put("op", "list").put("prefix", prefix).put("suffix", suffix);
        return send(request).thenApply(answer -> {
            List<Listed> out = new ArrayList<>();
            for (JsonNode object : answer.json().path("result").path("objects")) {
                out.add(new Listed(object.get(0).asText(), object.get(1).asLong()));
            }
            return out;
        });
    }

    /** Listings sent to the store process. */
    long lists() {
        return lists.get();
    }

    private byte[] get(String key, long start, long end) throws IOException {
        return await(fetch(key, start, end), "get");
    }

    /** Sends {@code request} and waits for its answer; a kcompact error becomes the matching exception. */
    private Answer call(ObjectNode request) throws IOException {
        return await(send(request), request.get("op").asText());
    }

    /** Sends {@code request}; its answer, or the exception a kcompact error answer maps to. */
    private CompletableFuture<Answer> send(ObjectNode request) {
        long id = ids.incrementAndGet();
        request.put("id", id);
        try {
            return live().send(id, JSON.writeValueAsString(request)).thenApply(PythonStore::checked);
        } catch (IOException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    private static Answer checked(Answer done) {
        if (done.json().path("ok").asBoolean()) {
            return done;
        }
        String type = done.json().path("type").asText();
        String error = done.json().path("error").asText();
        throw new CompletionException(switch (type) {
            case "MissingObjectError" -> new NoSuchFileException(error);
            case "ObjectExistsError" -> new FileAlreadyExistsException(error);
            default -> new IOException(type + ": " + error);
        });
    }

    private static <T> T await(CompletableFuture<T> answer, String op) throws IOException {
        try {
            return answer.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for " + op);
        } catch (ExecutionException e) {
            throw e.getCause() instanceof IOException io ? io : new IOException(e.getCause());
        }
    }

    /** The running process, started afresh if the last one died. */
    private synchronized Worker live() throws IOException {
        if (closed) {
            throw new IOException("kcompact's store process for " + store + " is closed (the broker is stopping)");
        }
        if (!worker.process.isAlive() || worker.failed) {
            worker.stop();
            restarts.incrementAndGet();
            worker = new Worker();
        }
        return worker;
    }

    @Override
    public int pending() {
        return worker.waiting.size();
    }

    @Override
    public long restarts() {
        return restarts.get();
    }

    @Override
    public long gets() {
        return gets.get();
    }

    @Override
    public long bytesFetched() {
        return bytesFetched.get();
    }

    @Override
    public synchronized void close() {
        closed = true;
        worker.stop();
    }

    /** One process and the calls waiting for its answers. */
    private final class Worker {
        private final Process process;
        private final BufferedWriter requests;
        private final BufferedInputStream answers;
        private final Map<Long, CompletableFuture<Answer>> waiting = new ConcurrentHashMap<>();
        private volatile boolean failed;

        Worker() throws IOException {
            process = PythonModule.start(settings.python(), "compaction.remote_storage", store, settings.endpointUrl(),
                    "--threads", Integer.toString(settings.threads()));
            requests = new BufferedWriter(new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
            answers = new BufferedInputStream(process.getInputStream(), 1 << 16);
            byte[] ready = readLine();
            if (ready == null || !JSON.readTree(ready).path("ok").asBoolean()) {
                stop();
                throw new IOException("kcompact's store process for " + store + " did not start: "
                        + (ready == null ? gone() : new String(ready, StandardCharsets.UTF_8)));
            }
            Thread reader = new Thread(this::readAnswers, "kcompact-store-answers");
            reader.setDaemon(true);
            reader.start();
        }

        CompletableFuture<Answer> send(long id, String line) throws IOException {
            CompletableFuture<Answer> answer = new CompletableFuture<>();
            waiting.put(id, answer);
            try {
                synchronized (requests) {
                    requests.write(line);
                    requests.newLine();
                    requests.flush();
                }
            } catch (IOException e) {
                waiting.remove(id);
                failed = true;
                throw new IOException("kcompact's store process for " + store + ": " + gone() + " (" + e + ")", e);
            }
            if (failed) {  // the reader may have failed every waiting call before this one was added
                answer.completeExceptionally(new IOException("kcompact's store process for " + store + ": " + gone()));
            }
            return answer;
        }

        /** One answer line without its newline; null at the end of the stream. */
        private byte[] readLine() throws IOException {
            ByteArrayOutputStream line = new ByteArrayOutputStream(256);
            for (int b = answers.read(); b != '\n'; b = answers.read()) {
                if (b < 0) {
                    return null;
                }
                line.write(b);
            }
            return line.toByteArray();
        }

        private void readAnswers() {
            try {
                for (byte[] line = readLine(); line != null; line = readLine()) {
                    JsonNode json = JSON.readTree(line);
                    JsonNode length = json.path("result").path("length");
                    byte[] payload = length.isIntegralNumber() ? answers.readNBytes(length.asInt()) : new byte[0];
                    if (payload.length < length.asInt()) {
                        break;  // the process died in the middle of the bytes
                    }
                    CompletableFuture<Answer> call = waiting.remove(json.path("id").asLong());
                    if (call != null) {
                        call.complete(new Answer(json, payload));
                    }
                }
            } catch (IOException e) {
                // the process is gone or its pipe broke: fail what waits, below
            }
            failed = true;
            IOException gone = new IOException("kcompact's store process for " + store + ": " + gone()
                    + " while the request was in flight");
            waiting.values().forEach(c -> c.completeExceptionally(gone));
            waiting.clear();
        }

        private String gone() {
            return "the process " + PythonModule.gone(process);
        }

        /** Closes its stdin (it finishes what it serves and exits) and kills it if it has not after a while. */
        void stop() {
            failed = true;
            try {
                requests.close();
            } catch (IOException ignored) {
                // ending either way
            }
            try {
                if (!process.waitFor(10, TimeUnit.SECONDS)) {
                    process.destroyForcibly();
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                process.destroyForcibly();
            }
        }
    }

    /** An object's bytes {@code [start, end)}, read {@code chunkBytes} at a time as the reader gets to them. */
    private final class ChunkedStream extends InputStream {
        private final String key;
        private final long end;
        private long next;
        private byte[] chunk;
        private int pos;
        private boolean last;

        ChunkedStream(String key, long start, long end) throws IOException {
            this.key = key;
            this.end = end;
            this.next = start;
            fill();
        }

        private void fill() throws IOException {
            long asked = Math.min(end - next, settings.chunkBytes());
            chunk = get(key, next, next + asked);
            pos = 0;
            next += chunk.length;
            last = chunk.length < asked || next >= end;
        }

        private boolean ready() throws IOException {
            while (pos >= chunk.length) {
                if (last) {
                    return false;
                }
                fill();
            }
            return true;
        }

        @Override
        public int read() throws IOException {
            return ready() ? chunk[pos++] & 0xff : -1;
        }

        @Override
        public int read(byte[] buf, int off, int len) throws IOException {
            if (len == 0) {
                return 0;
            }
            if (!ready()) {
                return -1;
            }
            int n = Math.min(len, chunk.length - pos);
            System.arraycopy(chunk, pos, buf, off, n);
            pos += n;
            return n;
        }
    }
}
