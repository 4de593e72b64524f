package dev.kcompact.tiered;

import dev.kcompact.tiered.SegmentObjectKeys.Suffix;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Optional;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;

/**
 * The files of a segment kcompact wrote that live in its {@code .indexes} object rather than in objects of their own
 * (docs/fidelity.md, {@code compaction/storage/indexes.py}): kcompact's own writers put a segment as its {@code .log}
 * and one object holding its indexes, producer snapshot, leader-epoch checkpoint and key filter. The metadata
 * manager learns from each row which files that object holds and hands it on in the segment's custom metadata, which
 * Kafka passes back with the segment on every read; the storage manager then reads the object's header and the part's
 * range. A segment whose custom metadata is not this tag's (a broker's own copy) has one object per file.
 *
 * <p>The object: {@code KCIX}, version 1, the part count (1 byte), then per part its kind (1 byte) and length (8 bytes,
 * big-endian), then the parts in that order.
 */
final class IndexParts {

    private static final byte TAG = 'i';
    private static final byte[] MAGIC = {'K', 'C', 'I', 'X'};
    private static final int VERSION = 1;
    private static final int PREAMBLE = 6;
    private static final int ENTRY = 9;
    /** The longest header: every part kind once. */
    static final int MAX_HEADER = PREAMBLE + 8 * ENTRY;

    private IndexParts() {
    }

    /** The part kind {@code compaction/storage/indexes.py} gives each file, 0 for one never in the object. */
    static int code(Suffix suffix) {
        switch (suffix) {
            case OFFSET_INDEX: return 1;
            case TIME_INDEX: return 2;
            case TXN_INDEX: return 3;
            case PRODUCER_SNAPSHOT: return 4;
            case LEADER_EPOCH_CHECKPOINT: return 5;
            case BLOOM: return 6;
            default: return 0;
        }
    }

    /** The custom metadata saying the files named by their suffixes ({@code parts}) are in the object; empty for
     * none. */
    static Optional<CustomMetadata> of(Iterable<String> parts) {
        int mask = 0;
        for (String text : parts) {
            for (Suffix suffix : Suffix.values()) {
                if (suffix.text.equals(text) && code(suffix) > 0) {
                    mask |= 1 << code(suffix);
                }
            }
        }
        return mask == 0 ? Optional.empty() : Optional.of(new CustomMetadata(new byte[] {TAG, (byte) mask}));
    }

    /** Whether {@code segment}'s file {@code suffix} is a part of its {@code .indexes} object. */
    static boolean holds(RemoteLogSegmentMetadata segment, Suffix suffix) {
        int code = code(suffix);
        return code > 0 && segment.customMetadata().map(CustomMetadata::value)
                .filter(v -> v.length == 2 && v[0] == TAG).map(v -> (v[1] & (1 << code)) != 0).orElse(false);
    }

    /** Where part {@code suffix} lies, {@code [start, end)}, in the object {@code obj} whose first bytes are
     * {@code head}; an IOException naming the object and the byte at fault when the header is not one, or the part
     * is not in it. */
    static long[] locate(byte[] head, Suffix suffix, String obj) throws IOException {
        if (head.length < PREAMBLE) {
            throw new IOException(obj + ": " + head.length + " bytes, shorter than an .indexes header");
        }
        for (int i = 0; i < MAGIC.length; i++) {
            if (head[i] != MAGIC[i]) {
                throw new IOException(obj + ": not an .indexes object (bad magic at byte " + i + ")");
            }
        }
        if (head[4] != VERSION) {
            throw new IOException(obj + ": unsupported .indexes version " + head[4] + " at byte 4");
        }
        int count = head[5] & 0xff;
        if (count < 1 || count > 8 || head.length < PREAMBLE + count * ENTRY) {
            throw new IOException(obj + ": .indexes header of " + count + " parts cut or invalid at byte 5");
        }
        ByteBuffer entries = ByteBuffer.wrap(head, PREAMBLE, count * ENTRY);
        long position = PREAMBLE + (long) count * ENTRY;
        for (int i = 0; i < count; i++) {
            int code = entries.get() & 0xff;
            long length = entries.getLong();
            if (length < 0) {
                throw new IOException(obj + ": negative part length at byte " + (PREAMBLE + i * ENTRY + 1));
            }
            if (code == code(suffix)) {
                return new long[] {position, position + length};
            }
            position += length;
        }
        throw new java.nio.file.NoSuchFileException(obj + " holds no ." + suffix.text + " part");
    }
}
