package dev.kcompact.tiered;

import java.io.IOException;
import java.util.Iterator;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.server.log.remote.metadata.storage.BrokerReadyCallback;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/**
 * Another {@link RemoteLogMetadataManager}, by default Kafka's own {@code TopicBasedRemoteLogMetadataManager}, with
 * each of its calls timed and published as kcompact's manager publishes its own ({@link TierMetrics}, the same
 * {@code op} names and metrics), so that the two can be compared call by call on one broker under one load.
 *
 * <p>A write's time runs from the call to the completion of the future it returns: Kafka's remote log manager waits
 * on that future ({@code RemoteLogManager.copyLogSegment} calls {@code .get()} on both of a copy's writes), and the
 * topic-based manager completes it once its own consumer has read the event back. kcompact's manager returns a
 * completed future after its commit, so both figures are what a copier thread waits.
 *
 * <p>Configuration (under {@code remote.log.metadata.manager.impl.prefix}, {@code rlmm.config.}):
 * {@code kcompact.timed.delegate} the class wrapped (default {@value #DEFAULT_DELEGATE}); every setting is passed on
 * to it as given. The broker's ready callback is passed on when the wrapped manager takes one.
 */
public final class TimedRemoteLogMetadataManager implements RemoteLogMetadataManager, Monitorable,
        BrokerReadyCallback {

    public static final String DELEGATE_CONFIG = "kcompact.timed.delegate";
    public static final String DEFAULT_DELEGATE =
            "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager";

    private final TierMetrics metrics = new TierMetrics();
    private RemoteLogMetadataManager delegate;

    @Override
    public void configure(Map<String, ?> configs) {
        Object name = configs.get(DELEGATE_CONFIG);
        String className = name == null ? DEFAULT_DELEGATE : name.toString().trim();
        try {
            delegate = (RemoteLogMetadataManager) Class.forName(className, true, getClass().getClassLoader())
                    .getDeclaredConstructor().newInstance();
        } catch (ReflectiveOperationException | ClassCastException e) {
            throw new IllegalArgumentException(DELEGATE_CONFIG + "=" + className
                    + ": not a RemoteLogMetadataManager with a public no-argument constructor (" + e + ")", e);
        }
        delegate.configure(configs);
    }

    @Override
    public void withPluginMetrics(PluginMetrics pluginMetrics) {
        metrics.bind(pluginMetrics);
    }

    @Override
    public void onBrokerReady() {
        if (delegate instanceof BrokerReadyCallback callback) {
            callback.onBrokerReady();
        }
    }

    /** A call returning a value. */
    private interface Call<T> {
        T run() throws RemoteStorageException;
    }

    private <T> T timed(String op, Call<T> call) throws RemoteStorageException {
        long start = System.nanoTime();
        try {
            T result = call.run();
            metrics.call(op, System.nanoTime() - start, 0);
            return result;
        } catch (RemoteStorageException | RuntimeException e) {
            metrics.error(op, TierMetrics.kindOf(e));
            throw e;
        }
    }

    /** A write: timed until its future completes (or fails). */
    private CompletableFuture<Void> write(String op, Call<CompletableFuture<Void>> call) throws RemoteStorageException {
        long start = System.nanoTime();
        CompletableFuture<Void> future;
        try {
            future = call.run();
        } catch (RemoteStorageException | RuntimeException e) {
            metrics.error(op, TierMetrics.kindOf(e));
            throw e;
        }
        return future.whenComplete((ignored, error) -> {
            if (error == null) {
                metrics.call(op, System.nanoTime() - start, 0);
            } else {
                metrics.error(op, TierMetrics.kindOf(error));
            }
        });
    }

    @Override
    public CompletableFuture<Void> addRemoteLogSegmentMetadata(RemoteLogSegmentMetadata segment)
            throws RemoteStorageException {
        return write("addRemoteLogSegmentMetadata", () -> delegate.addRemoteLogSegmentMetadata(segment));
    }

    @Override
    public CompletableFuture<Void> updateRemoteLogSegmentMetadata(RemoteLogSegmentMetadataUpdate update)
            throws RemoteStorageException {
        return write("updateRemoteLogSegmentMetadata", () -> delegate.updateRemoteLogSegmentMetadata(update));
    }

    @Override
    public CompletableFuture<Void> putRemotePartitionDeleteMetadata(RemotePartitionDeleteMetadata metadata)
            throws RemoteStorageException {
        return write("putRemotePartitionDeleteMetadata", () -> delegate.putRemotePartitionDeleteMetadata(metadata));
    }

    @Override
    public Optional<RemoteLogSegmentMetadata> remoteLogSegmentMetadata(TopicIdPartition tp, int leaderEpoch,
                                                                       long offset) throws RemoteStorageException {
        return timed("remoteLogSegmentMetadata", () -> delegate.remoteLogSegmentMetadata(tp, leaderEpoch, offset));
    }

    @Override
    public Optional<RemoteLogSegmentMetadata> nextSegmentWithTxnIndex(TopicIdPartition tp, int leaderEpoch, long offset)
            throws RemoteStorageException {
        return timed("nextSegmentWithTxnIndex", () -> delegate.nextSegmentWithTxnIndex(tp, leaderEpoch, offset));
    }

    @Override
    public Optional<Long> highestOffsetForEpoch(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return timed("highestOffsetForEpoch", () -> delegate.highestOffsetForEpoch(tp, leaderEpoch));
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp) throws RemoteStorageException {
        return timed("listRemoteLogSegments", () -> delegate.listRemoteLogSegments(tp));
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp, int leaderEpoch)
            throws RemoteStorageException {
        return timed("listRemoteLogSegments-epoch", () -> delegate.listRemoteLogSegments(tp, leaderEpoch));
    }

    @Override
    public long remoteLogSize(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return timed("remoteLogSize", () -> delegate.remoteLogSize(tp, leaderEpoch));
    }

    @Override
    public boolean isReady(TopicIdPartition tp) {
        return delegate.isReady(tp);
    }

    @Override
    public void onPartitionLeadershipChanges(Set<TopicIdPartition> leaders, Set<TopicIdPartition> followers) {
        delegate.onPartitionLeadershipChanges(leaders, followers);
    }

    @Override
    public void onStopPartitions(Set<TopicIdPartition> partitions) {
        delegate.onStopPartitions(partitions);
    }

    @Override
    public void close() throws IOException {
        if (delegate != null) {
            delegate.close();
        }
    }
}
