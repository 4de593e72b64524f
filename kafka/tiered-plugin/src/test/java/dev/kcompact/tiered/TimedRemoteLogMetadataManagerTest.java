package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Collections;
import java.util.Iterator;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.internals.PluginMetricsImpl;
import org.apache.kafka.server.log.remote.metadata.storage.BrokerReadyCallback;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;

/** The timing wrapper passes every call on and times a write until its future completes. */
class TimedRemoteLogMetadataManagerTest {

    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.fromString("MWJ6FHTfRYy67jzwZdeqSQ"),
            new TopicPartition("orders", 0));
    private static final RemoteLogSegmentMetadata SEGMENT = new RemoteLogSegmentMetadata(
            new RemoteLogSegmentId(TP, Uuid.fromString("tqimKeZwStOEOwRzT3L5oQ")), 100, 199, 5, 1, 6, 10,
            Map.of(0, 100L));

    /** A manager whose writes complete only when the test completes them; the instance the wrapper made. */
    public static final class Delegate implements RemoteLogMetadataManager, BrokerReadyCallback {
        static volatile Delegate last;
        Map<String, ?> configs;
        boolean ready;
        boolean closed;
        final CompletableFuture<Void> pending = new CompletableFuture<>();

        public Delegate() {
            last = this;
        }

        @Override
        public void configure(Map<String, ?> configs) {
            this.configs = configs;
        }

        @Override
        public void onBrokerReady() {
            ready = true;
        }

        @Override
        public CompletableFuture<Void> addRemoteLogSegmentMetadata(RemoteLogSegmentMetadata segment) {
            return CompletableFuture.completedFuture(null);
        }

        @Override
        public CompletableFuture<Void> updateRemoteLogSegmentMetadata(RemoteLogSegmentMetadataUpdate update) {
            return pending;
        }

        @Override
        public CompletableFuture<Void> putRemotePartitionDeleteMetadata(RemotePartitionDeleteMetadata metadata) {
            return CompletableFuture.failedFuture(new RemoteStorageException("refused"));
        }

        @Override
        public Optional<RemoteLogSegmentMetadata> remoteLogSegmentMetadata(TopicIdPartition tp, int epoch, long offset) {
            return Optional.of(SEGMENT);
        }

        @Override
        public Optional<Long> highestOffsetForEpoch(TopicIdPartition tp, int epoch) {
            return Optional.of(199L);
        }

        @Override
        public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp) {
            return Collections.singletonList(SEGMENT).iterator();
        }

        @Override
        public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp, int epoch)
                throws RemoteStorageException {
            throw new RemoteStorageException("no such epoch");
        }

        @Override
        public void onPartitionLeadershipChanges(Set<TopicIdPartition> leaders, Set<TopicIdPartition> followers) {
        }

        @Override
        public void onStopPartitions(Set<TopicIdPartition> partitions) {
        }

        @Override
        public long remoteLogSize(TopicIdPartition tp, int epoch) {
            return 10;
        }

        @Override
        public void close() {
            closed = true;
        }
    }

    private static Map<String, Double> metric(Metrics registry, String name) {
        Map<String, Double> out = new TreeMap<>();
        for (KafkaMetric metric : registry.metrics().values()) {
            if (metric.metricName().name().equals(name)) {
                String key = metric.metricName().tags().get("op");
                out.put(key, ((Number) metric.metricValue()).doubleValue());
            }
        }
        return out;
    }

    @Test
    void passesEveryCallOnAndTimesWritesUntilTheirFutureCompletes() throws Exception {
        TimedRemoteLogMetadataManager timed = new TimedRemoteLogMetadataManager();
        timed.configure(Map.of(TimedRemoteLogMetadataManager.DELEGATE_CONFIG, Delegate.class.getName(),
                "remote.log.metadata.topic.replication.factor", "1"));
        Delegate delegate = Delegate.last;
        assertEquals("1", delegate.configs.get("remote.log.metadata.topic.replication.factor"));
        timed.onBrokerReady();
        assertTrue(delegate.ready);
        try (Metrics registry = new Metrics()) {
            timed.withPluginMetrics(new PluginMetricsImpl(registry, Map.of()));
            assertSame(SEGMENT, timed.remoteLogSegmentMetadata(TP, 0, 150).orElseThrow());
            assertEquals(Optional.of(199L), timed.highestOffsetForEpoch(TP, 0));
            assertSame(SEGMENT, timed.listRemoteLogSegments(TP).next());
            assertEquals(10, timed.remoteLogSize(TP, 0));
            assertThrows(RemoteStorageException.class, () -> timed.listRemoteLogSegments(TP, 3));
            timed.addRemoteLogSegmentMetadata(SEGMENT).get();
            CompletableFuture<Void> update = timed.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(
                    SEGMENT.remoteLogSegmentId(), 20, Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                    1));
            assertFalse(metric(registry, "calls-total").containsKey("updateRemoteLogSegmentMetadata"),
                    "a write is not timed before its future completes");
            Thread.sleep(60);
            delegate.pending.complete(null);
            update.get();
            assertThrows(Exception.class, () -> timed.putRemotePartitionDeleteMetadata(
                    new RemotePartitionDeleteMetadata(TP, org.apache.kafka.server.log.remote.storage
                            .RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1, 1)).get());

            Map<String, Double> calls = metric(registry, "calls-total");
            assertEquals(Map.of("addRemoteLogSegmentMetadata", 1.0, "highestOffsetForEpoch", 1.0,
                    "listRemoteLogSegments", 1.0, "remoteLogSegmentMetadata", 1.0, "remoteLogSize", 1.0,
                    "updateRemoteLogSegmentMetadata", 1.0), calls);
            assertTrue(metric(registry, "latency-max-ms").get("updateRemoteLogSegmentMetadata") >= 60,
                    "the update's wait for its future: " + metric(registry, "latency-max-ms"));
            assertEquals(Set.of("listRemoteLogSegments-epoch", "putRemotePartitionDeleteMetadata"),
                    metric(registry, "errors-total").keySet());
        }
        timed.close();
        assertTrue(delegate.closed);
    }

    @Test
    void anUnknownDelegateIsAClearError() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new
                TimedRemoteLogMetadataManager().configure(Map.of(TimedRemoteLogMetadataManager.DELEGATE_CONFIG,
                "no.such.Manager")));
        assertTrue(e.getMessage().contains("kcompact.timed.delegate=no.such.Manager"), e.getMessage());
    }
}
