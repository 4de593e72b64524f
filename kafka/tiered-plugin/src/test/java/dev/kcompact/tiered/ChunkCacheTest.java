package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The chunk cache against an in-memory store that records every request: a broker-like sequential reader fetches
 * each chunk once, the next chunks are requested before the reader gets to them, the memory bound holds under
 * readers that want more than it, a failed fetch is asked again, and answers held back show what is in flight.
 */
class ChunkCacheTest {

    private static final int CHUNK = 1000;

    /** Objects by key; every request recorded; answers given at once unless held back. */
    private static final class Store implements ChunkCache.Source {
        final Map<String, byte[]> objects = new HashMap<>();
        final List<long[]> requests = new ArrayList<>();
        final List<Runnable> held = new ArrayList<>();
        boolean holding;
        int failures;

        byte[] put(String key, int size, long seed) {
            byte[] bytes = new byte[size];
            new Random(seed).nextBytes(bytes);
            objects.put(key, bytes);
            return bytes;
        }

        @Override
        public synchronized CompletableFuture<byte[]> fetch(String key, long start, long end) {
            requests.add(new long[] {start, end});
            CompletableFuture<byte[]> answer = new CompletableFuture<>();
            Runnable reply = () -> {
                byte[] object = objects.get(key);
                if (object == null) {
                    answer.completeExceptionally(new NoSuchFileException(key));
                } else if (failures > 0) {
                    failures--;
                    answer.completeExceptionally(new IOException("the store failed"));
                } else {
                    int from = (int) Math.min(start, object.length);
                    answer.complete(Arrays.copyOfRange(object, from, (int) Math.min(end, object.length)));
                }
            };
            if (holding) {
                held.add(reply);
            } else {
                reply.run();
            }
            return answer;
        }

        synchronized void release() {
            holding = false;
            held.forEach(Runnable::run);
            held.clear();
        }
    }

    private final Store store = new Store();
    private int hits;
    private int misses;

    private ChunkCache cache(long maxBytes, int prefetch) {
        return new ChunkCache(store, new ChunkCache.Settings(CHUNK, maxBytes, prefetch), hit -> {
            if (hit) {
                hits++;
            } else {
                misses++;
            }
        });
    }

    private static byte[] read(InputStream in, int max) throws IOException {
        try (in) {
            return in.readNBytes(max);
        }
    }

    /** As RemoteLogManager.read does: a stream per fetch, at the index position below the fetch offset (here 100
     * bytes before where the last fetch stopped reading whole batches), read for {@code fetchBytes}. */
    private static void readLikeTheBroker(ChunkCache cache, String key, byte[] object, int fetchBytes)
            throws IOException {
        readLikeTheBroker(cache, key, object, fetchBytes, 100);
    }

    /** The same, each fetch starting {@code overlap} bytes before where the last one stopped: a batch as large as
     * a fetch is sent whole or not at all, so the next fetch starts at the one left out. */
    private static void readLikeTheBroker(ChunkCache cache, String key, byte[] object, int fetchBytes, int overlap)
            throws IOException {
        int position = 0;
        while (position < object.length) {
            byte[] got = read(cache.open(key, position, Long.MAX_VALUE, object.length), fetchBytes);
            assertArrayEquals(Arrays.copyOfRange(object, position, Math.min(object.length, position + fetchBytes)),
                    got);
            int next = position + got.length;
            position = next >= object.length ? next : Math.max(position + 1, next - overlap);
        }
    }

