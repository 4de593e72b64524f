package dev.kcompact.tiered;

import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.nio.file.NoSuchFileException;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.function.Predicate;

/**
 * Remote reads of segment objects in chunks aligned on {@code chunkBytes}, kept in a bounded memory cache and fetched
 * ahead of the reader. The broker reads a remote segment one fetch at a time: each consumer fetch is a new
 * {@code fetchLogSegment} at a later position of the same segment (the position of the offset index entry at or
 * below the fetch offset), from which it reads about {@code max.partition.fetch.bytes} (1 MiB by default) and closes
 * the stream. A chunk read per stream fetches a whole chunk for each such megabyte; here the successive streams share
 * the chunks (a chunk's bytes come from the store once while the cache holds it), and while the broker reads chunk
 * {@code k} the next {@code prefetchChunks} are already being fetched (several requests in flight per reader: the
 * store's latency is paid once per chunk, not once per fetch).
 *
 * <p>Memory: the chunks the cache holds, counting each one in flight at its full size, never exceed
 * {@code maxBytes}; a chunk that does not fit once every chunk already read has been dropped (least recently used
 * first) is not prefetched, and a reader who needs it reads it without caching it. A stream keeps a reference to the
 * chunk it is reading, so the reads' heap is at most {@code maxBytes} plus one chunk per open stream (the broker
 * opens one per remote fetch in flight: {@code remote.log.reader.threads}, 10 by default). Chunks never change: an
 * object key names an immutable object (kcompact's store is create-only), so nothing is ever invalidated.
 *
 * <p>With a {@link ChunkFiles} the chunks dropped from memory go to local disk, and a chunk missing from memory is
 * looked for there before the store.
 */
final class ChunkCache {

    /** Where chunks come from: the bytes {@code [start, end)} of {@code key}, cut short at its end, answered later. */
    interface Source {
        CompletableFuture<byte[]> fetch(String key, long start, long end);
    }

    /**
     * The chunk size, the memory bound ({@code maxBytes}, at least one reader's chunks: the one it reads and those
     * fetched ahead), and how many chunks are fetched ahead of a reader.
     */
    record Settings(int chunkBytes, long maxBytes, int prefetchChunks) {
        Settings {
            if (chunkBytes <= 0 || prefetchChunks < 0) {
                throw new IllegalArgumentException("chunk bytes " + chunkBytes + " and prefetch chunks "
                        + prefetchChunks + ": the chunk must be positive, the prefetch at least 0");
            }
            if (maxBytes < (long) chunkBytes * (prefetchChunks + 1)) {
                throw new IllegalArgumentException("a cache of " + maxBytes + " bytes holds less than one reader's "
                        + (prefetchChunks + 1) + " chunks of " + chunkBytes + " bytes (the one read and those "
                        + "fetched ahead): raise the cache or lower the chunk or the prefetch");
            }
        }
    }

    /** Told of every chunk a reader looks up: found in the cache (or in flight), or not. */
    interface Lookups {
        void lookup(boolean hit);
    }

    /** What the cache did since it started; {@code heldBytes} now, {@code peakBytes} the most it ever held. */
    record Stats(long gets, long bytesFetched, long hits, long misses, long prefetches, long unusedPrefetches,
                 long heldBytes, long peakBytes) {
    }

    private record ChunkId(String key, long index) {
    }

    /** A chunk in the cache: in flight until {@code bytes} completes; {@code size} its share of the bound. */
    private static final class Entry {
        final CompletableFuture<byte[]> bytes = new CompletableFuture<>();
        long size;
        boolean arrived;
        boolean read;
        boolean passed;

        Entry(long reserved, boolean read) {
            this.size = reserved;
            this.read = read;
        }
    }

    private final Source source;
    private final Settings settings;
    private final Lookups lookups;
    /** Where dropped chunks go, and are looked for before the store; null: memory only. */
    private final ChunkFiles disk;
    /** Least recently used first; guarded by {@code this}, as are the counters below. */
    private final LinkedHashMap<ChunkId, Entry> entries = new LinkedHashMap<>(64, 0.75f, true);
    private long held;
    private long peak;
    private long gets;
    private long bytesFetched;
    private long hits;
    private long misses;
    private long prefetches;
    private long unusedPrefetches;

    ChunkCache(Source source, Settings settings, Lookups lookups) {
        this(source, settings, lookups, null);
    }

    ChunkCache(Source source, Settings settings, Lookups lookups, ChunkFiles disk) {
        this.source = source;
        this.settings = settings;
        this.lookups = lookups;
        this.disk = disk;
    }

    /** Stops the disk level, if any, and deletes its files. */
    void close() {
        if (disk != null) {
            disk.close();
        }
    }

    /** The disk level's figures; null without one. */
    ChunkFiles.Stats diskStats() {
        return disk == null ? null : disk.stats();
    }

