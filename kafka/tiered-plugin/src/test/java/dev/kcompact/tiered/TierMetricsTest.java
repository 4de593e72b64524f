package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.internals.PluginMetricsImpl;
import org.junit.jupiter.api.Test;

class TierMetricsTest {

    private static Map<String, Double> counts(Metrics registry, String name) {
        Map<String, Double> found = new TreeMap<>();
        for (Map.Entry<MetricName, KafkaMetric> e : registry.metrics().entrySet()) {
            if (e.getKey().name().equals(name)) {
                found.put(e.getKey().tags().get("cache"), (Double) e.getValue().metricValue());
            }
        }
        return found;
    }

    @Test
    void aCachesFirstLookupRegistersBothItsHitsAndItsMisses() {
        TierMetrics metrics = new TierMetrics();
        try (Metrics registry = new Metrics()) {
            metrics.bind(new PluginMetricsImpl(registry, Map.of()));
            metrics.cache("listing", true);
            metrics.cache("listing", true);
            metrics.cache("chunk", false);
            assertEquals(Map.of("chunk", 0.0, "listing", 2.0), counts(registry, "cache-hits-total"));
            assertEquals(Map.of("chunk", 1.0, "listing", 0.0), counts(registry, "cache-misses-total"));
        }
    }
}
