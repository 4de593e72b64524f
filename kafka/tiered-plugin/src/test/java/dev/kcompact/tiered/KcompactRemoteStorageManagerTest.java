package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import dev.kcompact.tiered.SegmentObjectKeys.Suffix;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class KcompactRemoteStorageManagerTest {

    private static final Uuid TOPIC_ID = Uuid.fromString("MWJ6FHTfRYy67jzwZdeqSQ");
    private static final Uuid SEGMENT_ID = Uuid.fromString("tqimKeZwStOEOwRzT3L5oQ");

    @TempDir
    Path tmp;
    private Path store;
    private KcompactRemoteStorageManager rsm;
    private final RemoteLogSegmentMetadata segment = new RemoteLogSegmentMetadata(
            new RemoteLogSegmentId(new TopicIdPartition(TOPIC_ID, new TopicPartition("orders.v2", 7)), SEGMENT_ID),
            1234, 1299, 5, 1, 6, 10, Map.of(0, 1234L));

    @BeforeEach
    void configure() {
        store = tmp.resolve("store");
        rsm = new KcompactRemoteStorageManager();
        rsm.configure(Map.of(KcompactRemoteStorageManager.STORE_CONFIG, store.toString()));
    }

    private Path file(String name, String content) throws IOException {
        return Files.writeString(tmp.resolve(name), content);
    }

    private LogSegmentData data(Optional<Path> txn) throws IOException {
        return new LogSegmentData(file("s.log", "0123456789"), file("s.index", "offsets"), file("s.timeindex", "times"),
                txn, file("s.snapshot", "producers"), ByteBuffer.wrap("0\n1\n0 1234\n".getBytes(StandardCharsets.UTF_8)));
    }

    private static String read(InputStream in) throws IOException {
        try (in) {
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
    }

    private Path object(String suffix) {
        return store.resolve("orders.v2-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ." + suffix);
    }

    @Test
    void copiesEveryFileUnderTheStoreLayoutAndReadsThemBack() throws Exception {
        assertEquals(Optional.of(false), SegmentFlags.transactional(rsm.copyLogSegmentData(segment,
                data(Optional.empty()))), "what the copy found in the segment's batches, for the metadata manager");

        assertEquals("0123456789", Files.readString(object("log")));
        assertEquals("0\n1\n0 1234\n", Files.readString(object("leader-epoch-checkpoint")));
        assertFalse(Files.exists(object("txnindex")), "no .txnindex when Kafka passes none");
        try (var listed = Files.list(object("log").getParent())) {
            assertEquals(5, listed.count(), "no temporary file is left behind");
        }
        assertEquals("offsets", read(rsm.fetchIndex(segment, IndexType.OFFSET)));
        assertEquals("times", read(rsm.fetchIndex(segment, IndexType.TIMESTAMP)));
        assertEquals("producers", read(rsm.fetchIndex(segment, IndexType.PRODUCER_SNAPSHOT)));
        assertThrows(RemoteResourceNotFoundException.class, () -> rsm.fetchIndex(segment, IndexType.TRANSACTION));
    }

    /** The {@code .indexes} object kcompact writes for a segment's offset and time indexes, producer snapshot,
     * leader-epoch checkpoint and key filter: {@code compaction.storage.indexes.pack_parts}'s bytes, which
     * {@code tests/unit/test_segment_parts.py} checks against the same hex. */
    static final String PACKED = "4b434958010504000000000000000905000000000000000b06000000000000000601000000000000000702"
            + "000000000000000570726f647563657273300a310a3020313233340a66696c7465726f66667365747374696d6573";
    /** The same files in the order kcompact laid them out before (by kind: offset index first), which reads the same. */
    static final String PACKED_BY_KIND = "4b434958010501000000000000000702000000000000000504000000000000000905000000000"
            + "000000b0600000000000000066f66667365747374696d657370726f647563657273300a310a3020313233340a66696c746572";

    private RemoteLogSegmentMetadata kcompacts(java.util.List<String> parts) {
        return new RemoteLogSegmentMetadata(segment.remoteLogSegmentId(), 1234, 1299, 5, 1, 6, 10,
                IndexParts.of(parts), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 1234L), true);
    }

    @Test
    void readsTheFilesOfASegmentKcompactWroteFromItsIndexesObject() throws Exception {
        Files.createDirectories(object("log").getParent());
        Files.writeString(object("log"), "0123456789");
        Files.write(object("indexes"), java.util.HexFormat.of().parseHex(PACKED));
        RemoteLogSegmentMetadata written = kcompacts(java.util.List.of("index", "timeindex", "snapshot",
                "leader-epoch-checkpoint", "bloom"));

        assertEquals("offsets", read(rsm.fetchIndex(written, IndexType.OFFSET)));
        assertEquals("times", read(rsm.fetchIndex(written, IndexType.TIMESTAMP)));
        assertEquals("producers", read(rsm.fetchIndex(written, IndexType.PRODUCER_SNAPSHOT)));
        assertEquals("0\n1\n0 1234\n", read(rsm.fetchIndex(written, IndexType.LEADER_EPOCH)));
        assertThrows(RemoteResourceNotFoundException.class, () -> rsm.fetchIndex(written, IndexType.TRANSACTION));
        assertEquals("234", read(rsm.fetchLogSegment(written, 2, 4)));
        Files.write(object("indexes"), java.util.HexFormat.of().parseHex(PACKED_BY_KIND));
        assertEquals("offsets", read(rsm.fetchIndex(written, IndexType.OFFSET)));
        assertEquals("producers", read(rsm.fetchIndex(written, IndexType.PRODUCER_SNAPSHOT)));
        assertEquals("0\n1\n0 1234\n", read(rsm.fetchIndex(written, IndexType.LEADER_EPOCH)));
        // a row that says the snapshot is in the object when it is not: not found, naming the object
        Files.write(object("indexes"), Arrays.copyOf(java.util.HexFormat.of().parseHex(PACKED), 24));
        RemoteStorageException cut = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchIndex(written, IndexType.PRODUCER_SNAPSHOT));
        assertTrue(cut.getMessage().contains(object("indexes").toString()), cut.getMessage());

        Files.writeString(object("indexes"), "not kcompact's");
        RemoteStorageException bad = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchIndex(written, IndexType.OFFSET));
        assertTrue(bad.getMessage().contains(object("indexes") + ": not an .indexes object (bad magic at byte 0)"),
                bad.getMessage());

        rsm.deleteLogSegmentData(written);
        assertFalse(Files.exists(object("indexes")), "the broker deletes the object with the segment");
        assertFalse(Files.exists(object("log")));
    }

    @Test
    void onlyItsOwnCustomMetadataSaysAFileIsInTheIndexesObject() {
        RemoteLogSegmentMetadata written = kcompacts(java.util.List.of("index", "txnindex"));
        assertTrue(IndexParts.holds(written, Suffix.OFFSET_INDEX));
        assertTrue(IndexParts.holds(written, Suffix.TXN_INDEX));
        assertFalse(IndexParts.holds(written, Suffix.TIME_INDEX));
        assertFalse(IndexParts.holds(written, Suffix.LOG));
        assertEquals(Optional.empty(), IndexParts.of(java.util.List.of()));
        assertEquals(Optional.empty(), SegmentFlags.transactional(written.customMetadata()), "not the copy's flag");
        RemoteLogSegmentMetadata copied = new RemoteLogSegmentMetadata(segment.remoteLogSegmentId(), 1234, 1299, 5, 1,
                6, 10, Optional.of(SegmentFlags.of(true)), RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                Map.of(0, 1234L));
        for (Suffix suffix : Suffix.values()) {
            assertFalse(IndexParts.holds(copied, suffix), "a broker's copy has an object per file");
        }
    }

    @Test
    void fetchesRangesWithAnInclusiveEnd() throws Exception {
        rsm.copyLogSegmentData(segment, data(Optional.of(file("s.txnindex", "aborted"))));

        assertEquals("23456789", read(rsm.fetchLogSegment(segment, 2)));
        assertEquals("234", read(rsm.fetchLogSegment(segment, 2, 4)));
        assertEquals("89", read(rsm.fetchLogSegment(segment, 8, 100)));
        assertEquals("aborted", read(rsm.fetchIndex(segment, IndexType.TRANSACTION)));
    }

    @Test
    void aFailedReadNamesTheObjectKey() throws Exception {
        Files.createDirectories(object("index").getParent().getParent());
        Files.writeString(object("index").getParent(), "a file where the partition's directory should be");
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchIndex(segment, IndexType.OFFSET));
        assertTrue(e.getMessage().startsWith("reading " + object("index") + " failed: "), e.getMessage());
    }

    @Test
    void writesAreCreateOnlyAndDeletesIdempotentAndTakeKcompactsFilterToo() throws Exception {
        rsm.copyLogSegmentData(segment, data(Optional.empty()));
        RemoteStorageException again = assertThrows(RemoteStorageException.class,
                () -> rsm.copyLogSegmentData(segment, data(Optional.empty())));
        assertTrue(again.getMessage().contains(object("log").toString()), again.getMessage());
        Files.writeString(object("bloom"), "kcompact's key filter of a compacted segment");

        rsm.deleteLogSegmentData(segment);
        rsm.deleteLogSegmentData(segment);
        RemoteStorageException missing = assertThrows(RemoteResourceNotFoundException.class,
                () -> rsm.fetchLogSegment(segment, 0));
        assertEquals("no object " + object("log"), missing.getMessage());
        assertArrayEquals(new String[0], Arrays.stream(object("log").getParent().toFile().list())
                .filter(n -> !n.startsWith(".kcompact-tmp-")).toArray(String[]::new));
    }

    @Test
    void aChunkCacheSmallerThanOneReadersChunksFailsTheConfigurationNamingTheSettings() {
        KcompactRemoteStorageManager small = new KcompactRemoteStorageManager();
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> small.configure(Map.of(
                KcompactRemoteStorageManager.STORE_CONFIG, store.toString(),
                KcompactRemoteStorageManager.CHUNK_BYTES_CONFIG, "1048576",
                KcompactRemoteStorageManager.CACHE_BYTES_CONFIG, "2097152")));
        assertTrue(e.getMessage().contains("a cache of 2097152 bytes holds less than one reader's 3 chunks"),
                e.getMessage());
    }

    @Test
    void anS3StoreWhoseProcessCannotStartFailsTheConfigurationNamingTheStore() throws Exception {
        Path python = tmp.resolve("python");
        Files.writeString(python, "#!/bin/sh\necho 'no kcompact here' >&2\nexit 3\n");
        Files.setPosixFilePermissions(python, java.nio.file.attribute.PosixFilePermissions.fromString("rwx------"));
        KcompactRemoteStorageManager s3 = new KcompactRemoteStorageManager();
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> s3.configure(Map.of(
                KcompactRemoteStorageManager.STORE_CONFIG, "s3://bucket/prefix",
                KcompactRemoteStorageManager.PYTHON_CONFIG, python.toString())));
        assertTrue(e.getMessage().startsWith("opening kcompact's store s3://bucket/prefix failed: "), e.getMessage());
        assertTrue(e.getMessage().contains("did not start: the process exited with 3"), e.getMessage());
    }
}
