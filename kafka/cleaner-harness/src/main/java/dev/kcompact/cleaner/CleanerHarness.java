package dev.kcompact.cleaner;

import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.Cleaner;
import org.apache.kafka.storage.internals.log.CleanerStats;
import org.apache.kafka.storage.internals.log.LogCleanerManager;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogSegment;
import org.apache.kafka.storage.internals.log.LogToClean;
import org.apache.kafka.storage.internals.log.SkimpyOffsetMap;
import org.apache.kafka.storage.internals.log.UnifiedLog;
import org.apache.kafka.storage.internals.utils.Throttler;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.StringJoiner;

/**
 * One cleaning round of Kafka's own {@link Cleaner} over broker log dirs (in place), at a pinned clock.
 *
 * <pre>
 * CleanerHarness --now MS [--config name=value]... DIR=CHECKPOINT:BOUND...
 * </pre>
 *
 * Each DIR is a {@code <topic>-<partition>} directory; CHECKPOINT is its cleaner checkpoint from the round before
 * ({@code -1}: none); BOUND ({@code -1}: none) caps the first uncleanable offset, for the part of the log a
 * remote tier cannot clean yet (a transaction whose marker is only in the active segment, docs/fidelity.md). Every partition gets the same topic configs ({@code segment.bytes} is passed to Kafka as
 * {@code internal.segment.bytes}, which lifts the broker's 1 MiB floor, as Kafka's tests do). The range is the one
 * {@code LogCleanerManager.cleanableOffsets} computes with the high watermark at the log end (every record
 * replicated); the round is {@code Cleaner.doClean(cleanable, now)}, as {@code LogCleanerTest} calls it. Prints a
 * line per partition: {@code DIR first_dirty first_uncleanable checkpoint group_bases...}, where checkpoint is the
 * next round's and the group bases are the base offsets of the segments the round wrote (in order).
 */
public final class CleanerHarness {
    private static final int OFFSET_MAP_BYTES = 8 * 1024 * 1024;
    private static final int IO_BUFFER_BYTES = 64 * 1024;
    private static final int MAX_IO_BUFFER_BYTES = 8 * 1024 * 1024;
    private static final double DUP_BUFFER_LOAD_FACTOR = 0.9;

    private CleanerHarness() {
    }

    public static void main(String[] args) throws Exception {
        long now = Long.MIN_VALUE;
        Properties props = new Properties();
        props.put("cleanup.policy", "compact");
        List<String[]> partitions = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--now" -> now = Long.parseLong(args[++i]);
                case "--config" -> {
                    HarnessLogs.putConfig(props, args[++i]);
                }
                default -> {
                    int eq = args[i].lastIndexOf('=');
                    int colon = args[i].lastIndexOf(':');
                    if (eq < 0 || colon < eq) {
                        throw new IllegalArgumentException("expected DIR=CHECKPOINT:BOUND, found " + args[i]);
                    }
                    partitions.add(new String[] {args[i].substring(0, eq), args[i].substring(eq + 1, colon),
                        args[i].substring(colon + 1)});
                }
            }
        }
        if (now == Long.MIN_VALUE) {
            throw new IllegalArgumentException("--now MS is required: the round's clock is pinned");
        }
        Time time = new PinnedTime(now);
        LogConfig config = new LogConfig(props);
        KafkaScheduler scheduler = new KafkaScheduler(1);
        scheduler.startup();
        try {
            for (String[] p : partitions) {
                System.out.println(cleanOne(new File(p[0]), Long.parseLong(p[1]), Long.parseLong(p[2]), config, time,
                        scheduler));
            }
        } finally {
            scheduler.shutdown();
        }
    }

    private static String cleanOne(File dir, long checkpoint, long bound, LogConfig config, Time time,
                                   KafkaScheduler scheduler) throws Exception {
        UnifiedLog log = HarnessLogs.open(dir, config, scheduler, time);
        try {
            long now = time.milliseconds();
            LogCleanerManager.OffsetsToClean range = LogCleanerManager.cleanableOffsets(
                    log, checkpoint < 0 ? Optional.empty() : Optional.of(checkpoint), now);
            long firstUncleanable = bound < 0 ? range.firstUncleanableDirtyOffset()
                    : Math.max(range.firstDirtyOffset(), Math.min(bound, range.firstUncleanableDirtyOffset()));
            StringJoiner line = new StringJoiner(" ");
            line.add(dir.getPath()).add(Long.toString(range.firstDirtyOffset())).add(Long.toString(firstUncleanable));
            if (range.firstDirtyOffset() >= firstUncleanable) {
                line.add(Long.toString(range.firstDirtyOffset()));
                return line.toString();
            }
            Cleaner cleaner = new Cleaner(0, new SkimpyOffsetMap(OFFSET_MAP_BYTES), IO_BUFFER_BYTES,
                    MAX_IO_BUFFER_BYTES, DUP_BUFFER_LOAD_FACTOR,
                    new Throttler(Double.MAX_VALUE, Long.MAX_VALUE, "cleaner-io", "bytes", time), time, tp -> { });
            LogToClean cleanable = new LogToClean(log, range.firstDirtyOffset(), firstUncleanable, false);
            Map.Entry<Long, CleanerStats> done = cleaner.doClean(cleanable, now);
            line.add(Long.toString(done.getKey()));
            for (LogSegment segment : log.logSegments(0, done.getKey())) {
                line.add(Long.toString(segment.baseOffset()));
            }
            return line.toString();
        } finally {
            log.close();
        }
    }
}
