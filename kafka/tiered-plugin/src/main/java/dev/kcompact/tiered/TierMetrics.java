package dev.kcompact.tiered;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Consumer;
import java.util.function.Supplier;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.metrics.Gauge;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.common.metrics.Sensor;
import org.apache.kafka.common.metrics.stats.Avg;
import org.apache.kafka.common.metrics.stats.CumulativeCount;
import org.apache.kafka.common.metrics.stats.CumulativeSum;
import org.apache.kafka.common.metrics.stats.Max;
import org.apache.kafka.common.metrics.stats.Percentile;
import org.apache.kafka.common.metrics.stats.Percentiles;
import org.apache.kafka.common.metrics.stats.Percentiles.BucketSizing;

/**
 * What an operator watches of one of the plugin's managers, published as KIP-877 plugin metrics: Kafka (4.1 and
 * later) wraps both managers with {@code Plugin.wrapInstance} and hands a {@code Monitorable} one a
 * {@link PluginMetrics}, whose metrics join the broker's registry and JMX as
 * {@code kafka.server:type=plugins,config=<remote.log.storage.manager.class.name or
 * remote.log.metadata.manager.class.name>,class=<the class>,<the tags below>}.
 *
 * <ul>
 *   <li>per call kind ({@code op}: copy, fetch, fetch-index, delete for the storage manager; for the metadata manager
 *       every call Kafka makes, remoteLogSegmentMetadata, listRemoteLogSegments, listRemoteLogSegments-epoch (the
 *       overload given a leader epoch), highestOffsetForEpoch, nextSegmentWithTxnIndex, remoteLogSize (answered from
 *       memory, or after a {@code segments} call on a partition's first read), addRemoteLogSegmentMetadata (a copy
 *       held in memory until it finishes) and updateRemoteLogSegmentMetadata (a write's whole time, its wait for a
 *       batch included), and its calls of the Python process: copy (a copy's one commit, at its finish) and update,
 *       each sent alone, batch (writes committed together), segments, follow):
 *       {@code calls-total}, {@code latency-avg-ms}, {@code latency-max-ms}, {@code latency-p50-ms} and
 *       {@code latency-p99-ms} (Kafka's default sample window, two of 30 s; percentiles from a histogram of
 *       {@value #PERCENTILE_BUCKETS} buckets up to {@value #PERCENTILE_MAX_MS} ms, each wider than the one before: a
 *       bucket is 5 µs wide at 0, 0.7 ms at 50 ms, 10 ms at 10 s; a call longer counts as 10 s), {@code bytes-total}
 *       where the call moves bytes;</li>
 *   <li>{@code errors-total} by {@code op} and {@code kind} (the kcompact error type the Python side answered, or
 *       the Java exception's class);</li>
 *   <li>{@code cache-hits-total} / {@code cache-misses-total} by {@code cache};</li>
 *   <li>gauges: the Python process's {@code python-queue-depth} (calls waiting or in flight) and
 *       {@code python-restarts-total} (processes started after the first).</li>
 * </ul>
 *
 * <p>Recording before Kafka binds the metrics (a manager used outside a broker, as the unit tests do) records
 * nothing. Sensors are named per instance, so two managers in one broker never share one.
 */
final class TierMetrics {

    static final int PERCENTILE_BUCKETS = 2000;
    static final int PERCENTILE_MAX_MS = 10_000;

    private final String instance = Integer.toHexString(System.identityHashCode(this));
    private final Map<String, Sensor> sensors = new ConcurrentHashMap<>();
    private final List<Consumer<PluginMetrics>> gauges = new CopyOnWriteArrayList<>();
    private volatile PluginMetrics metrics;

    /** Kafka's {@code Monitorable.withPluginMetrics}: from now on calls are recorded, gauges registered. */
    void bind(PluginMetrics pluginMetrics) {
        metrics = pluginMetrics;
        gauges.forEach(g -> g.accept(pluginMetrics));
    }

