package dev.kcompact.tiered;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

/**
 * {@link ChunkCache}'s optional second level: chunks the memory cache dropped, kept as files in a directory of the
 * broker's, so that a segment read again (another consumer group, a consumer rewound) comes from local disk rather
 * than the store. Off unless {@code kcompact.fetch.cache.dir} is set.
 *
 * <p>The files never exceed {@code maxBytes} (least recently used go first). They are written and read on two
 * threads of their own, never on a reader's or the store process's: a chunk dropped from memory waits for its write
 * in the heap, so at most {@code pendingWrites} such writes are queued (more are dropped, not written; the plugin
 * allows {@link #PENDING_WRITES}), and the reads' heap bound grows by as many chunks. The index of what is on disk is
 * in memory only: the directory's chunk files left by an earlier broker are deleted when the cache starts (an object
 * key names immutable bytes, so they would be right, but nothing says which key a file held).
 */
final class ChunkFiles implements AutoCloseable {

    /** Chunks dropped from memory that may wait for their write at once, in the plugin. */
    static final int PENDING_WRITES = 2;

    private static final String PREFIX = "kcompact-chunk-";
    private static final String SUFFIX = ".bin";

    private record Held(Path path, long size) {
    }

    private final Path dir;
    private final long maxBytes;
    private final int pendingWrites;
    private final ExecutorService io = Executors.newFixedThreadPool(2, r -> {
        Thread t = new Thread(r, "kcompact-chunk-files");
        t.setDaemon(true);
        return t;
    });
    /** Least recently used first; guarded by {@code this}, as are the fields below. */
    private final LinkedHashMap<Object, Held> files = new LinkedHashMap<>(64, 0.75f, true);
    /** Chunks waiting for their write, readable meanwhile from the heap they wait in. */
    private final Map<Object, byte[]> waiting = new HashMap<>();
    private long held;
    private long peak;
    private long hits;
    private long written;
    private int pending;
    private long names;

    /** Files under {@code dir} (created if missing), at most {@code maxBytes} of them, at most {@code pendingWrites}
     * chunks waiting for their write; deletes the chunk files an earlier cache left there. */
    ChunkFiles(Path dir, long maxBytes, int pendingWrites) throws IOException {
        this.dir = Files.createDirectories(dir);
        this.maxBytes = maxBytes;
        this.pendingWrites = pendingWrites;
        try (DirectoryStream<Path> left = Files.newDirectoryStream(dir, PREFIX + "*" + SUFFIX)) {
            for (Path p : left) {
                Files.deleteIfExists(p);
            }
        }
    }

    /** Bytes of chunks on disk now, and the most there ever were; chunks read back; chunks written. */
    record Stats(long heldBytes, long peakBytes, long hits, long written) {
    }

    synchronized Stats stats() {
        return new Stats(held, peak, hits, written);
    }

    /** The chunk kept under {@code id}, or null (never kept, or its file went meanwhile), read on this class's
     * threads; a chunk still waiting for its write is answered from the heap it waits in. */
    CompletableFuture<byte[]> read(Object id) {
        Held file;
        synchronized (this) {
            byte[] unwritten = waiting.get(id);
            if (unwritten != null) {
                hits++;
                return CompletableFuture.completedFuture(unwritten);
            }
            file = files.get(id);
        }
        if (file == null) {
            return CompletableFuture.completedFuture(null);
        }
        return CompletableFuture.supplyAsync(() -> {
            try {
                byte[] bytes = Files.readAllBytes(file.path());
                synchronized (this) {
                    hits++;
                }
                return bytes;
            } catch (IOException e) {
                return null;  // dropped while it was being read: the store has it
            }
        }, io);
    }

    /** Keeps {@code bytes} as chunk {@code id}, later; not at all if {@code pendingWrites} writes wait already or it
     * is larger than the whole bound. */
    void write(Object id, byte[] bytes) {
        Path path;
        synchronized (this) {
            if (pending >= pendingWrites || bytes.length > maxBytes || files.containsKey(id)
                    || waiting.containsKey(id)) {
                return;
            }
            pending++;
            waiting.put(id, bytes);
            path = dir.resolve(PREFIX + names++ + SUFFIX);
        }
        io.execute(() -> {
            List<Path> dropped = new ArrayList<>();
            try {
                Path temp = path.resolveSibling(path.getFileName() + ".tmp");
                Files.write(temp, bytes);
                Files.move(temp, path, StandardCopyOption.ATOMIC_MOVE);
                synchronized (this) {
                    Iterator<Map.Entry<Object, Held>> eldest = files.entrySet().iterator();
                    while (held + bytes.length > maxBytes && eldest.hasNext()) {
                        Held victim = eldest.next().getValue();
                        eldest.remove();
                        held -= victim.size();
                        dropped.add(victim.path());
                    }
                    files.put(id, new Held(path, bytes.length));
                    held += bytes.length;
                    peak = Math.max(peak, held);
                    written++;
                }
            } catch (IOException e) {
                dropped.add(path);  // a full or failing disk: the chunk is just not kept
            } finally {
                synchronized (this) {
                    pending--;
                    waiting.remove(id);
                }
            }
            for (Path p : dropped) {
                try {
                    Files.deleteIfExists(p);
                    Files.deleteIfExists(p.resolveSibling(p.getFileName() + ".tmp"));
                } catch (IOException e) {
                    // the next start deletes it
                }
            }
        });
    }

    /** Stops the threads and deletes the files. */
    @Override
    public void close() {
        io.shutdown();
        try {
            io.awaitTermination(10, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        synchronized (this) {
            for (Held file : files.values()) {
                try {
                    Files.deleteIfExists(file.path());
                } catch (IOException e) {
                    // the next start deletes it
                }
            }
            files.clear();
            held = 0;
        }
    }
}
