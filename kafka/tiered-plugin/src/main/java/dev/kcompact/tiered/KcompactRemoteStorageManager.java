package dev.kcompact.tiered;

import dev.kcompact.tiered.SegmentObjectKeys.Suffix;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

/**
 * KIP-405's {@link RemoteStorageManager} writing a segment's files into kcompact's store, the way
 * {@code kcompact tier} does (one object per file, {@link SegmentObjectKeys}), so that kcompact compacts what the
 * broker tiers and the broker serves what kcompact compacted. The store is a local directory
 * ({@link LocalDirectoryStore}) or {@code s3://bucket/prefix}, reached through kcompact's own S3 store in a Python
 * process ({@link PythonStore} says why).
 *
 * <p>Configuration (under the broker's {@code remote.log.storage.manager.impl.prefix}, {@code rsm.config.}):
 * {@code kcompact.store} the store's directory or URI; for an {@code s3://} store also {@code kcompact.python} the
 * Python with kcompact installed, {@code kcompact.endpoint.url} an S3 endpoint other than AWS's (else boto3's own
 * resolution: {@code AWS_ENDPOINT_URL}, config files), {@code kcompact.fetch.chunk.bytes} how much a read fetches
 * at a time (default 4 MiB) and {@code kcompact.store.threads} how many requests the process serves at once
 * (default 8). Credentials come from the broker's environment as boto3 resolves them.
 *
 * <p>A segment without a transaction index (Kafka passes none when it is empty) has no {@code .txnindex} object;
 * {@link #fetchIndex} then throws {@link RemoteResourceNotFoundException}, which is what {@code RemoteLogManager}
 * expects of a missing optional index. Every failure is a {@link RemoteStorageException} naming the object.
 *
 * <p>Each call's count, time, bytes and failures, and the Python process's queue and restarts, are KIP-877 plugin
 * metrics ({@link TierMetrics}).
 */
public final class KcompactRemoteStorageManager implements RemoteStorageManager, Monitorable {

    public static final String STORE_CONFIG = "kcompact.store";
    public static final String PYTHON_CONFIG = "kcompact.python";
    public static final String ENDPOINT_CONFIG = "kcompact.endpoint.url";
    public static final String CHUNK_BYTES_CONFIG = "kcompact.fetch.chunk.bytes";
    public static final String THREADS_CONFIG = "kcompact.store.threads";

    private final SegmentObjectKeys keys = new SegmentObjectKeys("");
    private final TierMetrics metrics = new TierMetrics();
    private SegmentStore store;

    /** Kafka's KIP-877 hook ({@link TierMetrics} lists what is published). */
    @Override
    public void withPluginMetrics(PluginMetrics pluginMetrics) {
        metrics.gauge("python-queue-depth", "store requests waiting for or in the Python process",
                () -> store == null ? 0 : store.pending());
        metrics.gauge("python-restarts-total", "store processes started to replace one that died",
                () -> store == null ? 0 : store.restarts());
        metrics.bind(pluginMetrics);
    }

    /** One storage call of {@code op}, its time, bytes and failure recorded. */
    private interface Call<T> {
        T run() throws RemoteStorageException;
    }

    private <T> T timed(String op, long bytes, Call<T> call) throws RemoteStorageException {
        long start = System.nanoTime();
        try {
            T result = call.run();
            metrics.call(op, System.nanoTime() - start, bytes);
            return result;
        } catch (RemoteStorageException | RuntimeException e) {
            metrics.error(op, TierMetrics.kindOf(e));
            throw e;
        }
    }

    @Override
    public void configure(Map<String, ?> configs) {
        String uri = StoreSetting.of(configs, "rsm.config.");
        PythonStore.Settings python = new PythonStore.Settings(text(configs, PYTHON_CONFIG, "python3"),
                text(configs, ENDPOINT_CONFIG, null), Integer.parseInt(text(configs, CHUNK_BYTES_CONFIG, "4194304")),
                Integer.parseInt(text(configs, THREADS_CONFIG, "8")));
        try {
            store = SegmentStore.open(uri, python);
        } catch (IOException e) {
            throw new IllegalStateException("opening kcompact's store " + uri + " failed: " + e, e);
        }
    }

    private static String text(Map<String, ?> configs, String name, String otherwise) {
        Object value = configs.get(name);
        return value == null ? otherwise : value.toString();
    }

