package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.record.ControlRecordType;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.common.record.FileRecords;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.SimpleRecord;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The storage manager's finding on a copied segment, and its way to the metadata manager as custom metadata. */
class SegmentFlagsTest {

    @TempDir
    Path tmp;

    private Path segment(String name, MemoryRecords... batches) throws Exception {
        Path log = tmp.resolve(name);
        try (FileRecords records = FileRecords.open(log.toFile())) {
            for (MemoryRecords b : batches) {
                records.append(b);
            }
            records.flush();
        }
        return log;
    }

    private static MemoryRecords plain(long offset) {
        return MemoryRecords.withRecords(offset, Compression.NONE, new SimpleRecord("k".getBytes(), "v".getBytes()));
    }

    @Test
    void aSegmentOfPlainBatchesHoldsNoTransactionalBatch() throws Exception {
        Path log = segment("plain.log", plain(0), plain(1), plain(2));
        assertEquals(Optional.of(false), SegmentFlags.transactional(SegmentFlags.of(log)));
    }

    @Test
    void aTransactionalBatchAnywhereIsFound() throws Exception {
        MemoryRecords transactional = MemoryRecords.withTransactionalRecords(1, Compression.NONE, 7L, (short) 0, 0, 0,
                new SimpleRecord("k".getBytes(), "v".getBytes()));
        Path log = segment("txn.log", plain(0), transactional, plain(2));
        assertEquals(Optional.of(true), SegmentFlags.transactional(SegmentFlags.of(log)));
    }

    @Test
    void aControlBatchIsFound() throws Exception {
        MemoryRecords marker = MemoryRecords.withEndTransactionMarker(3, 0L, 0, 7L, (short) 0,
                new EndTransactionMarker(ControlRecordType.COMMIT, 0));
        Path log = segment("marker.log", plain(0), marker);
        assertEquals(Optional.of(true), SegmentFlags.transactional(SegmentFlags.of(log)));
    }

    @Test
    void aSegmentThatCannotBeWalkedIsUnknownAndAnotherManagersMetadataIsNotOurs() throws Exception {
        Path garbage = Files.write(tmp.resolve("garbage.log"), new byte[64]);  // a batch of length 0: not walkable
        assertEquals(Optional.empty(), SegmentFlags.transactional(SegmentFlags.of(garbage)));
        assertEquals(Optional.empty(), SegmentFlags.transactional(Optional.of(new CustomMetadata(new byte[] {1}))));
        assertEquals(Optional.empty(), SegmentFlags.transactional(Optional.empty()));
    }
}
