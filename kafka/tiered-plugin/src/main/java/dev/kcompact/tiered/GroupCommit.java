package dev.kcompact.tiered;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/**
 * The broker's metadata writes ({@code copy}, a whole copy at its finish, and {@code update}) committed together when
 * its threads make them at once: Kafka copies segments on {@code remote.log.manager.copier.thread.pool.size} threads
 * (10 by default), each write is a Delta commit in the metadata process, and one commit per write one after the
 * other made a write wait for every write queued before it. A write joins the queue; the first writer to find no batch in flight sends everything queued
 * (at most one write per partition: a partition's writes keep their order, the next waits for the next batch) as one
 * {@code batch} request, which the process commits in one Delta commit, each partition planned and refused alone
 * ({@code compaction.remote_log_metadata.batch}). A lone write is sent as itself. Every write gets its own answer or
 * its own failure, as if it had been sent alone.
 */
final class GroupCommit {

    /** Sends one request (a write, or a {@code batch} of them) to the metadata process; its result. */
    interface Pipe {
        JsonNode call(ObjectNode request) throws RemoteStorageException;

        ObjectNode request(String op);

        /** The failure a {@code batch} answer's element stands for (its {@code ok} is false). */
        RemoteStorageException refusal(String op, JsonNode answer);
    }

    private static final class Write {
        final TopicPartition tp;
        final ObjectNode request;
        JsonNode result;
        RemoteStorageException failure;
        boolean done;

        Write(TopicPartition tp, ObjectNode request) {
            this.tp = tp;
            this.request = request;
        }
    }

    private final Pipe pipe;
    private final ArrayDeque<Write> queued = new ArrayDeque<>();
    private final Object sending = new Object();

    GroupCommit(Pipe pipe) {
        this.pipe = pipe;
    }

    /** Commits {@code request}, a write to {@code tp}, with whatever other writes are waiting; its answer. */
    JsonNode write(TopicPartition tp, ObjectNode request) throws RemoteStorageException {
        Write write = new Write(tp, request);
        synchronized (queued) {
            queued.add(write);
        }
        synchronized (sending) {
            while (!write.done) {
                send(next());
            }
        }
        if (write.failure != null) {
            throw write.failure;
        }
        return write.result;
    }

    /** The queued writes of distinct partitions, oldest first; a partition's later writes stay queued. */
    private List<Write> next() {
        List<Write> batch = new ArrayList<>();
        Set<TopicPartition> taken = new HashSet<>();
        synchronized (queued) {
            for (Iterator<Write> it = queued.iterator(); it.hasNext(); ) {
                Write w = it.next();
                if (taken.add(w.tp)) {
                    batch.add(w);
                    it.remove();
                }
            }
        }
        return batch;
    }

    private void send(List<Write> batch) {
        if (batch.size() == 1) {
            Write only = batch.get(0);
            try {
                only.result = pipe.call(only.request);
            } catch (RemoteStorageException e) {
                only.failure = e;
            }
            only.done = true;
            return;
        }
        ObjectNode request = pipe.request("batch");
        ArrayNode requests = request.putArray("requests");
        batch.forEach(w -> requests.add(w.request));
        try {
            JsonNode answers = pipe.call(request).get("answers");
            for (int i = 0; i < batch.size(); i++) {
                Write w = batch.get(i);
                JsonNode answer = answers.get(i);
                if (answer.path("ok").asBoolean()) {
                    w.result = answer.get("result");
                } else {
                    w.failure = pipe.refusal(w.request.get("op").asText(), answer);
                }
            }
        } catch (RemoteStorageException e) {
            batch.forEach(w -> w.failure = e);
        } finally {
            batch.forEach(w -> w.done = true);
        }
    }
}
