import dev.kcompact.tiered.KcompactRemoteStorageManager;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.internals.PluginMetricsImpl;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;

/**
 * tests/kafka/test_remote_read_cache.py's driver (run as a single source file against the built plugin jar, so it
 * sees only the plugin's public surface: the storage manager and its KIP-877 metrics): copies {@code segments}
 * random segments of about {@code segment} bytes into the store, then reads them through {@code fetchLogSegment} as
 * {@code RemoteLogManager.read} does, one stream per fetch of {@code fetch} bytes, each at a position {@code overlap}
 * bytes before where the last one stopped (the offset index entry below the next fetch offset; with batches as
 * large as a fetch, most of a fetch). First the first {@code sequential} segments one after another, as a consumer
 * goes through a partition (each segment's offset, time and transaction indexes fetched first, as the broker's
 * {@code RemoteIndexCache} does), then the others at once, one reader each, while a thread samples the cache's bytes.
 * Every byte read is checked against the file; the counters before and after each phase are printed as one JSON
 * line.
 *
 * <p>Arguments: {@code key=value} pairs, every {@code rsm.*} one passed to the storage manager without its prefix
 * ({@code rsm.kcompact.store=s3://...}); {@code segments}, {@code sequential}, {@code segment}, {@code fetch},
 * {@code overlap}, {@code dir}.
 */
public class RemoteReadCheck {

    private static final String[] GAUGES = {"store-gets-total", "store-get-bytes-total", "chunk-cache-bytes",
        "chunk-cache-peak-bytes", "chunk-cache-prefetches-total", "store-lists-total",
        "chunk-cache-unused-prefetches-total", "python-restarts-total"};

