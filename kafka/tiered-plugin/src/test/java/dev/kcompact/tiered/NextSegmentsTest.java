package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/** The next segment of a partition as its listing says: found when one object starts there, listed again when none
 * does (not more often than asked), nothing when two do (a segment kcompact replaced, not yet collected). */
class NextSegmentsTest {

    private static final String PARTITION = "orders-MWJ6FHTfRYy67jzwZdeqSQ/3/";

    private final List<PythonStore.Listed> objects = new ArrayList<>();
    private final List<String> found = new ArrayList<>();
    private int listings;
    private long now = 1_000_000;
    private final NextSegments next = new NextSegments((prefix, suffix) -> {
        listings++;
        return CompletableFuture.completedFuture(objects.stream()
                .filter(o -> o.key().startsWith(prefix) && o.key().endsWith(suffix)).toList());
    }, 5000, () -> now);

    private void segment(long start, String id, long size) {
        objects.add(new PythonStore.Listed(String.format("%s%020d-%s.log", PARTITION, start, id), size));
    }

    private void find(long offset) {
        next.find(PARTITION, offset, (key, size) -> found.add(key.substring(PARTITION.length()) + " " + size));
    }

    @Test
    void theOneSegmentStartingThereIsFoundFromOneListingUntilOneIsMissing() {
        segment(0, "a", 100);
        segment(100, "b", 200);
        segment(300, "c", 300);
        objects.add(new PythonStore.Listed(PARTITION + "00000000000000000100-b.index", 8));
        objects.add(new PythonStore.Listed("orders-MWJ6FHTfRYy67jzwZdeqSQ/4/00000000000000000600-x.log", 5));

        find(100);
        find(300);
        assertEquals(List.of("00000000000000000100-b.log 200", "00000000000000000300-c.log 300"), found);
        assertEquals(1, listings);

        segment(600, "d", 50);
        find(600);
        now += 4999;
        find(600);
        assertEquals(1, listings, "not in the listing, which is not 5 s old: not listed again");
        now += 1;
        find(600);
        find(600);
        assertEquals(2, listings);
        assertEquals(List.of("00000000000000000100-b.log 200", "00000000000000000300-c.log 300",
                "00000000000000000600-d.log 50", "00000000000000000600-d.log 50"), found);
    }

    @Test
    void twoSegmentsStartingAtTheOffsetAreNoAnswer() {
        segment(0, "a", 100);
        segment(100, "replaced", 200);
        segment(100, "compacted", 150);

        find(100);
        assertEquals(List.of(), found);
    }
}
