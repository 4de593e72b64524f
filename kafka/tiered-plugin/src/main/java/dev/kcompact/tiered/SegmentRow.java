package dev.kcompact.tiered;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.TreeMap;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;

/** One segment row of kcompact's metadata table as the broker sees it, with where each leader epoch ends in it. */
record SegmentRow(RemoteLogSegmentMetadata metadata, boolean live) {

    /** The writer of a broker's rows is this prefix and its id ({@code writer_prefix} in the pipes' schema,
     * {@code compaction/pipes.json}; {@code PipeSchemaTest} checks it). */
    static final String WRITER_PREFIX = "broker-";

    static SegmentRow of(TopicIdPartition tp, JsonNode row) {
        NavigableMap<Integer, Long> epochs = new TreeMap<>();
        for (JsonNode e : row.get("leader_epochs")) {
            epochs.put(e.get(0).asInt(), e.get(1).asLong());
        }
        String writer = row.get("writer").asText();
        int brokerId = writer.startsWith(WRITER_PREFIX)
                ? Integer.parseInt(writer.substring(WRITER_PREFIX.length())) : -1;
        TopicIdPartition rowTp = new TopicIdPartition(Uuid.fromString(row.get("topic_id").asText()), tp.topicPartition());
        RemoteLogSegmentMetadata metadata = new RemoteLogSegmentMetadata(
                new RemoteLogSegmentId(rowTp, Uuid.fromString(row.get("segment_id").asText())),
                row.get("start_offset").asLong(), row.get("end_offset").asLong(),
                row.get("max_timestamp_ms").asLong(), brokerId, row.get("event_timestamp_ms").asLong(),
                (int) Math.min(Integer.MAX_VALUE, row.get("segment_size_bytes").asLong()), IndexParts.of(parts(row)),
                RemoteLogSegmentState.valueOf(row.get("state").asText()), epochs,
                !row.get("txn_index").asBoolean());
        return new SegmentRow(metadata, row.get("live").asBoolean());
    }

    /** The files the row says are in the segment's {@code .indexes} object (none in a row of an older kcompact). */
    private static List<String> parts(JsonNode row) {
        List<String> parts = new ArrayList<>();
        JsonNode listed = row.get("parts");
        if (listed != null) {
            listed.forEach(p -> parts.add(p.asText()));
        }
        return parts;
    }

    boolean holdsEpoch(int epoch) {
        return metadata.segmentLeaderEpochs().containsKey(epoch);
    }

    /** The last offset of {@code epoch} in this segment: the next epoch's start - 1, or the segment's end. */
    long epochEnd(int epoch) {
        Map.Entry<Integer, Long> next = metadata.segmentLeaderEpochs().higherEntry(epoch);
        return next == null ? metadata.endOffset() : next.getValue() - 1;
    }

    /** The first offset of {@code epoch} in this segment (never before the segment's start). */
    long epochStart(int epoch) {
        return Math.max(metadata.startOffset(), metadata.segmentLeaderEpochs().get(epoch));
    }
}
