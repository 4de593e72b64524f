package dev.kcompact.tools;

import java.io.File;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import kafka.tools.DumpLogSegments;
import org.apache.kafka.server.common.CheckpointFile;
import org.apache.kafka.storage.internals.checkpoint.LeaderEpochCheckpointFile;
import org.apache.kafka.storage.internals.log.EpochEntry;

/**
 * Runs Kafka's readers over Kafka-named files in one JVM, one pass per group of arguments:
 *
 * <pre>
 *   --verify  FILE...   DumpLogSegments --deep-iteration --verify-index-only --files FILE,...
 *   --sanity  FILE...   DumpLogSegments --index-sanity-check --files FILE,...   (offset and time indexes)
 *   --epochs  FILE...   Kafka's leader-epoch-checkpoint reader (version 0), epochs and start offsets ascending
 * </pre>
 *
 * Each pass starts with a line {@code ==== <group>} on stdout and on stderr, so the caller can tell whose output is
 * whose; producer snapshots are read one at a time, each after a line {@code ==== snapshot <file>} on stderr (what
 * DumpLogSegments prints of a corrupt one does not name it). A pass that throws prints {@code DUMPCHECK ERROR <group>: <exception>} on stderr and the next pass runs; the
 * exit code is 1 if any pass threw. DumpLogSegments' own findings (index mismatches, non-consecutive offsets, invalid
 * batches) are left in its output for the caller to judge: the tool exits 0 with them.
 */
public final class DumpCheck {

    private DumpCheck() {
    }

    public static void main(String[] args) {
        Map<String, List<String>> groups = parse(args);
        boolean failed = false;
        for (Map.Entry<String, List<String>> group : groups.entrySet()) {
            if (group.getValue().isEmpty()) {
                continue;
            }
            System.out.println("==== " + group.getKey());
            System.err.println("==== " + group.getKey());
            System.out.flush();
            try {
                run(group.getKey(), group.getValue());
            } catch (Throwable e) {  // any failure of Kafka's reader is the finding, not a crash of this harness
                failed = true;
                System.err.println("DUMPCHECK ERROR " + group.getKey() + ": " + e);
                e.printStackTrace(System.err);
            }
            System.out.flush();
            System.err.flush();
        }
        System.exit(failed ? 1 : 0);
    }

    private static Map<String, List<String>> parse(String[] args) {
        Map<String, List<String>> groups = new LinkedHashMap<>();
        List<String> current = null;
        for (String arg : args) {
            if (arg.startsWith("--")) {
                current = groups.computeIfAbsent(arg.substring(2), k -> new ArrayList<>());
                if (!List.of("verify", "sanity", "epochs").contains(arg.substring(2))) {
                    throw new IllegalArgumentException("unknown group " + arg + ": expected --verify, --sanity or --epochs");
                }
            } else if (current == null) {
                throw new IllegalArgumentException("a file before any group: " + arg);
            } else {
                current.add(arg);
            }
        }
        return groups;
    }

    private static void run(String group, List<String> files) throws Exception {
        switch (group) {
            case "verify" -> {
                List<String> snapshots = files.stream().filter(f -> f.endsWith(".snapshot")).toList();
                List<String> others = files.stream().filter(f -> !f.endsWith(".snapshot")).toList();
                if (!others.isEmpty()) {
                    DumpLogSegments.main(new String[] {
                        "--deep-iteration", "--verify-index-only", "--files", String.join(",", others)});
                }
                // DumpLogSegments prints a corrupt snapshot's message without its file: one call per snapshot,
                // each after a marker naming it.
                for (String snapshot : snapshots) {
                    System.out.flush();
                    System.err.println("==== snapshot " + snapshot);
                    DumpLogSegments.main(new String[] {"--files", snapshot});
                    System.out.flush();
                    System.err.flush();
                }
            }
            case "sanity" -> DumpLogSegments.main(new String[] {
                "--index-sanity-check", "--files", String.join(",", files)});
            case "epochs" -> {
                for (String file : files) {
                    checkEpochs(new File(file), System.out, System.err);
                }
            }
            default -> throw new IllegalArgumentException(group);
        }
    }

    /** Reads {@code file} as Kafka's LeaderEpochCheckpointFile does and checks its entries ascend. */
    static void checkEpochs(File file, PrintStream out, PrintStream err) throws Exception {
        if (!file.isFile()) {
            throw new java.io.FileNotFoundException(file.toString());
        }
        List<EpochEntry> entries = new CheckpointFile<>(file, 0, LeaderEpochCheckpointFile.FORMATTER).read();
        out.println("Leader epochs of " + file + ": " + entries);
        for (int i = 1; i < entries.size(); i++) {
            EpochEntry prev = entries.get(i - 1);
            EpochEntry next = entries.get(i);
            if (next.epoch() <= prev.epoch() || next.startOffset() < prev.startOffset()) {
                err.println("DUMPCHECK ERROR epochs: " + file + ": " + next + " follows " + prev
                    + " (Kafka's LeaderEpochFileCache keeps epochs and start offsets ascending)");
            }
        }
    }
}
