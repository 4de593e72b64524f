package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The store the plugin reaches through kcompact's Python side, against the real {@code compaction.remote_storage} of
 * this checkout (the repository's {@code .venv}, which {@code make venv} creates) on a local {@code file://} store:
 * the protocol, the chunked reads, the errors, and a process killed in the middle of a call.
 */
class PythonStoreTest {

    private static final Path REPO = Path.of("../..").toAbsolutePath().normalize();
    private static final String KEY = "orders-MWJ6FHTfRYy67jzwZdeqSQ/3/00000000000000000100-tqimKeZwStOEOwRzT3L5oQ.log";

    @TempDir
    Path tmp;
    private PythonStore store;

    @AfterEach
    void close() {
        if (store != null) {
            store.close();
        }
    }

    /** The store, with a "python" that runs this checkout's kcompact, reading 4 bytes at a time. */
    private PythonStore open() throws IOException {
        Path python = REPO.resolve(".venv/bin/python");
        assertTrue(Files.isExecutable(python), python + " is missing: run `make venv` first");
        Path script = tmp.resolve("python");
        Files.writeString(script, "#!/bin/sh\nPYTHONPATH=" + REPO + " exec " + python + " \"$@\"\n");
        Files.setPosixFilePermissions(script, PosixFilePermissions.fromString("rwx------"));
        store = new PythonStore("file://" + tmp.resolve("store"), new PythonStore.Settings(script.toString(), null, 4, 2));
        return store;
    }

    private Path file(String name, String content) throws IOException {
        return Files.writeString(tmp.resolve(name), content);
    }

    private static String read(InputStream in) throws IOException {
        try (in) {
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
    }

    @Test
    void writesReadsByRangeInChunksAndDeletes() throws Exception {
        open().putFile(KEY, file("s.log", "0123456789"));
        store.putBytes(KEY + "-epochs", ByteBuffer.wrap("0\n1\n0 100\n".getBytes(StandardCharsets.UTF_8)));

        assertEquals("0123456789", Files.readString(tmp.resolve("store").resolve(KEY)));
        assertEquals("23456789", read(store.open(KEY, 2, Long.MAX_VALUE)));
        assertEquals("2345", read(store.open(KEY, 2, 6)));
        assertEquals("", read(store.open(KEY, 10, Long.MAX_VALUE)));
        assertEquals("0\n1\n0 100\n", read(store.open(KEY + "-epochs", 0, Long.MAX_VALUE)));
        store.delete(KEY);
        store.delete(KEY);
        NoSuchFileException missing = assertThrows(NoSuchFileException.class, () -> store.open(KEY, 0, 4));
        assertTrue(missing.getMessage().contains("file://" + tmp.resolve("store") + "/" + KEY), missing.getMessage());
    }

    @Test
    void writesAreCreateOnly() throws Exception {
        open().putFile(KEY, file("s.log", "first"));
        FileAlreadyExistsException again = assertThrows(FileAlreadyExistsException.class,
                () -> store.putFile(KEY, file("t.log", "second")));
        assertTrue(again.getMessage().contains(KEY), again.getMessage());
        assertEquals("first", read(store.open(KEY, 0, Long.MAX_VALUE)));
    }

    /** The copy reads a FIFO: once the test has opened its writing end, the process is inside the call. */
    @Test
    void aProcessKilledMidCallFailsThatCallAndTheNextStartsANewOne() throws Exception {
        open().putBytes(KEY + "-first", ByteBuffer.wrap(new byte[] {1}));
        Path fifo = tmp.resolve("segment.fifo");
        assertEquals(0, new ProcessBuilder("mkfifo", fifo.toString()).start().waitFor());
        CompletableFuture<Void> copy = CompletableFuture.runAsync(() -> {
            try {
                store.putFile(KEY, fifo);
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        });
        try (OutputStream writer = Files.newOutputStream(fifo)) {  // returns once the process opened it
            ProcessHandle process = ProcessHandle.current().children()
                    .filter(p -> p.info().commandLine().orElse("").contains("compaction.remote_storage"))
                    .findFirst().orElseThrow();
            process.destroyForcibly();
            ExecutionException failed = assertThrows(ExecutionException.class, () -> copy.get(30, TimeUnit.SECONDS));
            assertTrue(failed.getCause().getMessage().contains("the process exited with 137"),
                    failed.getCause().getMessage());
        }
        store.putBytes(KEY, ByteBuffer.wrap("after".getBytes(StandardCharsets.UTF_8)));
        assertEquals("after", read(store.open(KEY, 0, Long.MAX_VALUE)));
    }
}