    public static void main(String[] args) throws Exception {
        Map<String, String> a = new HashMap<>();
        Map<String, Object> configs = new HashMap<>();
        for (String arg : args) {
            String[] kv = arg.split("=", 2);
            if (kv[0].startsWith("rsm.")) {
                configs.put(kv[0].substring(4), kv[1]);
            } else {
                a.put(kv[0], kv[1]);
            }
        }
        int segments = Integer.parseInt(a.get("segments"));
        int sequential = Integer.parseInt(a.get("sequential"));
        int segmentBytes = Integer.parseInt(a.get("segment"));
        int fetch = Integer.parseInt(a.get("fetch"));
        int overlap = Integer.parseInt(a.get("overlap"));
        Path dir = Path.of(a.get("dir"));

        Metrics registry = new Metrics();
        KcompactRemoteStorageManager rsm = new KcompactRemoteStorageManager();
        rsm.configure(configs);
        rsm.withPluginMetrics(new PluginMetricsImpl(registry, Map.of()));
        try {
            TopicIdPartition tp = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition("check", 0));
            List<RemoteLogSegmentMetadata> metas = new ArrayList<>();
            List<byte[]> contents = new ArrayList<>();
            for (int i = 0; i < segments; i++) {
                byte[] bytes = new byte[segmentBytes + 4099 * i];
                new Random(i).nextBytes(bytes);
                Path log = Files.write(dir.resolve(i + ".log"), bytes);
                long start = 1000L * i + (i < sequential ? 0 : 1_000_000);  // the phases' segments do not follow
                RemoteLogSegmentMetadata meta = new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tp,
                        Uuid.randomUuid()), start, start + 999, 0, 1, 0, bytes.length, Map.of(0, 0L), true);
                rsm.copyLogSegmentData(meta, new LogSegmentData(log, Files.write(dir.resolve(i + ".index"),
                        new byte[8]), Files.write(dir.resolve(i + ".timeindex"), new byte[12]), Optional.empty(),
                        Files.write(dir.resolve(i + ".snapshot"), new byte[4]), ByteBuffer.wrap(new byte[8])));
                metas.add(meta);
                contents.add(bytes);
            }
            StringBuilder out = new StringBuilder("{\"sizes\": " + Arrays.toString(contents.stream()
                    .mapToInt(c -> c.length).toArray()));
            Map<String, Double> start = gauges(registry);
            long served = 0;
            for (int i = 0; i < sequential; i++) {
                fetchIndexes(rsm, metas.get(i));
                served += read(rsm, metas.get(i), contents.get(i), fetch, overlap);
            }
            out.append(", \"sequential\": ").append(phase(start, gauges(registry), served, 0));

            AtomicLong sampledMax = new AtomicLong();
            AtomicBoolean reading = new AtomicBoolean(true);
            Thread sampler = new Thread(() -> {
                while (reading.get()) {
                    sampledMax.accumulateAndGet(gauges(registry).get("chunk-cache-bytes").longValue(), Math::max);
                    Thread.onSpinWait();
                }
            });
            sampler.start();
            Map<String, Double> before = gauges(registry);
            ExecutorService readers = Executors.newFixedThreadPool(segments - sequential);
            List<Future<Long>> done = new ArrayList<>();
            for (int i = sequential; i < segments; i++) {
                int s = i;
                done.add(readers.submit(() -> read(rsm, metas.get(s), contents.get(s), fetch, overlap)));
            }
            long concurrent = 0;
            for (Future<Long> f : done) {
                concurrent += f.get(600, TimeUnit.SECONDS);
            }
            readers.shutdown();
            reading.set(false);
            sampler.join();
            out.append(", \"concurrent\": ").append(phase(before, gauges(registry), concurrent, sampledMax.get()));
            System.out.println(out.append("}"));
        } finally {
            rsm.close();
            registry.close();
        }
    }

    /** As {@code RemoteIndexCache} does before the broker reads a segment: each index in turn (no transaction index
     * here: the copy had none, and the metadata says so). */
    private static void fetchIndexes(KcompactRemoteStorageManager rsm, RemoteLogSegmentMetadata meta)
            throws Exception {
        for (IndexType type : new IndexType[] {IndexType.OFFSET, IndexType.TIMESTAMP}) {
            try (InputStream in = rsm.fetchIndex(meta, type)) {
                in.readAllBytes();
            }
        }
        try {
            rsm.fetchIndex(meta, IndexType.TRANSACTION).close();
            throw new AssertionError("a transaction index of " + meta.remoteLogSegmentId());
        } catch (RemoteResourceNotFoundException expected) {
            // what the broker expects of a missing optional index
        }
    }

    /** Reads {@code expected} through successive fetchLogSegment streams; the bytes the broker would have read. */
    private static long read(KcompactRemoteStorageManager rsm, RemoteLogSegmentMetadata meta, byte[] expected,
                             int fetch, int overlap) throws Exception {
        long served = 0;
        int position = 0;
        while (position < expected.length) {
            byte[] got;
            try (InputStream in = rsm.fetchLogSegment(meta, position)) {
                got = in.readNBytes(fetch);
            }
            int end = Math.min(expected.length, position + fetch);
            if (!Arrays.equals(got, Arrays.copyOfRange(expected, position, end))) {
                throw new AssertionError("bytes at " + position + " of " + meta.remoteLogSegmentId() + " differ");
            }
            served += got.length;
            position = end >= expected.length ? end : Math.max(position + 1, end - overlap);
        }
        return served;
    }

    private static Map<String, Double> gauges(Metrics registry) {
        Map<String, Double> out = new HashMap<>();
        registry.metrics().forEach((name, metric) -> {
            if (Arrays.asList(GAUGES).contains(name.name()) && metric.metricValue() instanceof Number n) {
                out.put(name.name(), n.doubleValue());
            }
        });
        return out;
    }

    private static String phase(Map<String, Double> before, Map<String, Double> after, long served, long sampled) {
        return String.format("{\"gets\": %d, \"fetched\": %d, \"served\": %d, \"peak\": %d, \"sampled_max\": %d, "
                + "\"prefetches\": %d, \"lists\": %d, \"unused_prefetches\": %d, \"restarts\": %d}",
                delta(before, after, "store-gets-total"), delta(before, after, "store-get-bytes-total"), served,
                after.get("chunk-cache-peak-bytes").longValue(), sampled,
                delta(before, after, "chunk-cache-prefetches-total"), delta(before, after, "store-lists-total"),
                delta(before, after, "chunk-cache-unused-prefetches-total"),
                delta(before, after, "python-restarts-total"));
    }

    private static long delta(Map<String, Double> before, Map<String, Double> after, String name) {
        return after.get(name).longValue() - before.get(name).longValue();
    }
}