    @Test
    void aSequentialReaderFetchesEachChunkOnceThoughEveryFetchOpensANewStream() throws IOException {
        byte[] object = store.put("s.log", 10 * CHUNK + 321, 1);
        ChunkCache cache = cache(4L * CHUNK, 2);

        readLikeTheBroker(cache, "s.log", object, 300);

        ChunkCache.Stats stats = cache.stats();
        assertEquals(11, stats.gets(), "one request per chunk");
        assertEquals(object.length, stats.bytesFetched(), "each byte fetched once");
        assertEquals(11, store.requests.size());
        for (int i = 0; i < store.requests.size(); i++) {
            assertArrayEquals(new long[] {(long) i * CHUNK, (long) (i + 1) * CHUNK}, store.requests.get(i));
        }
        assertEquals(1, misses, "only the first chunk was waited for: the others were fetched ahead");
        assertTrue(hits > 40, "the other fetches found their chunks: " + hits);
        assertTrue(stats.peakBytes() <= 4L * CHUNK, "peak " + stats.peakBytes());
    }

    @Test
    void aConsumerGoingThroughSegmentsFetchesEachChunkOnceWhenTheCacheFillsWithTheSegmentsBehindIt()
            throws IOException {
        ChunkCache cache = cache(4L * CHUNK, 2);
        long size = 0;
        for (int i = 0; i < 8; i++) {
            byte[] object = store.put("s" + i + ".log", 2 * CHUNK + 10 + 50 * i, 20 + i);
            readLikeTheBroker(cache, "s" + i + ".log", object, 300, 250);
            size += object.length;
        }

        assertEquals(24, cache.stats().gets(), "one request per chunk, though fetches start back in a chunk read "
                + "to its end, with older segments' chunks filling the cache");
        assertEquals(size, cache.stats().bytesFetched());
    }

    @Test
    void theNextChunksAreRequestedBeforeTheReaderGetsToThemAndNoneBeyondTheSegmentsSize() throws IOException {
        byte[] object = store.put("s.log", 3 * CHUNK + 10, 2);
        ChunkCache cache = cache(8L * CHUNK, 5);

        read(cache.open("s.log", 0, Long.MAX_VALUE, object.length), 10);

        assertEquals(4, store.requests.size(), "chunk 0, then 1, 2 and 3 ahead, nothing past the size");
        assertEquals(4, cache.stats().prefetches() + 1);
        assertEquals(object.length, cache.stats().heldBytes());
    }

    @Test
    void withoutASizeHintTheChunksAheadAreFetchedOnceTheChunkReadIsKnownNotToBeTheLast() throws IOException {
        byte[] index = store.put("s.index", CHUNK / 2, 7);
        byte[] log = store.put("s.log", 3 * CHUNK + 10, 8);
        ChunkCache cache = cache(8L * CHUNK, 2);

        assertArrayEquals(index, read(cache.open("s.index", 0, Long.MAX_VALUE, -1), Integer.MAX_VALUE));
        assertEquals(1, store.requests.size(), "an index that ends in its first chunk: nothing more asked");
        assertArrayEquals(log, read(cache.open("s.log", 0, Long.MAX_VALUE, -1), Integer.MAX_VALUE));
        assertEquals(1 + 4 + 1, store.requests.size(), "its 4 chunks, and one past its end: fetched 2 ahead of "
                + "chunk 2, before chunk 3 came back short");
        assertEquals(index.length + log.length, cache.stats().bytesFetched());
    }

    @Test
    void aSizeHintShortOfTheObjectStopsThePrefetchButNotTheRead() throws IOException {
        byte[] object = store.put("s.log", 3 * CHUNK + 10, 3);
        ChunkCache cache = cache(8L * CHUNK, 5);

        assertArrayEquals(object, read(cache.open("s.log", 0, Long.MAX_VALUE, CHUNK), Integer.MAX_VALUE));
        assertArrayEquals(Arrays.copyOfRange(object, 2500, 2600), read(cache.open("s.log", 2500, 2600, -1), 1000));
        assertArrayEquals(new byte[0], read(cache.open("s.log", object.length + 5, Long.MAX_VALUE, -1), 10));
    }

