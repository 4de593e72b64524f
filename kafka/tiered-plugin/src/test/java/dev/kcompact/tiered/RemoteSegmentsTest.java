package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.junit.jupiter.api.Test;

/** The lookups Kafka's RemoteLogMetadataCache answers, over a partition whose leadership moved 0 -> 1 -> 3. */
class RemoteSegmentsTest {

    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition("t", 0));

    private static SegmentRow row(long start, long end, Map<Integer, Long> epochs, RemoteLogSegmentState state,
                                  boolean live) {
        return row(start, end, epochs, state, live, false);
    }

    private static SegmentRow row(long start, long end, Map<Integer, Long> epochs, RemoteLogSegmentState state,
                                  boolean live, boolean txnIndex) {
        return new SegmentRow(new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TP, Uuid.randomUuid()), start, end,
                0, 1, 0, (int) (end - start + 1), Optional.empty(), state, new TreeMap<>(epochs), !txnIndex), live);
    }

    private static SegmentRow live(long start, long end, Map<Integer, Long> epochs) {
        return row(start, end, epochs, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, true);
    }

    private final SegmentRow first = live(0, 99, Map.of(0, 0L, 1, 60L));
    private final SegmentRow second = live(100, 199, Map.of(1, 100L, 3, 150L));
    private final SegmentRow replaced = row(200, 299, Map.of(3, 200L), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, false);
    private final SegmentRow zombie = row(200, 299, Map.of(3, 200L), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, false);
    private final SegmentRow uploading = row(300, 399, Map.of(3, 300L), RemoteLogSegmentState.COPY_SEGMENT_STARTED, false);
    private final RemoteSegments segments = new RemoteSegments(List.of(uploading, second, replaced, zombie, first));

    private Optional<RemoteLogSegmentMetadata> at(int epoch, long offset) {
        return segments.segmentFor(epoch, offset);
    }

    @Test
    void findsTheSegmentHoldingAnOffsetUnderItsEpoch() {
        assertEquals(Optional.of(first.metadata()), at(0, 0));
        assertEquals(Optional.of(first.metadata()), at(0, 59));
        assertEquals(Optional.empty(), at(0, 60), "offset 60 was written under epoch 1");
        assertEquals(Optional.of(first.metadata()), at(1, 99));
        assertEquals(Optional.of(second.metadata()), at(1, 100));
        assertEquals(Optional.of(second.metadata()), at(3, 199));
        assertEquals(Optional.empty(), at(3, 200), "no live row above 199");
        assertEquals(Optional.empty(), at(2, 120), "no segment holds epoch 2");
    }

    @Test
    void highestOffsetPerEpochIsWhereTheEpochEndsInTheLiveRows() {
        assertEquals(Optional.of(59L), segments.highestOffsetForEpoch(0));
        assertEquals(Optional.of(149L), segments.highestOffsetForEpoch(1));
        assertEquals(Optional.of(199L), segments.highestOffsetForEpoch(3));
        assertEquals(Optional.empty(), segments.highestOffsetForEpoch(2));
        assertEquals(200L, segments.sizeForEpoch(1));
    }

    @Test
    void theNextSegmentWithATransactionIndexSkipsThoseWithout() {
        SegmentRow plain = live(0, 99, Map.of(0, 0L));
        SegmentRow aborted = row(100, 199, Map.of(0, 100L, 1, 150L), RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                true, true);
        SegmentRow deleted = row(200, 299, Map.of(1, 200L), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, false, true);
        SegmentRow later = row(300, 399, Map.of(1, 300L), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, true, true);
        RemoteSegments log = new RemoteSegments(List.of(later, deleted, aborted, plain));
        assertEquals(Optional.of(aborted.metadata()), log.nextWithTxnIndex(0, 0));
        assertEquals(Optional.of(aborted.metadata()), log.nextWithTxnIndex(0, 149));
        assertEquals(Optional.empty(), log.nextWithTxnIndex(0, 150), "epoch 0 ends at 149");
        assertEquals(Optional.of(aborted.metadata()), log.nextWithTxnIndex(1, 150));
        assertEquals(Optional.of(later.metadata()), log.nextWithTxnIndex(1, 200), "not the row being deleted");
        assertEquals(Optional.empty(), log.nextWithTxnIndex(1, 400));
    }

    @Test
    void listsLiveRowsAndUploadsButNoZombieNorRowBeingDeleted() {
        assertEquals(List.of(first.metadata(), second.metadata(), uploading.metadata()),
                segments.listed().toList());
        assertEquals(List.of(second), segments.live(3).toList());
    }
}
