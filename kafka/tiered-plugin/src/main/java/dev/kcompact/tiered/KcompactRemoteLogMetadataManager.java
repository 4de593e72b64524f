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
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import java.util.stream.Stream;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * KIP-405's {@link RemoteLogMetadataManager} backed by kcompact's metadata table ({@code <store>/_kcompact_metadata},
 * {@code compaction.metadata.model}): the broker's segments are kcompact's segment rows, and a compaction's swap
 * (new rows COPY_SEGMENT_FINISHED, replaced ones DELETE_SEGMENT_STARTED, in one Delta commit) is what the broker
 * reads without a restart.
 *
 * <p>The table is read and written by kcompact's own commit path (delta-rs: conditional commits, fencing, the
 * row invariants), in a Python process this class starts ({@link MetadataPipe}), rather than by a second Delta
 * writer in the JVM: Delta Kernel for Java 4.0.0 with its default engine resolves to 24 jars, 68 MB (50 MB of them
 * Hadoop's shaded client), with Jackson 2.13 against Kafka's 2.21 and an older zstd-jni, and it would still need
 * kcompact's commit rules (the partition's row set replaced in one commit, the fencing and lineage checks)
 * written a second time in Java.
 *
 * <p>The broker's questions are answered from memory, as Kafka's own topic-based manager answers from the state it
 * consumed off its topic: each partition's rows are held with the table version they are the rows of ({@link View}),
 * so a call never waits on the Python process or on another partition's call. The process follows the table's log
 * ({@code compaction.metadata.follower}); a partition's view comes from its first question, from the answer to each
 * of this broker's own writes (the rows at a version holding the write: the broker knows its write at once), and from
 * a follower thread asking every {@code kcompact.metadata.follow.ms} which partitions another writer changed after the
 * version it followed last ({@code op=follow}; the broker's own writes are not sent again, their answers had the rows,
 * and a refused one dropped the view). A view is only ever replaced by one of a newer version, so which of two
 * answers wins is decided by version, not by arrival. Another writer's commit (a compaction's swap, gc, retention)
 * reaches the views within one follow interval; a replaced segment's objects outlive that by {@code kcompact gc}'s
 * grace ({@code file.delete.delay.ms}, 60 s by default).
 *
 * <p>A change of leadership drops the partition's view, and a first read that overlapped one is not kept: a broker
 * becoming leader decides where its tiering resumes from the partition's rows
 * ({@code RemoteLogManager.findHighestRemoteOffset}, once per leadership), so it reads them afresh, at the table's
 * newest version, with every row the old leader wrote before the change. From a view read while it followed it
 * would copy again segments the tier already holds.
 *
 * <p>Which rows the broker sees is {@link RemoteSegments}'s: live rows, and for
 * {@link #listRemoteLogSegments(TopicIdPartition)} the COPY_SEGMENT_STARTED ones too; never a zombie row nor one
 * being deleted (deleting a compaction's replaced segments after the grace period is {@code kcompact gc}'s job).
 *
 * <p>Configuration (under {@code remote.log.metadata.manager.impl.prefix}, {@code rlmm.config.}):
 * {@code kcompact.store} the store's directory or {@code s3://bucket/prefix}, {@code kcompact.python} the Python with
 * kcompact installed, {@code kcompact.endpoint.url} an S3 endpoint other than AWS's (else boto3's own resolution;
 * credentials from the broker's environment), {@code kcompact.metadata.follow.ms} how often the table's new commits
 * are read (default 1000; one listing of the log after the version followed, on S3 one LIST request).
 */
public final class KcompactRemoteLogMetadataManager implements RemoteLogMetadataManager, Monitorable {

    private static final Logger LOG = LoggerFactory.getLogger(KcompactRemoteLogMetadataManager.class);

    public static final String STORE_CONFIG = "kcompact.store";
    public static final String PYTHON_CONFIG = "kcompact.python";
    public static final String FOLLOW_MS_CONFIG = "kcompact.metadata.follow.ms";
    public static final String ENDPOINT_CONFIG = "kcompact.endpoint.url";

    private MetadataPipe pipe;
    /** The writes, committed together when threads make them at once. */
    private final GroupCommit writes = new GroupCommit(new GroupCommit.Pipe() {
        @Override
        public JsonNode call(ObjectNode request) throws RemoteStorageException {
            return timed(request);
        }

        @Override
        public ObjectNode request(String op) {
            return pipe.request(op);
        }

        @Override
        public RemoteStorageException refusal(String op, JsonNode answer) {
            MetadataPipe.CallFailed failed = pipe.refusal(op, answer);
            metrics.error(op, failed.kind());
            return failed;
        }
    });
    private int brokerId = -1;
    private long followMs = 1000;
    private final Map<TopicPartition, View> views = new ConcurrentHashMap<>();
    /** The table version the follower read last; what changed after it is what it asks for next. */
    private final AtomicLong followed = new AtomicLong(-1);
    /** Counts leadership changes: a first read across one of them is not kept. */
    private final AtomicLong leadershipChanges = new AtomicLong();
    private final TierMetrics metrics = new TierMetrics();
    private ScheduledExecutorService follower;
    private long lastFollowFailureLogNanos;

    /** Copies between their add and their COPY_SEGMENT_FINISHED (or, failed, their DELETE_SEGMENT_FINISHED), held in
     * the broker: nothing of them is committed before their finish. */
    private final Map<RemoteLogSegmentId, Copy> copies = new ConcurrentHashMap<>();

    /** A copy held since its add: the {@code copy} request committing it, and whether it failed (Kafka is deleting
     * what it wrote). */
    private record Copy(RemoteLogSegmentMetadata metadata, ObjectNode request, boolean failed) {
    }

    /** A partition's rows at table version {@code version}, as asked about under {@code tp}'s topic id. */
    private record View(TopicIdPartition tp, long version, RemoteSegments segments) {
    }

    @Override
    public void configure(Map<String, ?> configs) {
        String store = StoreSetting.of(configs, "rlmm.config.");
        Object python = configs.get(PYTHON_CONFIG);
        Object broker = configs.get("broker.id");
        if (broker != null) {
            brokerId = Integer.parseInt(broker.toString());
        }
        Object follow = configs.get(FOLLOW_MS_CONFIG);
        if (follow != null) {
            followMs = Long.parseLong(follow.toString().trim());
            if (followMs <= 0) {
                throw new IllegalArgumentException(FOLLOW_MS_CONFIG + " must be positive, found " + followMs);
            }
        }
        try {
            Object endpoint = configs.get(ENDPOINT_CONFIG);
            pipe = new MetadataPipe(python == null ? "python3" : python.toString(), store,
                    endpoint == null ? null : endpoint.toString());
        } catch (IOException | RemoteStorageException e) {
            throw new IllegalStateException("starting kcompact's metadata process for " + store + " failed: " + e, e);
        }
        followed.set(pipe.lastVersion());
        follower = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "kcompact-metadata-follower-" + brokerId);
            t.setDaemon(true);
            return t;
        });
        follower.scheduleWithFixedDelay(this::followOnce, followMs, followMs, TimeUnit.MILLISECONDS);
    }

    private ObjectNode request(String op, TopicIdPartition tp) {
        return pipe.request(op).put("topic", tp.topic()).put("partition", tp.partition())
                .put("topic_id", tp.topicId().toString()).put("broker_id", brokerId);
    }

    /** Holds the copy here, in the broker: its row is committed with its COPY_SEGMENT_FINISHED, in one Delta commit
     * ({@code op=copy}), not one commit for each event. Meanwhile {@link #listRemoteLogSegments(TopicIdPartition)}
     * shows it, as COPY_SEGMENT_STARTED, to this broker, and nothing of it is in the table: a copy that never finishes
     * (the broker dies) leaves objects no row names, which {@code kcompact gc} deletes as orphans. A segment whose
     * leader epoch the partition's view already shows superseded (a deposed leader's) is refused here at once, as the
     * commit would refuse it. */
    @Override
    public CompletableFuture<Void> addRemoteLogSegmentMetadata(RemoteLogSegmentMetadata segment)
            throws RemoteStorageException {
        long start = System.nanoTime();
        TopicIdPartition tp = segment.topicIdPartition();
        View kept = views.get(tp.topicPartition());
        int latest = segment.segmentLeaderEpochs().lastKey();
        if (kept != null && kept.tp().equals(tp)) {
            int newest = kept.segments().newestLeaderEpoch();
            if (newest > latest) {
                metrics.error("addRemoteLogSegmentMetadata", "FencedError");
                String message = String.format("%s: expected leader epoch %d or newer, found %d (segment %s [%d, %d] "
                        + "from broker-%d, a deposed leader; table version %d)", tp.topicPartition(), newest, latest,
                        segment.remoteLogSegmentId().id(), segment.startOffset(), segment.endOffset(), brokerId,
                        kept.version());
                LOG.warn("add of {} for {} refused: FencedError: {}", segment.remoteLogSegmentId().id(), tp, message);
                throw new RemoteStorageException("kcompact metadata table: FencedError: " + message);
            }
        }
        ObjectNode req = request("copy", tp)
                .put("segment_id", segment.remoteLogSegmentId().id().toString())
                .put("start_offset", segment.startOffset()).put("end_offset", segment.endOffset())
                .put("max_timestamp_ms", segment.maxTimestampMs())
                .put("event_timestamp_ms", segment.eventTimestampMs())
                .put("segment_size_bytes", segment.segmentSizeInBytes())
                .put("txn_index_empty", segment.isTxnIdxEmpty());
        ArrayNode epochs = req.putArray("leader_epochs");
        segment.segmentLeaderEpochs().forEach((epoch, offset) -> epochs.addArray().add(epoch).add(offset));
        copies.put(segment.remoteLogSegmentId(), new Copy(segment, req, false));
        metrics.call("addRemoteLogSegmentMetadata", System.nanoTime() - start, 0);
        return CompletableFuture.completedFuture(null);
    }

    /** A copy held since its add: COPY_SEGMENT_FINISHED commits it ({@code op=copy}, its one commit); a copy that
     * failed goes to DELETE_SEGMENT_STARTED, then DELETE_SEGMENT_FINISHED once Kafka deleted its objects, with
     * nothing to commit (no row names it). Any other update is committed to the segment's row. */
    @Override
    public CompletableFuture<Void> updateRemoteLogSegmentMetadata(RemoteLogSegmentMetadataUpdate update)
            throws RemoteStorageException {
        TopicIdPartition tp = update.topicIdPartition();
        RemoteLogSegmentId id = update.remoteLogSegmentId();
        Copy copy = copies.get(id);
        if (copy != null) {
            finish(copy, update);
            return CompletableFuture.completedFuture(null);
        }
        ObjectNode req = request("update", tp).put("segment_id", id.id().toString())
                .put("state", update.state().name()).put("event_timestamp_ms", update.eventTimestampMs());
        // what the storage manager found in the copied batches, passed on by Kafka (SegmentFlags); null: unknown
        SegmentFlags.transactional(update.customMetadata()).ifPresentOrElse(
                t -> req.put("transactional", t), () -> req.putNull("transactional"));
        write("updateRemoteLogSegmentMetadata", tp, req);
        return CompletableFuture.completedFuture(null);
    }

    private void finish(Copy copy, RemoteLogSegmentMetadataUpdate update) throws RemoteStorageException {
        RemoteLogSegmentId id = update.remoteLogSegmentId();
        RemoteLogSegmentState state = update.state();
        long start = System.nanoTime();
        if (state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED && !copy.failed()) {
            ObjectNode req = copy.request().deepCopy().put("event_timestamp_ms", update.eventTimestampMs());
            SegmentFlags.transactional(update.customMetadata()).ifPresentOrElse(
                    t -> req.put("transactional", t), () -> req.putNull("transactional"));
            try {
                write("updateRemoteLogSegmentMetadata", update.topicIdPartition(), req);
            } finally {
                copies.remove(id);
            }
            return;
        }
        if (state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED) {
            copies.put(id, new Copy(copy.metadata(), copy.request(), true));
        } else if (state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED && copy.failed()) {
            copies.remove(id);
        } else {
            metrics.error("updateRemoteLogSegmentMetadata", "InvalidStateTransitionError");
            throw new RemoteStorageException(String.format("kcompact metadata table: InvalidStateTransitionError: "
                    + "segment %s of %s cannot go from %s to %s", id.id(), update.topicIdPartition(),
                    copy.failed() ? "DELETE_SEGMENT_STARTED" : "COPY_SEGMENT_STARTED", state));
        }
        metrics.call("updateRemoteLogSegmentMetadata", System.nanoTime() - start, 0);
    }

    /** Commits {@code req}; its answer, the partition's rows at a version holding the commit, becomes the view. A
     * refusal is logged here and drops the view (it is read afresh next time): RemoteLogManager logs a failed copy
     * only while its task is not cancelled, and a deposed leader's copy refused by leader epoch
     * ({@code FencedError}) is usually answered after its task was. Its whole time, waiting for a batch included,
     * is recorded under {@code method} (Kafka's method). */
    private void write(String method, TopicIdPartition tp, ObjectNode req) throws RemoteStorageException {
        long start = System.nanoTime();
        try {
            install(tp, writes.write(tp.topicPartition(), req));
            metrics.call(method, System.nanoTime() - start, 0);
        } catch (RemoteStorageException e) {
            views.remove(tp.topicPartition());
            LOG.warn("{} of {} for {} refused: {}", req.get("op").asText(), req.path("segment_id").asText(), tp,
                    e.getMessage());
            throw e;
        }
    }

    /** {@code answer} (a partition's rows and their version) as {@code tp}'s view, unless the view is newer. */
    private RemoteSegments install(TopicIdPartition tp, JsonNode answer) {
        View fresh = view(tp, answer);
        return views.merge(tp.topicPartition(), fresh, (old, now) -> newer(old, now)).segments();
    }

    private static View newer(View old, View now) {
        return old.version() > now.version() && old.tp().equals(now.tp()) ? old : now;
    }

    private static View view(TopicIdPartition tp, JsonNode answer) {
        List<SegmentRow> rows = new ArrayList<>();
        for (JsonNode row : answer.get("segments")) {
            rows.add(SegmentRow.of(tp, row));
        }
        return new View(tp, answer.get("version").asLong(), new RemoteSegments(rows));
    }

    /** The partition's segments: its view, or, for a partition not asked about since its last leadership change, its
     * rows read now at the table's newest version. A first read that overlapped a leadership change is used once and
     * not kept. */
    private RemoteSegments segments(TopicIdPartition tp) throws RemoteStorageException {
        View kept = views.get(tp.topicPartition());
        boolean hit = kept != null && kept.tp().equals(tp);
        metrics.cache("listing", hit);
        if (hit) {
            return kept.segments();
        }
        long changesBefore = leadershipChanges.get();
        JsonNode answer = timed(request("segments", tp));
        if (leadershipChanges.get() != changesBefore) {
            return view(tp, answer).segments();
        }
        return install(tp, answer);
    }

    /** One round of the follower thread: the partitions with a view that another writer changed after the version
     * followed last take their new rows (a view dropped meanwhile stays dropped). A process that started after that version (the
     * old one died) cannot say what changed: every view is dropped, to be read afresh. A failure is logged (at most
     * once a minute) and the next round tries again from the same version. */
    private void followOnce() {
        try {
            JsonNode answer = timed(pipe.request("follow").put("since", followed.get()));
            if (answer.get("reset").asBoolean()) {
                views.clear();
            }
            for (JsonNode partition : answer.get("partitions")) {
                TopicPartition tp = new TopicPartition(partition.get("topic").asText(),
                        partition.get("partition").asInt());
                views.computeIfPresent(tp, (key, old) -> newer(old, view(old.tp(), partition)));
            }
            followed.set(answer.get("version").asLong());
        } catch (RemoteStorageException | RuntimeException e) {
            long now = System.nanoTime();
            if (now - lastFollowFailureLogNanos > TimeUnit.MINUTES.toNanos(1)) {
                lastFollowFailureLogNanos = now;
                LOG.warn("following kcompact's metadata table failed (retried every {} ms): {}", followMs,
                        e.getMessage());
            }
        }
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

    /** {@code answer} of {@code tp}'s segments, the whole call's time recorded under {@code op} (the name of the
     * method Kafka called; {@code listRemoteLogSegments-epoch} for the overload given a leader epoch): microseconds
     * from memory, a {@code segments} call more on a partition's first read. */
    private <T> T read(String op, TopicIdPartition tp, Function<RemoteSegments, T> answer)
            throws RemoteStorageException {
        long start = System.nanoTime();
        T result = answer.apply(segments(tp));
        metrics.call(op, System.nanoTime() - start, 0);
        return result;
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
        return read("remoteLogSegmentMetadata", tp, s -> s.segmentFor(leaderEpoch, offset));
    }

    /** KIP-1058 (Kafka 4.0): answered from the rows' transaction-index flag, not by Kafka's default (the segment
     * holding {@code offset}, whose index the broker would fetch only to find it empty). */
    @Override
    public Optional<RemoteLogSegmentMetadata> nextSegmentWithTxnIndex(TopicIdPartition tp, int leaderEpoch, long offset)
            throws RemoteStorageException {
        return read("nextSegmentWithTxnIndex", tp, s -> s.nextWithTxnIndex(leaderEpoch, offset));
    }

    @Override
    public Optional<Long> highestOffsetForEpoch(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return read("highestOffsetForEpoch", tp, s -> s.highestOffsetForEpoch(leaderEpoch));
    }

    @Override
    public CompletableFuture<Void> putRemotePartitionDeleteMetadata(RemotePartitionDeleteMetadata metadata) {
        // Kafka 4.2.1's broker never calls this (only its ClassLoaderAwareRemoteLogMetadataManager delegates here): a
        // deleted topic's segments go one by one, DELETE_SEGMENT_STARTED, deleteLogSegmentData, DELETE_SEGMENT_FINISHED
        // (RemoteLogManager.stopPartitions), through this class's updateRemoteLogSegmentMetadata. Nothing to record.
        return CompletableFuture.completedFuture(null);
    }

    /** The partition's listed rows, and this broker's copies in flight (COPY_SEGMENT_STARTED, not yet in the table:
     * Kafka's topic deletion lists them to delete them). */
    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp) throws RemoteStorageException {
        return read("listRemoteLogSegments", tp, s -> Stream.concat(s.listed(), copies.values().stream()
                .filter(c -> !c.failed() && c.metadata().topicIdPartition().equals(tp)).map(Copy::metadata))
                .iterator());
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp, int leaderEpoch)
            throws RemoteStorageException {
        return read("listRemoteLogSegments-epoch", tp, s -> s.live(leaderEpoch).map(SegmentRow::metadata).iterator());
    }

    @Override
    public void onPartitionLeadershipChanges(Set<TopicIdPartition> leaders, Set<TopicIdPartition> followers) {
        // Nothing read before may decide for the new role: RemoteLogManager calls this before it starts the new
        // leader's copy task. The new leader's partitions are read again at once, together, on the follower thread
        // (a first question before that reads its partition alone).
        long change = leadershipChanges.incrementAndGet();
        leaders.forEach(tp -> views.remove(tp.topicPartition()));
        followers.forEach(tp -> views.remove(tp.topicPartition()));
        // Copies held stay: one in flight when this broker lost the lead still finishes, and its commit is refused by
        // leader epoch if a newer leader tiered meanwhile (Kafka's own manager takes such a finish too).
        if (follower != null && !leaders.isEmpty()) {
            List<TopicIdPartition> led = List.copyOf(leaders);
            follower.execute(() -> preload(led, change));
        }
    }

    /** The views of {@code leaders}, read in one {@code load} request at one table version; dropped if another
     * leadership change came meanwhile (a partition is then read when first asked for). A failure is logged. */
    private void preload(List<TopicIdPartition> leaders, long change) {
        try {
            ObjectNode req = pipe.request("load");
            ArrayNode partitions = req.putArray("partitions");
            leaders.forEach(tp -> partitions.addObject().put("topic", tp.topic()).put("partition", tp.partition()));
            JsonNode answer = timed(req);
            if (leadershipChanges.get() != change) {
                return;
            }
            JsonNode loaded = answer.get("partitions");
            for (int i = 0; i < leaders.size(); i++) {
                install(leaders.get(i), loaded.get(i));
            }
        } catch (RemoteStorageException | RuntimeException e) {
            LOG.warn("reading the rows of {} new leader partitions failed (each is read when first asked for): {}",
                    leaders.size(), e.getMessage());
        }
    }

    /** The partitions' views and copies in flight go: a copy finishing after this is refused (its segment is
     * unknown to the table) and its objects are orphans for {@code kcompact gc}. */
    @Override
    public void onStopPartitions(Set<TopicIdPartition> partitions) {
        partitions.forEach(tp -> views.remove(tp.topicPartition()));
        copies.values().removeIf(c -> partitions.contains(c.metadata().topicIdPartition()));
    }

    @Override
    public long remoteLogSize(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return read("remoteLogSize", tp, s -> s.sizeForEpoch(leaderEpoch));
    }

    @Override
    public void close() {
        if (follower != null) {
            follower.shutdownNow();
        }
        if (pipe != null) {
            pipe.close();
        }
    }
}