    @Test
    void chunksInFlightAreSharedAndCountAgainstTheBoundAtTheirFullSize() throws Exception {
        byte[] object = store.put("s.log", 10 * CHUNK, 4);
        ChunkCache cache = cache(3L * CHUNK, 2);
        store.holding = true;
        ExecutorService readers = Executors.newFixedThreadPool(2);
        try {
            Future<byte[]> first = readers.submit(() -> read(cache.open("s.log", 10, Long.MAX_VALUE, object.length),
                    50));
            Future<byte[]> second = readers.submit(() -> read(cache.open("s.log", 20, Long.MAX_VALUE, object.length),
                    50));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (store.held.size() < 3 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(3, store.requests.size(), "chunk 0 once for both readers, and 1 and 2 ahead");
            assertEquals(3L * CHUNK, cache.stats().heldBytes(), "three chunks in flight fill the bound");
            store.release();
            assertArrayEquals(Arrays.copyOfRange(object, 10, 60), first.get(10, TimeUnit.SECONDS));
            assertArrayEquals(Arrays.copyOfRange(object, 20, 70), second.get(10, TimeUnit.SECONDS));
        } finally {
            readers.shutdownNow();
        }
        assertEquals(3, store.requests.size());
    }

    @Test
    void theBoundHoldsWhenReadersWantMoreThanItAndNothingInFlightIsDropped() throws Exception {
        int keys = 6;
        Map<String, byte[]> objects = new HashMap<>();
        for (int k = 0; k < keys; k++) {
            objects.put("s" + k + ".log", store.put("s" + k + ".log", 7 * CHUNK + 77 * k, 10 + k));
        }
        ChunkCache cache = cache(5L * CHUNK, 2);
        ExecutorService readers = Executors.newFixedThreadPool(keys);
        try {
            List<Future<?>> done = new ArrayList<>();
            for (Map.Entry<String, byte[]> e : objects.entrySet()) {
                done.add(readers.submit(() -> {
                    readLikeTheBroker(cache, e.getKey(), e.getValue(), 250);
                    return null;
                }));
            }
            for (Future<?> f : done) {
                f.get(60, TimeUnit.SECONDS);
            }
        } finally {
            readers.shutdownNow();
        }
        ChunkCache.Stats stats = cache.stats();
        assertTrue(stats.peakBytes() <= 5L * CHUNK, "peak " + stats.peakBytes() + " above the bound");
        assertTrue(stats.heldBytes() <= 5L * CHUNK);
        assertEquals(store.requests.size(), stats.gets());
    }

    @Test
    void aFailedFetchIsNotCachedAndTheNextReaderAsksAgain() throws IOException {
        byte[] object = store.put("s.log", 2 * CHUNK, 5);
        ChunkCache cache = cache(4L * CHUNK, 0);
        store.failures = 1;

        IOException failed = assertThrows(IOException.class, () -> cache.open("s.log", 0, Long.MAX_VALUE, -1));
        assertEquals("the store failed", failed.getMessage());
        assertEquals(0, cache.stats().heldBytes());
        assertArrayEquals(Arrays.copyOf(object, 10), read(cache.open("s.log", 0, Long.MAX_VALUE, -1), 10));
        assertEquals(2, store.requests.size());
    }

    @Test
    void aMissingObjectIsAskedForOnceAndAChunkFetchedAheadIsFoundByItsReader() throws IOException {
        byte[] object = store.put("s.log", 2 * CHUNK + 10, 6);
        ChunkCache cache = cache(4L * CHUNK, 0);

        assertTrue(cache.fetchAhead("gone.txnindex", -1));
        assertThrows(NoSuchFileException.class, () -> cache.open("gone.txnindex", 0, Long.MAX_VALUE, -1));
        assertThrows(NoSuchFileException.class, () -> cache.open("gone.txnindex", 0, Long.MAX_VALUE, -1));
        assertEquals(1, store.requests.size(), "a missing object stays missing");

        assertTrue(cache.fetchAhead("s.log", object.length));
        assertEquals(2, store.requests.size());
        assertArrayEquals(Arrays.copyOf(object, 10), read(cache.open("s.log", 0, Long.MAX_VALUE, -1), 10));
        assertEquals(2, store.requests.size(), "the reader found the chunk fetched ahead");
        assertEquals(2, cache.stats().prefetches());
        assertTrue(cache.fetchAhead("empty.log", 0), "nothing to fetch of an empty object");
        assertEquals(2, store.requests.size());
    }

    @Test
    void chunksDroppedFromMemoryAreReadBackFromDiskWithinItsBound(@TempDir Path dir) throws Exception {
        Files.writeString(dir.resolve("kcompact-chunk-7.bin"), "left by an earlier broker");
        Files.writeString(dir.resolve("other.txt"), "not the cache's");
        byte[] first = store.put("a.log", 5 * CHUNK + 10, 30);
        byte[] second = store.put("b.log", 5 * CHUNK + 10, 31);
        ChunkFiles disk = new ChunkFiles(dir, 8L * CHUNK, 100);  // this store answers faster than a disk writes
        assertFalse(Files.exists(dir.resolve("kcompact-chunk-7.bin")), "files an earlier cache left are deleted");
        assertTrue(Files.exists(dir.resolve("other.txt")));
        ChunkCache cache = new ChunkCache(store, new ChunkCache.Settings(CHUNK, 2L * CHUNK, 1), hit -> { }, disk);
        try {
            readLikeTheBroker(cache, "a.log", first, 300);
            awaitWrites(disk, 4);
            int requests = store.requests.size();
            assertEquals(6, requests);

            // a.log's last 2 chunks are in memory, the 4 before them on disk: read again, none is fetched
            readLikeTheBroker(cache, "a.log", first, 300);
            assertEquals(requests, store.requests.size(), "a.log read again from memory and disk");
            assertTrue(disk.stats().hits() >= 4, "hits " + disk.stats().hits());

            readLikeTheBroker(cache, "b.log", second, 300);
            awaitWrites(disk, 10);
            ChunkFiles.Stats files = disk.stats();
            assertTrue(files.peakBytes() <= 8L * CHUNK, "disk peak " + files.peakBytes());
            assertTrue(files.heldBytes() > 7L * CHUNK, "the disk filled: " + files.heldBytes());
            try (Stream<Path> listed = Files.list(dir)) {
                assertTrue(listed.filter(p -> p.getFileName().toString().startsWith("kcompact-chunk-")).count() <= 8);
            }
        } finally {
            cache.close();
        }
        try (Stream<Path> listed = Files.list(dir)) {
            assertEquals(List.of(dir.resolve("other.txt")), listed.toList(), "closed: its files are gone");
        }
    }

    @Test
    void aChunkWaitingForItsWriteIsReadFromTheHeapItWaitsIn(@TempDir Path dir) throws Exception {
        try (ChunkFiles disk = new ChunkFiles(dir, 8L * CHUNK, 4)) {
            byte[] chunk = new byte[CHUNK];
            Arrays.fill(chunk, (byte) 7);
            for (int i = 0; i < 4; i++) {
                disk.write("c" + i, chunk);
                // asked for at once, before its write ran: found, not sent to the store
                assertArrayEquals(chunk, disk.read("c" + i).get(10, TimeUnit.SECONDS), "c" + i);
            }
            awaitWrites(disk, 4);
            assertArrayEquals(chunk, disk.read("c3").get(10, TimeUnit.SECONDS), "read back from its file");
            assertEquals(5, disk.stats().hits());
        }
    }

    /** Waits until {@code disk} wrote {@code written} chunks (its writes are asynchronous). */
    private static void awaitWrites(ChunkFiles disk, long written) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (disk.stats().written() < written && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        assertTrue(disk.stats().written() >= written, "written " + disk.stats().written());
    }

    @Test
    void aCacheThatCannotHoldOneReadersChunksIsRefused() {
        IllegalArgumentException small = assertThrows(IllegalArgumentException.class,
                () -> new ChunkCache.Settings(CHUNK, 2L * CHUNK, 2));
        assertTrue(small.getMessage().contains("holds less than one reader's 3 chunks"), small.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new ChunkCache.Settings(0, CHUNK, 0));
    }
}
