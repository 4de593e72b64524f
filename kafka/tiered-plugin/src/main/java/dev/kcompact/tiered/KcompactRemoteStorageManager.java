package dev.kcompact.tiered;

import dev.kcompact.tiered.SegmentObjectKeys.Suffix;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

/**
 * KIP-405's {@link RemoteStorageManager} writing a segment's files into kcompact's store, the way
 * {@code kcompact tier} does (one object per file, {@link SegmentObjectKeys}), so that kcompact compacts what the
 * broker tiers and the broker serves what kcompact compacted. A local directory store for now.
 *
 * <p>Configuration (under the broker's {@code remote.log.storage.manager.impl.prefix}, {@code rsm.config.}):
 * {@code kcompact.store} the store's directory. A segment without a transaction index (Kafka passes none when it is
 * empty) has no {@code .txnindex} object; {@link #fetchIndex} then throws {@link RemoteResourceNotFoundException},
 * which is what {@code RemoteLogManager} expects of a missing optional index.
 */
public final class KcompactRemoteStorageManager implements RemoteStorageManager {

    public static final String STORE_CONFIG = "kcompact.store";

    private final SegmentObjectKeys keys = new SegmentObjectKeys("");
    private LocalDirectoryStore store;

    @Override
    public void configure(Map<String, ?> configs) {
        Object dir = configs.get(STORE_CONFIG);
        if (dir == null) {
            throw new IllegalArgumentException("rsm.config." + STORE_CONFIG + " is required: kcompact's store directory");
        }
        store = new LocalDirectoryStore(Path.of(dir.toString()));
    }

    @Override
    public Optional<CustomMetadata> copyLogSegmentData(RemoteLogSegmentMetadata segment, LogSegmentData data)
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
            throw new RemoteStorageException("copying " + segment.remoteLogSegmentId() + " to " + store.root() + "/"
                    + key + " failed: " + e, e);
        }
        return Optional.empty();
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition)
            throws RemoteStorageException {
        return open(keys.key(segment, Suffix.LOG), startPosition, Long.MAX_VALUE);
    }

    /** {@code endPosition} is inclusive, as the interface says. */
    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition, int endPosition)
            throws RemoteStorageException {
        return open(keys.key(segment, Suffix.LOG), startPosition, (long) endPosition + 1);
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata segment, IndexType indexType)
            throws RemoteStorageException {
        return open(keys.key(segment, Suffix.of(indexType)), 0, Long.MAX_VALUE);
    }

    private InputStream open(String key, long start, long end) throws RemoteStorageException {
        if (start < 0 || end < start) {
            throw new IllegalArgumentException("invalid range [" + start + ", " + end + ") of " + key);
        }
        try {
            return store.open(key, start, end);
        } catch (IOException e) {
            if (LocalDirectoryStore.isMissing(e)) {
                throw new RemoteResourceNotFoundException("no object " + store.root() + "/" + key);
            }
            throw new RemoteStorageException("reading " + store.root() + "/" + key + " failed: " + e, e);
        }
    }

    /** Deletes every file of the segment; idempotent (a file already gone is no error). */
    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata segment) throws RemoteStorageException {
        for (Suffix suffix : Suffix.values()) {
            String key = keys.key(segment, suffix);
            try {
                store.delete(key);
            } catch (IOException e) {
                throw new RemoteStorageException("deleting " + store.root() + "/" + key + " failed: " + e, e);
            }
        }
    }

    @Override
    public void close() {
    }
}
