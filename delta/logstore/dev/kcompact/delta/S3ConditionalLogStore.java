package dev.kcompact.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

/**
 * A Delta LogStore for {@code s3a://} whose commit is one conditional put: the commit file is written with S3's
 * {@code If-None-Match: *} (hadoop-aws 3.5's {@code createFile(path).overwrite(false)} with the
 * {@code fs.option.create.conditional.overwrite} option), so of two writers racing for one table version exactly one
 * lands, whichever driver each runs in, and the other gets {@link FileAlreadyExistsException}, which Delta turns into
 * a retry or a conflict. delta-storage's own {@code S3SingleDriverLogStore} checks for the file and then puts it, which
 * is atomic only among the writers of one JVM.
 *
 * <p>A put is atomic on S3 (an object is whole or absent), so a partial commit file is never visible. Reads and
 * listings are {@link HadoopFileSystemLogStore}'s: S3 has listed consistently since 2020. Set it with
 * {@code spark.delta.logStore.s3a.impl=dev.kcompact.delta.S3ConditionalLogStore}; the store must honour
 * {@code If-None-Match} (AWS S3 has since 2024; other S3 servers: check), and {@code fs.s3a.create.conditional.enabled}
 * must stay on (hadoop-aws's default).
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {
    /** The option of Hadoop's {@code createFile} builder that makes S3A put with {@code If-None-Match: *}. */
    static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

    public S3ConditionalLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
        if (!overwrite) {
            builder.must(CONDITIONAL, true);
        }
        try (FSDataOutputStream out = builder.build()) {
            while (actions.hasNext()) {
                out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
            }
        } catch (IOException e) {
            if (!overwrite && alreadyThere(e)) {
                FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
                exists.initCause(e);
                throw exists;
            }
            throw e;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }

    /**
     * Whether {@code e} says the object was there: Hadoop's or Java's file-exists exception (the check S3A makes
     * before the put), or S3's answer to the conditional put itself, HTTP 412 Precondition Failed (or 409
     * ConditionalRequestConflict, when two such puts of one key overlap), somewhere in the causes.
     */
    static boolean alreadyThere(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof FileAlreadyExistsException
                    || t instanceof org.apache.hadoop.fs.FileAlreadyExistsException) {
                return true;
            }
            String message = String.valueOf(t.getMessage());
            if (message.contains("412") || message.contains("PreconditionFailed")
                    || message.contains("ConditionalRequestConflict")) {
                return true;
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return false;
    }
}
