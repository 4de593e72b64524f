package dev.kcompact.tiered;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;

/**
 * Where a remote segment's files live in kcompact's store: the layout of {@code compaction.storage.layout},
 * {@code <prefix><topic>-<topicId>/<partition>/<20-digit start offset>-<segmentId>.<suffix>}, ids in Kafka's
 * {@code Uuid} text form. kcompact reads what the plugin writes because both build keys this way.
 */
public final class SegmentObjectKeys {

    /** The file kinds of one segment, with the suffixes {@code compaction.storage.layout.Suffix} names: Kafka's files
     * and kcompact's key filter. */
    public enum Suffix {
        LOG("log"),
        OFFSET_INDEX("index"),
        TIME_INDEX("timeindex"),
        TXN_INDEX("txnindex"),
        PRODUCER_SNAPSHOT("snapshot"),
        LEADER_EPOCH_CHECKPOINT("leader-epoch-checkpoint"),
        /** kcompact's key filter of a segment it wrote (never one the broker copies); deleted with the segment. */
        BLOOM("bloom"),
        /** The other files of a segment kcompact wrote, in one object ({@link IndexParts}). */
        INDEXES("indexes");

        public final String text;

        Suffix(String text) {
            this.text = text;
        }

        public static Suffix of(IndexType type) {
            switch (type) {
                case OFFSET: return OFFSET_INDEX;
                case TIMESTAMP: return TIME_INDEX;
                case TRANSACTION: return TXN_INDEX;
                case PRODUCER_SNAPSHOT: return PRODUCER_SNAPSHOT;
                case LEADER_EPOCH: return LEADER_EPOCH_CHECKPOINT;
                default: throw new IllegalArgumentException("no object for index type " + type);
            }
        }
    }

    private final String prefix;

    public SegmentObjectKeys(String prefix) {
        this.prefix = prefix;
    }

    public String key(RemoteLogSegmentMetadata segment, Suffix suffix) {
        TopicIdPartition tp = segment.topicIdPartition();
        return String.format("%s%s-%s/%d/%020d-%s.%s", prefix, tp.topic(), tp.topicId(), tp.partition(),
                segment.startOffset(), segment.remoteLogSegmentId().id(), suffix.text);
    }
}