    @Override
    public Optional<CustomMetadata> copyLogSegmentData(RemoteLogSegmentMetadata segment, LogSegmentData data)
            throws RemoteStorageException {
        return timed("copy", sizeOf(data), () -> copy(segment, data));
    }

    private static long sizeOf(LogSegmentData data) {
        long size = data.leaderEpochIndex().remaining();
        for (Path p : new Path[] {data.logSegment(), data.offsetIndex(), data.timeIndex(),
                data.producerSnapshotIndex(), data.transactionIndex().orElse(null)}) {
            try {
                size += p == null ? 0 : Files.size(p);
            } catch (IOException e) {
                // the copy itself reports a file it cannot read
            }
        }
        return size;
    }

    private Optional<CustomMetadata> copy(RemoteLogSegmentMetadata segment, LogSegmentData data)
            throws RemoteStorageException {
        String key = keys.key(segment, Suffix.LOG);
        try {
            store.putFile(key, data.logSegment());
            key = keys.key(segment, Suffix.OFFSET_INDEX);
            store.putFile(key, data.offsetIndex());
            key = keys.key(segment, Suffix.TIME_INDEX);
            store.putFile(key, data.timeIndex());
            if (data.transactionIndex().isPresent()) {
                key = keys.key(segment, Suffix.TXN_INDEX);
                store.putFile(key, data.transactionIndex().get());
            }
            key = keys.key(segment, Suffix.PRODUCER_SNAPSHOT);
            store.putFile(key, data.producerSnapshotIndex());
            key = keys.key(segment, Suffix.LEADER_EPOCH_CHECKPOINT);
            store.putBytes(key, data.leaderEpochIndex());
        } catch (IOException e) {
            throw new RemoteStorageException("copying " + segment.remoteLogSegmentId() + " to " + store.uri(key)
                    + " failed: " + e, e);
        }
        return Optional.empty();
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition)
            throws RemoteStorageException {
        return counted("fetch", () -> open(keys.key(segment, Suffix.LOG), startPosition, Long.MAX_VALUE));
    }

    /** {@code endPosition} is inclusive, as the interface says. */
    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition, int endPosition)
            throws RemoteStorageException {
        return counted("fetch", () -> open(keys.key(segment, Suffix.LOG), startPosition, (long) endPosition + 1));
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata segment, IndexType indexType)
            throws RemoteStorageException {
        return counted("fetch-index", () -> open(keys.key(segment, Suffix.of(indexType)), 0, Long.MAX_VALUE));
    }

    /** The stream {@code call} opens (its opening timed under {@code op}), counting the bytes the broker reads from
     * it under {@code op}'s {@code bytes-total}. */
    private InputStream counted(String op, Call<InputStream> call) throws RemoteStorageException {
        return new FilterInputStream(timed(op, 0, call)) {
            @Override
            public int read() throws IOException {
                int b = super.read();
                metrics.bytes(op, b < 0 ? 0 : 1);
                return b;
            }

            @Override
            public int read(byte[] buf, int off, int len) throws IOException {
                int n = super.read(buf, off, len);
                metrics.bytes(op, Math.max(n, 0));
                return n;
            }
        };
    }

    private InputStream open(String key, long start, long end) throws RemoteStorageException {
        if (start < 0 || end < start) {
            throw new IllegalArgumentException("invalid range [" + start + ", " + end + ") of " + key);
        }
        try {
            return store.open(key, start, end);
        } catch (NoSuchFileException e) {
            throw new RemoteResourceNotFoundException("no object " + store.uri(key));
        } catch (IOException e) {
            throw new RemoteStorageException("reading " + store.uri(key) + " failed: " + e, e);
        }
    }

    /** Deletes every file of the segment; idempotent (a file already gone is no error). */
    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata segment) throws RemoteStorageException {
        timed("delete", 0, () -> {
            delete(segment);
            return null;
        });
    }

    private void delete(RemoteLogSegmentMetadata segment) throws RemoteStorageException {
        // Every kind, kcompact's key filter too: the broker deletes the segments kcompact wrote when the topic goes.
        for (Suffix suffix : Suffix.values()) {
            String key = keys.key(segment, suffix);
            try {
                store.delete(key);
            } catch (IOException e) {
                throw new RemoteStorageException("deleting " + store.uri(key) + " failed: " + e, e);
            }
        }
    }

    @Override
    public void close() {
        if (store != null) {
            store.close();
        }
    }
}
