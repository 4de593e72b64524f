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
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.common.TopicIdPartition;
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
 * at a time (default 4 MiB), {@code kcompact.fetch.cache.bytes} the memory that keeps fetched chunks for the next
 * fetches of a segment (default 64 MiB; 0: none, each fetch reads its own chunks),
 * {@code kcompact.fetch.prefetch.chunks} how many chunks are fetched ahead of a reader (default 2),
 * {@code kcompact.fetch.cache.dir} a local directory that keeps the chunks dropped from memory (default none) and
 * {@code kcompact.fetch.cache.disk.bytes} how much of it (default 1 GiB), and {@code kcompact.store.threads} how
 * many requests the process serves at once (default 8). Credentials come from the broker's environment as boto3
 * resolves them.
 * {@link ChunkCache} says why segment reads go through chunks, and what bounds their memory.
 *
 * <p>A segment without a transaction index (Kafka passes none when it is empty) has no {@code .txnindex} object;
 * {@link #fetchIndex} then throws {@link RemoteResourceNotFoundException}, which is what {@code RemoteLogManager}
 * expects of a missing optional index. Every failure is a {@link RemoteStorageException} naming the object. A segment
 * kcompact wrote keeps its indexes, producer snapshot and leader-epoch checkpoint in one {@code .indexes} object, which
 * its custom metadata says ({@link IndexParts}); {@link #fetchIndex} reads such a file as its range there.
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
    public static final String CACHE_BYTES_CONFIG = "kcompact.fetch.cache.bytes";
    public static final String PREFETCH_CONFIG = "kcompact.fetch.prefetch.chunks";
    public static final String CACHE_DIR_CONFIG = "kcompact.fetch.cache.dir";
    public static final String CACHE_DISK_BYTES_CONFIG = "kcompact.fetch.cache.disk.bytes";
    /** How often a partition's segments may be listed again to find the one a reader enters next: a consumer at the
     * end of the tier looks for a segment not tiered yet at each fetch of the last chunk. */
    private static final long RELIST_MS = 5000;

    private final SegmentObjectKeys keys = new SegmentObjectKeys("");
    private final TierMetrics metrics = new TierMetrics();
    private SegmentStore store;
    /** The segment reads' chunks; null for a local directory (the page cache serves its reads) or a cache of 0. */
    private ChunkCache chunks;
    /** Per partition, the end offset of the segment last opened for a read (the chunk cache's only). */
    private final Map<TopicIdPartition, Long> lastRead = new ConcurrentHashMap<>();
    /** The segment after the one a reader is finishing, for the chunk cache; null without it. */
    private NextSegments next;
    /** How far ahead of a read chunks are fetched: its prefetch chunks, past a segment's end into the next one. */
    private long aheadBytes;

    /** Kafka's KIP-877 hook ({@link TierMetrics} lists what is published). */
    @Override
    public void withPluginMetrics(PluginMetrics pluginMetrics) {
        metrics.gauge("python-queue-depth", "store requests waiting for or in the Python process",
                () -> store == null ? 0 : store.pending());
        metrics.gauge("python-restarts-total", "store processes started to replace one that died",
                () -> store == null ? 0 : store.restarts());
        metrics.gauge("store-gets-total", "requests for objects' bytes sent to the remote store",
                () -> store == null ? 0 : store.gets());
        metrics.gauge("store-get-bytes-total", "bytes fetched from the remote store",
                () -> store == null ? 0 : store.bytesFetched());
        metrics.gauge("chunk-cache-bytes", "bytes of segment chunks held or in flight",
                () -> chunks == null ? 0 : chunks.stats().heldBytes());
        metrics.gauge("chunk-cache-peak-bytes", "the most bytes of segment chunks ever held or in flight",
                () -> chunks == null ? 0 : chunks.stats().peakBytes());
        metrics.gauge("chunk-cache-prefetches-total", "chunks fetched ahead of a reader",
                () -> chunks == null ? 0 : chunks.stats().prefetches());
        metrics.gauge("chunk-cache-unused-prefetches-total", "chunks fetched ahead and dropped before any read",
                () -> chunks == null ? 0 : chunks.stats().unusedPrefetches());
        metrics.gauge("store-lists-total", "listings of a partition's segments sent to the remote store",
                () -> store instanceof PythonStore remote ? remote.lists() : 0);
        metrics.gauge("chunk-files-bytes", "bytes of segment chunks kept on local disk",
                () -> chunks == null || chunks.diskStats() == null ? 0 : chunks.diskStats().heldBytes());
        metrics.gauge("chunk-files-hits-total", "chunks read back from local disk instead of the store",
                () -> chunks == null || chunks.diskStats() == null ? 0 : chunks.diskStats().hits());
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
        int chunkBytes = Integer.parseInt(text(configs, CHUNK_BYTES_CONFIG, "4194304"));
        long cacheBytes = Long.parseLong(text(configs, CACHE_BYTES_CONFIG, Long.toString(64L << 20)));
        ChunkCache.Settings cache = cacheBytes == 0 ? null : new ChunkCache.Settings(chunkBytes, cacheBytes,
                Integer.parseInt(text(configs, PREFETCH_CONFIG, "2")));
        PythonStore.Settings python = new PythonStore.Settings(text(configs, PYTHON_CONFIG, "python3"),
                text(configs, ENDPOINT_CONFIG, null), chunkBytes, Integer.parseInt(text(configs, THREADS_CONFIG, "8")));
        try {
            store = SegmentStore.open(uri, python);
        } catch (IOException e) {
            throw new IllegalStateException("opening kcompact's store " + uri + " failed: " + e, e);
        }
        if (store instanceof PythonStore remote && cache != null) {
            chunks = new ChunkCache(remote::fetch, cache, hit -> metrics.cache("chunk", hit), chunkFiles(configs));
            next = new NextSegments(remote::list, RELIST_MS, System::currentTimeMillis);
            aheadBytes = (long) chunkBytes * Math.max(1, cache.prefetchChunks());
        }
    }

    /** The cache's disk level, if {@code kcompact.fetch.cache.dir} names one. */
    private static ChunkFiles chunkFiles(Map<String, ?> configs) {
        String dir = text(configs, CACHE_DIR_CONFIG, null);
        if (dir == null) {
            return null;
        }
        try {
            return new ChunkFiles(Path.of(dir), Long.parseLong(text(configs, CACHE_DISK_BYTES_CONFIG,
                    Long.toString(1L << 30))), ChunkFiles.PENDING_WRITES);
        } catch (IOException e) {
            throw new IllegalStateException("kcompact's chunk cache directory " + dir + " (" + CACHE_DIR_CONFIG
                    + ") is not usable: " + e, e);
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
        Optional<CustomMetadata> flags = SegmentFlags.of(data.logSegment());
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
        return flags;
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition)
            throws RemoteStorageException {
        return counted("fetch", () -> openSegment(segment, startPosition, Long.MAX_VALUE));
    }

    /** {@code endPosition} is inclusive, as the interface says. */
    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition, int endPosition)
            throws RemoteStorageException {
        return counted("fetch", () -> openSegment(segment, startPosition, (long) endPosition + 1));
    }

    /** The segment's bytes through the chunk cache (the segment's size in its metadata bounds the prefetch); a read
     * starting within the prefetch's reach of its end ({@code kcompact.fetch.prefetch.chunks} chunks) fetches the first
     * chunk of the segment after it ahead ({@link NextSegments}), as it would a chunk of the same segment. */
    private InputStream openSegment(RemoteLogSegmentMetadata segment, long start, long end)
            throws RemoteStorageException {
        String key = keys.key(segment, Suffix.LOG);
        if (chunks == null) {
            return open(key, start, end);
        }
        lastRead.put(segment.topicIdPartition(), segment.endOffset());
        long size = segment.segmentSizeInBytes();
        if (size > 0 && start + aheadBytes >= size) {
            next.find(key.substring(0, key.lastIndexOf('/') + 1), segment.endOffset() + 1, chunks::fetchAhead);
        }
        return reading(key, start, end, () -> chunks.open(key, start, end, segment.segmentSizeInBytes()));
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata segment, IndexType indexType)
            throws RemoteStorageException {
        Suffix suffix = Suffix.of(indexType);
        if (IndexParts.holds(segment, suffix)) {
            return counted("fetch-index", () -> openPart(segment, suffix));
        }
        String key = keys.key(segment, suffix);
        if (chunks == null) {
            return counted("fetch-index", () -> open(key, 0, Long.MAX_VALUE));
        }
        if (indexType == IndexType.TRANSACTION && segment.isTxnIdxEmpty()) {
            throw new RemoteResourceNotFoundException("no object " + store.uri(key) + " (the segment's metadata "
                    + "says it has no transaction index)");
        }
        if (indexType == IndexType.OFFSET) {
            fetchAheadOfIndexes(segment);
        }
        return counted("fetch-index", () -> reading(key, 0, Long.MAX_VALUE,
                () -> chunks.open(key, 0, Long.MAX_VALUE, -1)));
    }

    /** File {@code suffix} of a segment kcompact wrote, a part of its {@code .indexes} object: the header's bytes,
     * then the part's range (through the chunk cache, both are in the object's first chunk for all but a large
     * segment's indexes). */
    private InputStream openPart(RemoteLogSegmentMetadata segment, Suffix suffix) throws RemoteStorageException {
        String key = keys.key(segment, Suffix.INDEXES);
        if (chunks != null && suffix == Suffix.OFFSET_INDEX) {
            fetchAheadOfLog(segment);
        }
        return reading(key, 0, Long.MAX_VALUE, () -> {
            byte[] head;
            try (InputStream in = chunks == null ? store.open(key, 0, IndexParts.MAX_HEADER)
                    : chunks.open(key, 0, IndexParts.MAX_HEADER, -1)) {
                head = in.readAllBytes();
            }
            long[] range = IndexParts.locate(head, suffix, store.uri(key));
            return chunks == null ? store.open(key, range[0], range[1]) : chunks.open(key, range[0], range[1], -1);
        });
    }

    /**
     * What the broker reads next once it asked for a segment's offset index: {@code RemoteIndexCache} fetches the
     * offset, time and transaction indexes one after the other (the last one not at all when the segment's metadata
     * says it has none: no request answers what the metadata says), and then the broker reads the segment. So the
     * other two indexes are fetched at once, and, when the segment follows the one last read of its partition, the
     * segment's first chunk too: a consumer going through the partition enters it at its start, and waits for one
     * request instead of four per segment.
     */
    private void fetchAheadOfIndexes(RemoteLogSegmentMetadata segment) {
        chunks.fetchAhead(keys.key(segment, Suffix.TIME_INDEX), -1);
        if (!segment.isTxnIdxEmpty()) {
            chunks.fetchAhead(keys.key(segment, Suffix.TXN_INDEX), -1);
        }
        fetchAheadOfLog(segment);
    }

    /** The segment's first chunk, when it follows the one last read of its partition. */
    private void fetchAheadOfLog(RemoteLogSegmentMetadata segment) {
        Long before = lastRead.get(segment.topicIdPartition());
        if (before != null && before + 1 == segment.startOffset()) {
            chunks.fetchAhead(keys.key(segment, Suffix.LOG), segment.segmentSizeInBytes());
        }
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
        return reading(key, start, end, () -> store.open(key, start, end));
    }

    private interface Opener {
        InputStream open() throws IOException;
    }

    /** What {@code opener} opens for the bytes {@code [start, end)} of {@code key}, its failure named. */
    private InputStream reading(String key, long start, long end, Opener opener) throws RemoteStorageException {
        if (start < 0 || end < start) {
            throw new IllegalArgumentException("invalid range [" + start + ", " + end + ") of " + key);
        }
        try {
            return opener.open();
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
        if (chunks != null) {
            chunks.close();
        }
        if (store != null) {
            store.close();
        }
    }
}