    synchronized Stats stats() {
        return new Stats(gets, bytesFetched, hits, misses, prefetches, unusedPrefetches, held, peak);
    }

    /**
     * The bytes {@code [start, end)} of {@code key} ({@code end} clamped to the object's size). {@code sizeHint}
     * (negative: unknown) is what the caller believes the object's size to be; it only stops prefetching past it,
     * never a read: an object longer than its hint is read to its real end. The chunk holding {@code start} is
     * awaited here, so a missing object fails at the open, as a direct read does.
     */
    InputStream open(String key, long start, long end, long sizeHint) throws IOException {
        return new CachedStream(key, start, end, sizeHint);
    }

    /** Chunk {@code index} of {@code key}, from the cache or fetched (and cached if it fits), with the next chunks
     * fetched ahead. */
    private CompletableFuture<byte[]> chunk(String key, long index, long end, long sizeHint) {
        ChunkId id = new ChunkId(key, index);
        Entry found;
        Entry admitted = null;
        synchronized (this) {
            found = entries.get(id);
            if (found != null) {
                hits++;
                found.read = true;
            } else {
                misses++;
                admitted = admit(id, reserve(index, sizeHint), true);
            }
        }
        lookups.lookup(found != null);
        CompletableFuture<byte[]> bytes;
        if (found != null) {
            bytes = found.bytes;
        } else if (admitted != null) {
            start(id, admitted);
            bytes = admitted.bytes;
        } else {
            bytes = load(id);
        }
        if (sizeHint >= 0) {
            prefetch(key, index, end, sizeHint);
        } else {
            // an object of unknown size (an index) may end in this chunk: fetch ahead once it is known not to
            bytes.thenAccept(got -> {
                if (got.length == settings.chunkBytes()) {
                    prefetch(key, index, end, sizeHint);
                }
            });
        }
        return bytes;
    }

    private void prefetch(String key, long index, long end, long sizeHint) {
        long limit = sizeHint >= 0 ? Math.min(end, sizeHint) : end;
        for (int ahead = 1; ahead <= settings.prefetchChunks(); ahead++) {
            long next = index + ahead;
            if (next * settings.chunkBytes() >= limit || !fetchAhead(new ChunkId(key, next), sizeHint)) {
                return;
            }
        }
    }

    /**
     * Fetches the first chunk of {@code key} ahead of a reader the caller expects (false: no room for it), as a
     * prefetch: it drops no other chunk. {@code sizeHint} as for {@link #open}.
     */
    boolean fetchAhead(String key, long sizeHint) {
        return sizeHint == 0 || fetchAhead(new ChunkId(key, 0), sizeHint);
    }

    private boolean fetchAhead(ChunkId id, long sizeHint) {
        Entry entry;
        synchronized (this) {
            if (entries.containsKey(id)) {
                return true;
            }
            entry = admit(id, reserve(id.index(), sizeHint), false);
            if (entry == null) {
                return false;
            }
            prefetches++;
        }
        start(id, entry);
        return true;
    }

    /** A new chunk's share of the bound until it arrives: a whole chunk, or less where the hint says it ends. */
    private long reserve(long index, long sizeHint) {
        long chunk = settings.chunkBytes();
        return sizeHint >= 0 ? Math.max(0, Math.min(chunk, sizeHint - index * chunk)) : chunk;
    }

    /**
     * A new entry for {@code id} once arrived chunks have been dropped to make room for {@code reserved} bytes; null if
     * there is no room. Chunks a reader has gone past go first, least recently used first. A chunk fetched ahead drops
     * no other; a chunk a reader waits for then drops the chunks other readers are in, then those fetched ahead that
     * no one read yet. (Readers who together want more than the cache would otherwise drop each other's chunks before
     * reading them, and fetch more than a chunk per fetch, as without the cache.) Chunks in flight stay. Called
     * holding the lock; whoever admitted an entry starts its fetch once it is released.
     */
    private Entry admit(ChunkId id, long reserved, boolean read) {
        drop(reserved, e -> e.passed);
        if (read) {
            drop(reserved, e -> e.read);
            drop(reserved, e -> true);
        }
        if (held + reserved > settings.maxBytes()) {
            return null;
        }
        Entry entry = new Entry(reserved, read);
        entries.put(id, entry);
        held += reserved;
        peak = Math.max(peak, held);
        return entry;
    }

    /** Drops arrived chunks that {@code which} accepts, least recently used first, until {@code reserved} more bytes
     * fit. */
    private void drop(long reserved, Predicate<Entry> which) {
        Iterator<Map.Entry<ChunkId, Entry>> eldest = entries.entrySet().iterator();
        while (held + reserved > settings.maxBytes() && eldest.hasNext()) {
            Map.Entry<ChunkId, Entry> next = eldest.next();
            Entry victim = next.getValue();
            if (victim.arrived && which.test(victim)) {
                eldest.remove();
                held -= victim.size;
                if (!victim.read) {
                    unusedPrefetches++;
                }
                // a failed chunk has size 0; arrived is set before the bytes complete, outside the lock, so a chunk
                // dropped in between is not kept
                byte[] bytes = disk != null && victim.size > 0 ? victim.bytes.getNow(null) : null;
                if (bytes != null) {
                    disk.write(next.getKey(), bytes);
                }
            }
        }
    }

