package dev.kcompact.tiered;

import java.util.Comparator;
import java.util.List;
import java.util.Optional;
import java.util.stream.Stream;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;

/**
 * One partition's segment rows at one table version, answering the broker's lookups as Kafka's
 * {@code RemoteLogMetadataCache} does, over live rows only (COPY_SEGMENT_FINISHED and not rejected by the
 * cleaner-offset lineage, docs/fencing.md): a compaction's replaced rows (DELETE_SEGMENT_STARTED) are never shown,
 * since deleting their objects after the grace period is {@code kcompact gc}'s job, not the broker's.
 */
final class RemoteSegments {

    private final List<SegmentRow> rows;

    RemoteSegments(List<SegmentRow> rows) {
        this.rows = rows.stream().sorted(Comparator.comparingLong(r -> r.metadata().startOffset())).toList();
    }

    /** Live rows holding {@code epoch}, by start offset. */
    Stream<SegmentRow> live(int epoch) {
        return rows.stream().filter(r -> r.live() && r.holdsEpoch(epoch));
    }

    /** The live segment whose part written under {@code epoch} holds {@code offset}. */
    Optional<RemoteLogSegmentMetadata> segmentFor(int epoch, long offset) {
        SegmentRow floor = live(epoch).filter(r -> r.epochStart(epoch) <= offset).reduce((a, b) -> b).orElse(null);
        if (floor == null || offset > floor.epochEnd(epoch)) {
            return Optional.empty();
        }
        return Optional.of(floor.metadata());
    }

    /** KIP-1058's lookup: the first live segment holding {@code epoch} whose part under it reaches {@code offset}
     * and that has a transaction index. A read_committed fetch from the tier walks only these for aborted
     * transactions ({@code RemoteLogManager.findNextSegmentWithTxnIndex}), instead of every later segment. */
    Optional<RemoteLogSegmentMetadata> nextWithTxnIndex(int epoch, long offset) {
        return live(epoch).filter(r -> r.epochEnd(epoch) >= offset && !r.metadata().isTxnIdxEmpty())
                .map(SegmentRow::metadata).findFirst();
    }

    Optional<Long> highestOffsetForEpoch(int epoch) {
        return live(epoch).map(r -> r.epochEnd(epoch)).max(Long::compare);
    }

    long sizeForEpoch(int epoch) {
        return live(epoch).mapToLong(r -> r.metadata().segmentSizeInBytes()).sum();
    }

    /** The newest leader epoch any row holds (-1: none): the partition's lineage reaches it, so a segment whose
     * latest epoch is older is a deposed leader's. */
    int newestLeaderEpoch() {
        return rows.stream().mapToInt(r -> r.metadata().segmentLeaderEpochs().lastKey()).max().orElse(-1);
    }

    /** Live rows and uploads in progress (COPY_SEGMENT_STARTED); not zombies, nor rows being deleted. */
    Stream<RemoteLogSegmentMetadata> listed() {
        return rows.stream().filter(r -> r.live() || r.metadata().state() == RemoteLogSegmentState.COPY_SEGMENT_STARTED)
                .map(SegmentRow::metadata);
    }
}
