package dev.kcompact.cleaner;

import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.Cleaner;
import org.apache.kafka.storage.internals.log.CleanerStats;
import org.apache.kafka.storage.internals.log.LogCleanerManager;
import org.apache.kafka.storage.internals.log.LogConfig;
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

/**
 * Kafka's own {@link Cleaner}, timed: one cleaner thread with a broker's defaults cleaning whole partition directories
 * (in place) until nothing cleanable is left, as {@code LogCleaner}'s thread would in as many rounds as its offset map
 * needs. The benchmark P10 runs it beside kcompact on the same bytes ({@code scripts/bench_cleaner.py}).
 *
 * <pre>
 * CleanerBench --now MS [--dedupe-buffer-bytes N] [--io-buffer-bytes N] [--config name=value]...
 *              [--warmup DIR]... DIR...
 * </pre>
 *
 * The defaults are the broker's for one cleaner thread: {@code log.cleaner.dedupe.buffer.size} 128 MiB,
 * {@code log.cleaner.io.buffer.size} 512 KiB (half to read, half to write, as {@code LogCleaner} splits it),
 * {@code log.cleaner.io.buffer.load.factor} 0.9, reads growing up to {@code message.max.bytes}, no throttle. Every
 * {@code --warmup} directory is cleaned first and not timed (the JIT's warm-up, on other data). Then each DIR is cleaned
 * from its start (no cleaner checkpoint) to its first uncleanable offset (the active segment's base, every record
 * replicated and past {@code min.compaction.lag.ms} 0), round after round: a round cleans what the offset map holds
 * and the next starts where it stopped. Prints one line per DIR:
 * {@code DIR seconds rounds bytes_before bytes_after bytes_read messages_read messages_written}, the seconds those of
 * the rounds alone ({@code Cleaner.doClean}, the log's open and close left out), bytes_read, messages_read and
 * messages_written Kafka's own counts of the cleaning pass ({@code CleanerStats}: the offset map's reads are not in
 * them).
 */
public final class CleanerBench {
    private static final int MESSAGE_MAX_BYTES = 1024 * 1024 + 12;

    private CleanerBench() {
    }

    public static void main(String[] args) throws Exception {
        long now = Long.MIN_VALUE;
        long dedupeBytes = 128L * 1024 * 1024;
        int ioBytes = 512 * 1024;
        Properties props = new Properties();
        props.put("cleanup.policy", "compact");
        props.put("min.compaction.lag.ms", "0");
        List<File> warmups = new ArrayList<>();
        List<File> dirs = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--now" -> now = Long.parseLong(args[++i]);
                case "--dedupe-buffer-bytes" -> dedupeBytes = Long.parseLong(args[++i]);
                case "--io-buffer-bytes" -> ioBytes = Integer.parseInt(args[++i]);
                case "--warmup" -> warmups.add(new File(args[++i]));
                case "--config" -> {
                    HarnessLogs.putConfig(props, args[++i]);
                }
                default -> dirs.add(new File(args[i]));
            }
        }
        if (now == Long.MIN_VALUE || dirs.isEmpty()) {
            throw new IllegalArgumentException("usage: CleanerBench --now MS [options] [--warmup DIR]... DIR...");
        }
        Time time = new PinnedTime(now);
        LogConfig config = new LogConfig(props);
        // LogCleaner: one SkimpyOffsetMap of dedupe.buffer.size / threads, io.buffer.size / threads / 2 per buffer
        Cleaner cleaner = new Cleaner(0, new SkimpyOffsetMap((int) Math.min(dedupeBytes, Integer.MAX_VALUE)),
                ioBytes / 2, MESSAGE_MAX_BYTES, 0.9,
                new Throttler(Double.MAX_VALUE, Long.MAX_VALUE, "cleaner-io", "bytes", time), time, tp -> { });
        KafkaScheduler scheduler = new KafkaScheduler(1);
        scheduler.startup();
        try {
            for (File dir : warmups) {
                clean(dir, cleaner, config, time, scheduler);
            }
            for (File dir : dirs) {
                System.out.println(clean(dir, cleaner, config, time, scheduler));
            }
        } finally {
            scheduler.shutdown();
        }
    }

    private static String clean(File dir, Cleaner cleaner, LogConfig config, Time time, KafkaScheduler scheduler)
            throws Exception {
        UnifiedLog log = HarnessLogs.open(dir, config, scheduler, time);
        try {
            long before = log.size();
            long checkpoint = -1;
            long nanos = 0;
            int rounds = 0;
            long bytesRead = 0;
            long messagesRead = 0;
            long messagesWritten = 0;
            while (true) {
                long now = time.milliseconds();
                LogCleanerManager.OffsetsToClean range = LogCleanerManager.cleanableOffsets(
                        log, checkpoint < 0 ? Optional.empty() : Optional.of(checkpoint), now);
                if (range.firstDirtyOffset() >= range.firstUncleanableDirtyOffset()) {
                    break;
                }
                LogToClean cleanable = new LogToClean(log, range.firstDirtyOffset(),
                        range.firstUncleanableDirtyOffset(), false);
                long start = System.nanoTime();
                Map.Entry<Long, CleanerStats> done = cleaner.doClean(cleanable, now);
                nanos += System.nanoTime() - start;
                rounds++;
                CleanerStats stats = done.getValue();
                bytesRead += stats.bytesRead();
                messagesRead += stats.messagesRead();
                messagesWritten += stats.messagesWritten();
                checkpoint = done.getKey();
            }
            return String.join(" ", dir.getPath(), Double.toString(nanos / 1e9), Integer.toString(rounds),
                    Long.toString(before), Long.toString(log.size()), Long.toString(bytesRead),
                    Long.toString(messagesRead), Long.toString(messagesWritten));
        } finally {
            log.close();
        }
    }
}