    /** A reader read chunk {@code index} of {@code key} to its end: it goes first, least recently used first (the
     * next fetch may start back in it, a segment behind the reader will not be read again soon). */
    private synchronized void passed(String key, long index) {
        Entry entry = entries.get(new ChunkId(key, index));
        if (entry != null) {
            entry.passed = true;
        }
    }

    /**
     * Fetches {@code id} into {@code entry}: on arrival its share of the bound becomes its real size. A failed one
     * leaves the cache, so that the next reader asks again (a prefetch's failure is seen by no one until then), but for
     * a missing object, which stays missing (objects are created whole, before the broker lists them) and is kept as
     * such: a transaction index that was never written is asked for once.
     */
    private void start(ChunkId id, Entry entry) {
        load(id).whenComplete((bytes, failure) -> {
            synchronized (this) {
                entry.arrived = true;
                if (failure != null) {
                    held -= entry.size;
                    entry.size = 0;
                    if (!(unwrap(failure) instanceof NoSuchFileException)) {
                        entries.remove(id, entry);
                    }
                } else {
                    held += bytes.length - entry.size;
                    entry.size = bytes.length;
                }
            }
            if (failure != null) {
                entry.bytes.completeExceptionally(failure);
            } else {
                entry.bytes.complete(bytes);
            }
        });
    }

    /** Chunk {@code id} from the disk level if it has it, else from the store. */
    private CompletableFuture<byte[]> load(ChunkId id) {
        if (disk == null) {
            return fetch(id);
        }
        return disk.read(id).thenCompose(bytes -> bytes != null ? CompletableFuture.completedFuture(bytes) : fetch(id));
    }

    /** One request to the store for chunk {@code id}, counted. */
    private CompletableFuture<byte[]> fetch(ChunkId id) {
        long from = id.index() * settings.chunkBytes();
        synchronized (this) {
            gets++;
        }
        return source.fetch(id.key(), from, from + settings.chunkBytes()).thenApply(bytes -> {
            synchronized (this) {
                bytesFetched += bytes.length;
            }
            return bytes;
        });
    }

    private static Throwable unwrap(Throwable failure) {
        return failure instanceof CompletionException && failure.getCause() != null ? failure.getCause() : failure;
    }

    private static byte[] await(CompletableFuture<byte[]> chunk, String key) throws IOException {
        try {
            return chunk.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted waiting for a chunk of " + key);
        } catch (ExecutionException e) {
            throw e.getCause() instanceof IOException io ? io : new IOException(e.getCause());
        }
    }

    /** A reader's way through the chunks of {@code [pos, end)}. */
    private final class CachedStream extends InputStream {
        private final String key;
        private final long end;
        private final long sizeHint;
        private long pos;
        private byte[] chunk;
        private long chunkStart;

        CachedStream(String key, long start, long end, long sizeHint) throws IOException {
            this.key = key;
            this.end = end;
            this.sizeHint = sizeHint;
            this.pos = start;
            load();
        }

        private void load() throws IOException {
            long index = pos / settings.chunkBytes();
            chunk = await(chunk(key, index, end, sizeHint), key);
            chunkStart = index * settings.chunkBytes();
        }

        /** Bytes readable now without waiting; 0 at the end of the range or the object. */
        private int ready() throws IOException {
            if (pos >= end) {
                return 0;
            }
            long left = chunkStart + chunk.length - pos;
            if (left <= 0) {
                passed(key, chunkStart / settings.chunkBytes());
                if (chunk.length < settings.chunkBytes()) {
                    return 0;  // a short chunk is the object's last
                }
                load();
                left = chunkStart + chunk.length - pos;
            }
            return (int) Math.max(0, Math.min(left, end - pos));
        }

        @Override
        public int read() throws IOException {
            if (ready() == 0) {
                return -1;
            }
            return chunk[(int) (pos++ - chunkStart)] & 0xff;
        }

        @Override
        public int read(byte[] buf, int off, int len) throws IOException {
            if (len == 0) {
                return 0;
            }
            int n = Math.min(len, ready());
            if (n == 0) {
                return -1;
            }
            System.arraycopy(chunk, (int) (pos - chunkStart), buf, off, n);
            pos += n;
            return n;
        }

        /** Lets go of the chunk (the cache may still hold it); reads after it see the end. */
        @Override
        public void close() {
            chunk = new byte[0];
            chunkStart = pos = end;
        }
    }
}
