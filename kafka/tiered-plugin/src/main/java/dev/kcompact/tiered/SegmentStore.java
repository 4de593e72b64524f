package dev.kcompact.tiered;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Path;

/**
 * kcompact's store as the remote storage manager uses it: create-only objects under the keys of
 * {@link SegmentObjectKeys}, read by byte range, deleted idempotently. Chosen by the store's URI, as
 * {@code compaction.storage.open_store} does: a directory is a {@link LocalDirectoryStore}, anything else
 * ({@code s3://bucket/prefix}) a {@link PythonStore}, which reaches it through kcompact's own store in Python.
 *
 * <p>A missing object is a {@link java.nio.file.NoSuchFileException}, an existing one on create a
 * {@link java.nio.file.FileAlreadyExistsException}; every other failure an {@link IOException}.
 */
interface SegmentStore extends AutoCloseable {

    /** Creates {@code key} with the bytes of the local file {@code source}. */
    void putFile(String key, Path source) throws IOException;

    /** Creates {@code key} with the remaining bytes of {@code data} (not consumed). */
    void putBytes(String key, ByteBuffer data) throws IOException;

    /** The bytes of {@code key} from {@code start} (inclusive) to {@code end} (exclusive, clamped to the size). */
    InputStream open(String key, long start, long end) throws IOException;

    /** Deletes {@code key}; idempotent. */
    void delete(String key) throws IOException;

    /** Requests waiting for or in a helper process (the metrics' queue depth); 0 for a store without one. */
    default int pending() {
        return 0;
    }

    /** Helper processes started to replace one that died; 0 for a store without one. */
    default long restarts() {
        return 0;
    }

    /** Requests for an object's bytes sent to a remote store (each one GET); 0 for a local directory. */
    default long gets() {
        return 0;
    }

    /** The bytes those requests fetched. */
    default long bytesFetched() {
        return 0;
    }

    /** Where {@code key} is, as messages name it. */
    String uri(String key);

    @Override
    void close();

    /** The store at {@code uri}: a local directory (a path or {@code file://}), else kcompact's Python side. */
    static SegmentStore open(String uri, PythonStore.Settings python) throws IOException {
        if (uri.startsWith("file://")) {
            return new LocalDirectoryStore(Path.of(java.net.URI.create(uri)));
        }
        if (uri.matches("^[A-Za-z][A-Za-z0-9+.-]*://.*")) {
            return new PythonStore(uri, python);
        }
        return new LocalDirectoryStore(Path.of(uri));
    }
}
