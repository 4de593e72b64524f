package dev.kcompact.tiered;

import java.io.IOException;
import java.nio.file.Path;
import java.util.Optional;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.record.FileLogInputStream.FileChannelRecordBatch;
import org.apache.kafka.common.record.FileRecords;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What the storage manager learns of a segment's bytes while it copies them, handed to the metadata manager through
 * Kafka itself: {@code copyLogSegmentData} returns it as the segment's custom metadata (KIP-917) and Kafka passes it on
 * in the {@code COPY_SEGMENT_FINISHED} update. Today one fact: whether the segment holds a transactional or control
 * batch, which kcompact's planner needs to give a partition its one-job path without guessing (the row's
 * {@code transactional}, docs/compaction-run.md). Two bytes, well under Kafka's
 * {@code remote.log.metadata.custom.metadata.max.bytes} (128): a tag, so that another storage manager's custom
 * metadata is never read as ours, and the flag.
 */
final class SegmentFlags {
    private static final Logger LOG = LoggerFactory.getLogger(SegmentFlags.class);
    private static final byte TAG = 'k';

    private SegmentFlags() {
    }

    /** Whether the segment file holds a transactional or control batch: Kafka's own batch walk, headers only. */
    static boolean holdsTransactionalOrControl(Path log) throws IOException {
        try (FileRecords records = FileRecords.open(log.toFile(), false)) {
            for (FileChannelRecordBatch batch : records.batches()) {
                if (batch.isTransactional() || batch.isControlBatch()) {
                    return true;
                }
            }
        }
        return false;
    }

    /** The custom metadata of a copy of {@code log}; empty when its batches cannot be walked (logged): the row is then
     * unknown, which a compaction handles without the one-job path, and the copy itself goes on. */
    static Optional<CustomMetadata> of(Path log) {
        try {
            return Optional.of(of(holdsTransactionalOrControl(log)));
        } catch (IOException | KafkaException e) {
            LOG.warn("reading the batch headers of {} failed; its row will not say whether it holds transactional "
                    + "batches: {}", log, e.toString());
            return Optional.empty();
        }
    }

    static CustomMetadata of(boolean transactional) {
        return new CustomMetadata(new byte[] {TAG, (byte) (transactional ? 1 : 0)});
    }

    /** The flag a copy recorded, or empty when the custom metadata is absent or not ours. */
    static Optional<Boolean> transactional(Optional<CustomMetadata> metadata) {
        return metadata.map(CustomMetadata::value).filter(v -> v.length == 2 && v[0] == TAG).map(v -> v[1] == 1);
    }
}
