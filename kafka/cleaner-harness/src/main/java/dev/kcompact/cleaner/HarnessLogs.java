package dev.kcompact.cleaner;

import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogDirFailureChannel;
import org.apache.kafka.storage.internals.log.ProducerStateManagerConfig;
import org.apache.kafka.storage.internals.log.UnifiedLog;
import org.apache.kafka.storage.log.metrics.BrokerTopicStats;

import java.io.File;
import java.util.Optional;
import java.util.Properties;

/**
 * What every harness of this module does the same way: take a {@code --config name=value} topic config, and open a
 * partition directory as a broker's {@link UnifiedLog} with its high watermark at the log end (every record
 * replicated).
 */
final class HarnessLogs {
    /** A broker's {@code transaction.max.timeout.ms} default. */
    private static final int MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000;
    /** A broker's {@code producer.id.expiration.check.interval.ms} default. */
    private static final int PRODUCER_ID_EXPIRATION_CHECK_MS = 10 * 60 * 1000;

    private HarnessLogs() {
    }

    /**
     * Puts one {@code name=value} topic config into {@code props}. {@code segment.bytes} is passed to Kafka as
     * {@code internal.segment.bytes}, which lifts the broker's 1 MiB floor, as Kafka's tests do.
     */
    static void putConfig(Properties props, String nameValue) {
        String[] kv = nameValue.split("=", 2);
        if (kv.length != 2) {
            throw new IllegalArgumentException("expected --config name=value, found " + nameValue);
        }
        props.put(kv[0].equals("segment.bytes") ? LogConfig.INTERNAL_SEGMENT_BYTES_CONFIG : kv[0], kv[1]);
    }

    /**
     * Opens {@code dir} as {@code LogManager} would a log without checkpoints (log start and recovery point 0), on
     * {@code time}'s clock, and moves its high watermark to the log end. The caller closes it.
     */
    static UnifiedLog open(File dir, LogConfig config, KafkaScheduler scheduler, Time time) throws Exception {
        UnifiedLog log = UnifiedLog.create(dir, config, 0L, 0L, scheduler, new BrokerTopicStats(), time,
                MAX_TRANSACTION_TIMEOUT_MS, new ProducerStateManagerConfig(Integer.MAX_VALUE, false),
                PRODUCER_ID_EXPIRATION_CHECK_MS, new LogDirFailureChannel(1), true, Optional.empty());
        log.updateHighWatermark(log.logEndOffset());
        return log;
    }
}
