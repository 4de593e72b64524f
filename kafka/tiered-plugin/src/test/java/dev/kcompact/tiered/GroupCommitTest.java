package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;

/** Writes made at once go as one batch, a partition's writes in order, each with its own answer or failure. */
class GroupCommitTest {

    private static final ObjectMapper JSON = new ObjectMapper();

    /** A process that holds its first call until released, answers a write with its partition, and refuses any
     * write to partition 13. */
    private static final class Recording implements GroupCommit.Pipe {
        final List<String> calls = Collections.synchronizedList(new ArrayList<>());
        final CountDownLatch release = new CountDownLatch(1);

        @Override
        public JsonNode call(ObjectNode request) throws RemoteStorageException {
            String op = request.get("op").asText();
            if (op.equals("batch")) {
                List<Integer> partitions = new ArrayList<>();
                ObjectNode result = JSON.createObjectNode();
                ArrayNode answers = result.putArray("answers");
                for (JsonNode r : request.get("requests")) {
                    partitions.add(r.get("partition").asInt());
                    answers.add(answer(r));
                }
                calls.add("batch" + partitions);
                return result;
            }
            calls.add(op + "[" + request.get("partition").asInt() + "]");
            try {
                release.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return answer(request).get("result");
        }

        private static JsonNode answer(JsonNode r) {
            ObjectNode answer = JSON.createObjectNode();
            if (r.get("partition").asInt() == 13) {
                return answer.put("ok", false).put("type", "FencedError").put("error", "deposed").put("version", 4);
            }
            answer.put("ok", true).putObject("result").put("partition", r.get("partition").asInt());
            return answer;
        }

        @Override
        public ObjectNode request(String op) {
            return JSON.createObjectNode().put("op", op);
        }

        @Override
        public RemoteStorageException refusal(String op, JsonNode answer) {
            return new RemoteStorageException(op + ": " + answer.get("type").asText());
        }
    }

    private static ObjectNode add(int partition) {
        return JSON.createObjectNode().put("op", "add").put("partition", partition);
    }

    @Test
    void writesMadeWhileOneIsInFlightGoTogetherAndAPartitionsWritesKeepTheirOrder() throws Exception {
        Recording pipe = new Recording();
        GroupCommit group = new GroupCommit(pipe);
        ExecutorService threads = Executors.newFixedThreadPool(5);
        try {
            Future<JsonNode> first = threads.submit(() -> group.write(new TopicPartition("t", 0), add(0)));
            while (pipe.calls.isEmpty()) {
                Thread.sleep(1);
            }
            List<Future<JsonNode>> waiting = new ArrayList<>();
            for (int p : new int[] {1, 2, 1, 13}) {
                waiting.add(threads.submit(() -> group.write(new TopicPartition("t", p), add(p))));
                Thread.sleep(50);  // queued in this order while the first write holds the process
            }
            pipe.release.countDown();
            assertEquals(0, first.get(10, TimeUnit.SECONDS).get("partition").asInt());
            assertEquals(1, waiting.get(0).get(10, TimeUnit.SECONDS).get("partition").asInt());
            assertEquals(2, waiting.get(1).get(10, TimeUnit.SECONDS).get("partition").asInt());
            assertEquals(1, waiting.get(2).get(10, TimeUnit.SECONDS).get("partition").asInt());
            Exception refused = assertThrows(Exception.class, () -> waiting.get(3).get(10, TimeUnit.SECONDS));
            assertTrue(refused.getCause().getMessage().equals("add: FencedError"), refused.toString());
            // partition 1's second write waits for the batch after the one holding its first
            assertEquals(List.of("add[0]", "batch[1, 2, 13]", "add[1]"), pipe.calls);
        } finally {
            threads.shutdownNow();
        }
    }
}
