package dev.kcompact.tiered;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.UUID;

/**
 * kcompact's local-directory store ({@code compaction.storage.local}): key {@code a/b/c} is the file
 * {@code <root>/a/b/c}. Writes are create-only: a temporary file in the target's directory, fsynced, then published
 * with a hard link, which fails if the name exists, so a reader never sees a partial object and two writers of one
 * key cannot both win. Temporary names start with {@code .kcompact-tmp-}, which kcompact never lists.
 */
public final class LocalDirectoryStore implements SegmentStore {

    private static final String TEMP_PREFIX = ".kcompact-tmp-";

    private final Path root;

    public LocalDirectoryStore(Path root) {
        this.root = root.toAbsolutePath();
    }

    public Path root() {
        return root;
    }

    private Path path(String key) {
        return root.resolve(key);
    }

    /** Creates {@code key} with the bytes of {@code source}; FileAlreadyExistsException if it exists. */
    @Override
    public void putFile(String key, Path source) throws IOException {
        try (FileChannel in = FileChannel.open(source, StandardOpenOption.READ)) {
            create(key, out -> {
                long size = in.size();
                long done = 0;
                while (done < size) {
                    done += in.transferTo(done, size - done, out);
                }
                return done;
            });
        }
    }

    /** Creates {@code key} with the remaining bytes of {@code data} (not consumed). */
    @Override
    public void putBytes(String key, ByteBuffer data) throws IOException {
        ByteBuffer copy = data.duplicate();
        create(key, out -> {
            long n = copy.remaining();
            while (copy.hasRemaining()) {
                out.write(copy);
            }
            return n;
        });
    }

    private interface Writer {
        long write(FileChannel out) throws IOException;
    }

    private long create(String key, Writer writer) throws IOException {
        Path target = path(key);
        Files.createDirectories(target.getParent());
        Path temp = target.resolveSibling(TEMP_PREFIX + UUID.randomUUID());
        try {
            long written;
            try (FileChannel out = FileChannel.open(temp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
                written = writer.write(out);
                out.force(true);
            }
            Files.createLink(target, temp);
            return written;
        } finally {
            Files.deleteIfExists(temp);
        }
    }

    /** The bytes of {@code key} from {@code start} (inclusive) to {@code end} (exclusive, clamped to the size). */
    @Override
    public InputStream open(String key, long start, long end) throws IOException {
        FileChannel channel = FileChannel.open(path(key), StandardOpenOption.READ);
        try {
            long stop = Math.min(end, channel.size());
            channel.position(Math.min(start, stop));
            InputStream whole = Channels.newInputStream(channel);
            return new BoundedInputStream(whole, stop - channel.position());
        } catch (IOException | RuntimeException e) {
            channel.close();
            throw e;
        }
    }

    /** Deletes {@code key}; idempotent. */
    @Override
    public void delete(String key) throws IOException {
        Files.deleteIfExists(path(key));
    }

    @Override
    public String uri(String key) {
        return path(key).toString();
    }

    @Override
    public void close() {
    }

    private static final class BoundedInputStream extends InputStream {
        private final InputStream in;
        private long left;

        BoundedInputStream(InputStream in, long left) {
            this.in = in;
            this.left = left;
        }

        @Override
        public int read() throws IOException {
            if (left <= 0) {
                return -1;
            }
            int b = in.read();
            if (b >= 0) {
                left--;
            }
            return b;
        }

        @Override
        public int read(byte[] buf, int off, int len) throws IOException {
            if (left <= 0) {
                return -1;
            }
            int n = in.read(buf, off, (int) Math.min(len, left));
            if (n > 0) {
                left -= n;
            }
            return n;
        }

        @Override
        public void close() throws IOException {
            in.close();
        }
    }
}
