package dev.kcompact.tiered;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * KIP-405's {@link RemoteLogMetadataManager} backed by kcompact's metadata table ({@code <store>/_kcompact_metadata},
 * {@code compaction.metadata.model}): the broker's segments are kcompact's segment rows, and a compaction's swap
 * (new rows COPY_SEGMENT_FINISHED, replaced ones DELETE_SEGMENT_STARTED, in one Delta commit) is what the broker
 * reads without a restart (within the listing cache time below).
 *
 * <p>The table is read and written by kcompact's own commit path (delta-rs: conditional commits, fencing, the
 * row invariants), in a Python process this class starts ({@link MetadataPipe}), rather than by a second Delta
 * writer in the JVM: Delta Kernel for Java 4.0.0 with its default engine resolves to 24 jars, 68 MB (50 MB of them
 * Hadoop's shaded client), with Jackson 2.13 against Kafka's 2.21 and an older zstd-jni, and it would still need
 * kcompact's commit rules (the partition's row set replaced in one commit, the fencing and lineage checks)
 * written a second time in Java.
 *
 * <p>A partition's listing is reused for {@code kcompact.metadata.cache.ms} (default 5000) and dropped at once when
 * this broker writes to the partition: Kafka asks for one segment after another (a read_committed fetch walks every
 * later remote segment's transaction index, {@code RemoteLogManager.collectAbortedTransactions}), and one table read
 * per question made a fetch from a tier of ~70 segments take longer than {@code remote.fetch.max.wait.ms}, until
 * retried fetches filled the remote reader pool ({@code RejectedExecutionException}); with a 1 s cache, a loaded
 * machine (a listing read taking ~1 s) still stalled read_committed consumers, each retried fetch redoing the walk. A compaction's swap is served
 * within that time; a replaced segment's objects outlive it by {@code kcompact gc}'s grace (file.delete.delay.ms).
 *
 * <p>A change of leadership drops the partition's listing too, and a listing whose read overlapped one is not kept: a
 * broker becoming leader decides where its tiering resumes from the listing
 * ({@code RemoteLogManager.findHighestRemoteOffset}, once per leadership), and one read while it followed lacks what
 * the old leader tiered since. From that stale end it would copy again segments the tier already holds.
 *
 * <p>Which rows the broker sees is {@link RemoteSegments}'s: live rows, and for
 * {@link #listRemoteLogSegments(TopicIdPartition)} the COPY_SEGMENT_STARTED ones too; never a zombie row nor one
 * being deleted (deleting a compaction's replaced segments after the grace period is {@code kcompact gc}'s job).
 *
 * <p>Configuration (under {@code remote.log.metadata.manager.impl.prefix}, {@code rlmm.config.}):
 * {@code kcompact.store} the store's directory or {@code s3://bucket/prefix}, {@code kcompact.python} the Python with
 * kcompact installed, {@code kcompact.endpoint.url} an S3 endpoint other than AWS's (else boto3's own resolution;
 * credentials from the broker's environment), {@code kcompact.metadata.cache.ms} how long a partition's listing is
 * reused.
 */
public final class KcompactRemoteLogMetadataManager implements RemoteLogMetadataManager, Monitorable {

    private static final Logger LOG = LoggerFactory.getLogger(KcompactRemoteLogMetadataManager.class);

    public static final String STORE_CONFIG = "kcompact.store";
    public static final String PYTHON_CONFIG = "kcompact.python";
    public static final String CACHE_MS_CONFIG = "kcompact.metadata.cache.ms";
    public static final String ENDPOINT_CONFIG = "kcompact.endpoint.url";

    private MetadataPipe pipe;
    private int brokerId = -1;
    private long cacheNanos = TimeUnit.SECONDS.toNanos(5);
    private final Map<TopicIdPartition, Listing> listings = new ConcurrentHashMap<>();
    /** Counts this broker's writes and leadership changes: a listing read across one of them is not kept. */
    private final AtomicLong changes = new AtomicLong();
    private final TierMetrics metrics = new TierMetrics();

    private record Listing(RemoteSegments segments, long readAtNanos) {
    }

    @Override
    public void configure(Map<String, ?> configs) {
        String store = StoreSetting.of(configs, "rlmm.config.");
        Object python = configs.get(PYTHON_CONFIG);
        Object broker = configs.get("broker.id");
        if (broker != null) {
            brokerId = Integer.parseInt(broker.toString());
        }
        Object cacheMs = configs.get(CACHE_MS_CONFIG);
        if (cacheMs != null) {
            cacheNanos = TimeUnit.MILLISECONDS.toNanos(Long.parseLong(cacheMs.toString()));
        }
        try {
            Object endpoint = configs.get(ENDPOINT_CONFIG);
            pipe = new MetadataPipe(python == null ? "python3" : python.toString(), store,
                    endpoint == null ? null : endpoint.toString());
        } catch (IOException | RemoteStorageException e) {
            throw new IllegalStateException("starting kcompact's metadata process for " + store + " failed: " + e, e);
        }
    }

    private ObjectNode request(String op, TopicIdPartition tp) {
        return pipe.request(op).put("topic", tp.topic()).put("partition", tp.partition())
                .put("topic_id", tp.topicId().toString()).put("broker_id", brokerId);
    }

    @Override
    public CompletableFuture<Void> addRemoteLogSegmentMetadata(RemoteLogSegmentMetadata segment)
            throws RemoteStorageException {
        ObjectNode req = request("add", segment.topicIdPartition())
                .put("segment_id", segment.remoteLogSegmentId().id().toString())
                .put("start_offset", segment.startOffset()).put("end_offset", segment.endOffset())
                .put("max_timestamp_ms", segment.maxTimestampMs())
                .put("event_timestamp_ms", segment.eventTimestampMs())
                .put("segment_size_bytes", segment.segmentSizeInBytes())
                .put("txn_index_empty", segment.isTxnIdxEmpty());
        ArrayNode epochs = req.putArray("leader_epochs");
        segment.segmentLeaderEpochs().forEach((epoch, start) -> epochs.addArray().add(epoch).add(start));
        write(segment.topicIdPartition(), req);
        return CompletableFuture.completedFuture(null);
    }

    @Override
    public CompletableFuture<Void> updateRemoteLogSegmentMetadata(RemoteLogSegmentMetadataUpdate update)
            throws RemoteStorageException {
        write(update.topicIdPartition(), request("update", update.topicIdPartition())
                .put("segment_id", update.remoteLogSegmentId().id().toString())
                .put("state", update.state().name()).put("event_timestamp_ms", update.eventTimestampMs()));
        return CompletableFuture.completedFuture(null);
    }

    /** Commits {@code req}; whatever the outcome, the partition's listing is read afresh next time. A refusal is
     * logged here: RemoteLogManager logs a failed copy only while its task is not cancelled, and a deposed leader's
     * copy refused by leader epoch ({@code FencedError}) is usually answered after its task was. */
    private void write(TopicIdPartition tp, ObjectNode req) throws RemoteStorageException {
        try {
            timed(req);
        } catch (RemoteStorageException e) {
            LOG.warn("{} of {} for {} refused: {}", req.get("op").asText(), req.path("segment_id").asText(), tp,
                    e.getMessage());
            throw e;
        } finally {
            changes.incrementAndGet();
            listings.remove(tp);
        }
    }

    /** The partition's segments: the listing read less than the cache time ago, else a fresh one. A listing whose
     * read overlapped one of this broker's writes or a leadership change is used once and not kept. Threads wanting
     * a stale listing read it once, one after the other (the pipe serializes them anyway): the first reads it, the
     * others find it fresh. */
    private RemoteSegments segments(TopicIdPartition tp) throws RemoteStorageException {
        Listing kept = listings.get(tp);
        boolean hit = kept != null && System.nanoTime() - kept.readAtNanos() < cacheNanos;
        metrics.cache("listing", hit);
        if (hit) {
            return kept.segments();
        }
        synchronized (listings) {
            return readListing(tp);
        }
    }

    private RemoteSegments readListing(TopicIdPartition tp) throws RemoteStorageException {
        long now = System.nanoTime();
        Listing kept = listings.get(tp);
        if (kept != null && now - kept.readAtNanos() < cacheNanos) {
            return kept.segments();
        }
        long changesBefore = changes.get();
        List<SegmentRow> rows = new ArrayList<>();
        for (JsonNode row : timed(request("segments", tp)).get("segments")) {
            rows.add(SegmentRow.of(tp, row));
        }
        RemoteSegments fresh = new RemoteSegments(rows);
        if (changes.get() == changesBefore) {
            listings.put(tp, new Listing(fresh, now));
        }
        return fresh;
    }

    /** {@code pipe.call(req)}, its time and outcome recorded under its op. */
    private JsonNode timed(ObjectNode req) throws RemoteStorageException {
        String op = req.get("op").asText();
        long start = System.nanoTime();
        try {
            JsonNode result = pipe.call(req);
            metrics.call(op, System.nanoTime() - start, 0);
            return result;
        } catch (RemoteStorageException | RuntimeException e) {
            metrics.error(op, TierMetrics.kindOf(e));
            throw e;
        }
    }

    /** Kafka's KIP-877 hook ({@link TierMetrics} lists what is published). */
    @Override
    public void withPluginMetrics(PluginMetrics pluginMetrics) {
        metrics.gauge("python-queue-depth", "metadata calls waiting for or in the Python process",
                () -> pipe == null ? 0 : pipe.pending());
        metrics.gauge("python-restarts-total", "metadata processes started to replace one that died",
                () -> pipe == null ? 0 : pipe.restarts());
        metrics.bind(pluginMetrics);
    }

    @Override
    public Optional<RemoteLogSegmentMetadata> remoteLogSegmentMetadata(TopicIdPartition tp, int leaderEpoch,
                                                                       long offset) throws RemoteStorageException {
        return segments(tp).segmentFor(leaderEpoch, offset);
    }

    /** KIP-1058 (Kafka 4.0): answered from the rows' transaction-index flag, not by Kafka's default (the segment
     * holding {@code offset}, whose index the broker would fetch only to find it empty). */
    @Override
    public Optional<RemoteLogSegmentMetadata> nextSegmentWithTxnIndex(TopicIdPartition tp, int leaderEpoch, long offset)
            throws RemoteStorageException {
        return segments(tp).nextWithTxnIndex(leaderEpoch, offset);
    }

    @Override
    public Optional<Long> highestOffsetForEpoch(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return segments(tp).highestOffsetForEpoch(leaderEpoch);
    }

    @Override
    public CompletableFuture<Void> putRemotePartitionDeleteMetadata(RemotePartitionDeleteMetadata metadata) {
        // Kafka 4.2.1's broker never calls this (only its ClassLoaderAwareRemoteLogMetadataManager delegates here): a
        // deleted topic's segments go one by one, DELETE_SEGMENT_STARTED, deleteLogSegmentData, DELETE_SEGMENT_FINISHED
        // (RemoteLogManager.stopPartitions), through this class's updateRemoteLogSegmentMetadata. Nothing to record.
        return CompletableFuture.completedFuture(null);
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp) throws RemoteStorageException {
        return segments(tp).listed().iterator();
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp, int leaderEpoch)
            throws RemoteStorageException {
        return segments(tp).live(leaderEpoch).map(SegmentRow::metadata).iterator();
    }

    @Override
    public void onPartitionLeadershipChanges(Set<TopicIdPartition> leaders, Set<TopicIdPartition> followers) {
        // Nothing to load (a listing is read when first asked for), but nothing read before may decide for the new
        // role: RemoteLogManager calls this before it starts the new leader's copy task.
        changes.incrementAndGet();
        leaders.forEach(listings::remove);
        followers.forEach(listings::remove);
    }

    @Override
    public void onStopPartitions(Set<TopicIdPartition> partitions) {
        partitions.forEach(listings::remove);
    }

    @Override
    public long remoteLogSize(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return segments(tp).sizeForEpoch(leaderEpoch);
    }

    @Override
    public void close() {
        if (pipe != null) {
            pipe.close();
        }
    }
}