    /** A gauge reading {@code value} whenever the registry is read, registered now or when bound. */
    void gauge(String name, String description, Supplier<Number> value) {
        Consumer<PluginMetrics> add = m -> m.addMetric(m.metricName(name, description, new LinkedHashMap<>()),
                (Gauge<Number>) (config, now) -> value.get());
        gauges.add(add);
        PluginMetrics bound = metrics;
        if (bound != null) {
            add.accept(bound);
        }
    }

    /** One call of {@code op} that took {@code nanos} and moved {@code bytes} (0: none to count). */
    void call(String op, long nanos, long bytes) {
        PluginMetrics m = metrics;
        if (m == null) {
            return;
        }
        sensor(m, "call:" + op, s -> {
            LinkedHashMap<String, String> tags = tags("op", op);
            s.add(m.metricName("calls-total", "calls of " + op, tags), new CumulativeCount());
            s.add(m.metricName("latency-avg-ms", "average time of a call of " + op, tags), new Avg());
            s.add(m.metricName("latency-max-ms", "longest call of " + op, tags), new Max());
            s.add(new Percentiles(4 * PERCENTILE_BUCKETS, PERCENTILE_MAX_MS, BucketSizing.LINEAR,
                    new Percentile(m.metricName("latency-p50-ms", "median call of " + op, tags), 50),
                    new Percentile(m.metricName("latency-p99-ms", "99th percentile call of " + op, tags), 99)));
        }).record(nanos / 1e6);
        bytes(op, bytes);
    }

    /** {@code bytes} more moved by calls of {@code op} (a fetch's stream counts them as the broker reads). */
    void bytes(String op, long bytes) {
        PluginMetrics m = metrics;
        if (m != null && bytes > 0) {
            sensor(m, "bytes:" + op, s -> s.add(m.metricName("bytes-total", "bytes moved by " + op, tags("op", op)),
                    new CumulativeSum())).record(bytes);
        }
    }

    /** A call of {@code op} that failed with an error of {@code kind}. */
    void error(String op, String kind) {
        PluginMetrics m = metrics;
        if (m != null) {
            sensor(m, "error:" + op + ":" + kind, s -> s.add(m.metricName("errors-total", "failed calls of " + op,
                    tags("op", op, "kind", kind)), new CumulativeCount())).record();
        }
    }

    /**
     * A lookup in {@code cache} that found what it wanted ({@code hit}) or had to read it. The cache's first lookup
     * registers both counters, so a dashboard (or a ratio of the two) finds the misses at 0 rather than missing.
     */
    void cache(String cache, boolean hit) {
        PluginMetrics m = metrics;
        if (m != null) {
            Sensor hits = cacheSensor(m, "cache-hits-total", cache);
            Sensor misses = cacheSensor(m, "cache-misses-total", cache);
            (hit ? hits : misses).record();
        }
    }

    private Sensor cacheSensor(PluginMetrics m, String name, String cache) {
        return sensor(m, name + ":" + cache, s -> s.add(m.metricName(name, "lookups in the " + cache + " cache",
                tags("cache", cache)), new CumulativeCount()));
    }

    private Sensor sensor(PluginMetrics m, String key, Consumer<Sensor> stats) {
        return sensors.computeIfAbsent(key, k -> {
            Sensor s = m.addSensor("kcompact-" + instance + "-" + k);
            stats.accept(s);
            return s;
        });
    }

    private static LinkedHashMap<String, String> tags(String... pairs) {
        LinkedHashMap<String, String> tags = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) {
            tags.put(pairs[i], pairs[i + 1]);
        }
        return tags;
    }

    /** The kind of a failure, for {@code errors-total}: a kcompact error type the Python side named, else the
     * exception's class. */
    static String kindOf(Throwable e) {
        return e instanceof MetadataPipe.CallFailed failed ? failed.kind() : e.getClass().getSimpleName();
    }
}
