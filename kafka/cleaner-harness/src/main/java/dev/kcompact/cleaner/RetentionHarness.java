package dev.kcompact.cleaner;

import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogSegment;
import org.apache.kafka.storage.internals.log.UnifiedLog;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.StringJoiner;

/**
 * One retention check of Kafka's own {@link UnifiedLog#deleteOldSegments()} over broker log dirs (in place), each at
 * a pinned clock, for {@code cleanup.policy=compact,delete}: the referee of tests/kafka/test_retention_referee.py.
 *
 * <pre>
 * RetentionHarness [--config name=value]... DIR=NOW:RETENTION_MS:RETENTION_BYTES...
 * </pre>
 *
 * Each DIR is a {@code <topic>-<partition>} directory, opened as a {@link UnifiedLog} (log start offset 0, as a log
 * without a log-start-offset checkpoint) with {@code cleanup.policy=compact,delete}, the given {@code retention.ms}
 * and {@code retention.bytes} ({@code -1}: off) over the shared {@code --config}s, and a clock that reads NOW. The
 * high watermark is set to the log end offset (every record replicated), then {@code deleteOldSegments()} runs once:
 * the log-start-offset, retention.bytes and retention.ms passes, in that order. Prints one JSON object per DIR:
 * <pre>
 * {"dir": DIR, "before": [[base, size, largestTimestamp], ...], "deleted": N, "log_start_offset": L,
 *  "log_end_offset": E, "segments": [base, ...]}
 * </pre>
 * where {@code before} is every segment as the passes judged it (the active one included) and {@code segments}
 * the base offsets of those left.
 */
public final class RetentionHarness {

    private RetentionHarness() {
    }

    public static void main(String[] args) throws Exception {
        Properties shared = new Properties();
        List<String[]> partitions = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--config")) {
                HarnessLogs.putConfig(shared, args[++i]);
                continue;
            }
            int eq = args[i].lastIndexOf('=');
            String[] spec = eq < 0 ? new String[0] : args[i].substring(eq + 1).split(":");
            if (spec.length != 3) {
                throw new IllegalArgumentException("expected DIR=NOW:RETENTION_MS:RETENTION_BYTES, found " + args[i]);
            }
            partitions.add(new String[] {args[i].substring(0, eq), spec[0], spec[1], spec[2]});
        }
        KafkaScheduler scheduler = new KafkaScheduler(1);
        scheduler.startup();
        try {
            for (String[] p : partitions) {
                Properties props = new Properties();
                props.putAll(shared);
                props.put("cleanup.policy", "compact,delete");
                props.put("retention.ms", p[2]);
                props.put("retention.bytes", p[3]);
                System.out.println(expireOne(new File(p[0]), new LogConfig(props), new PinnedTime(Long.parseLong(p[1])),
                        scheduler));
            }
        } finally {
            scheduler.shutdown();
        }
    }

    private static String expireOne(File dir, LogConfig config, Time time, KafkaScheduler scheduler) throws Exception {
        UnifiedLog log = HarnessLogs.open(dir, config, scheduler, time);
        try {
            StringJoiner before = new StringJoiner(", ", "[", "]");
            for (LogSegment s : log.logSegments()) {
                before.add("[" + s.baseOffset() + ", " + s.size() + ", " + s.largestTimestamp() + "]");
            }
            int deleted = log.deleteOldSegments();
            StringJoiner after = new StringJoiner(", ", "[", "]");
            for (LogSegment s : log.logSegments()) {
                after.add(Long.toString(s.baseOffset()));
            }
            return "{\"dir\": " + quote(dir.getPath()) + ", \"before\": " + before + ", \"deleted\": " + deleted
                    + ", \"log_start_offset\": " + log.logStartOffset() + ", \"log_end_offset\": " + log.logEndOffset()
                    + ", \"segments\": " + after + "}";
        } finally {
            log.close();
        }
    }

    private static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
