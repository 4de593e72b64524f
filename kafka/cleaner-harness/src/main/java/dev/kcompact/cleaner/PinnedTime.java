package dev.kcompact.cleaner;

import org.apache.kafka.common.utils.Time;

import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/** A clock that never moves, as Kafka's MockTime in LogCleanerTest: every rule of a round reads the same now. */
final class PinnedTime implements Time {
    private final long nowMs;

    PinnedTime(long nowMs) {
        this.nowMs = nowMs;
    }

    @Override
    public long milliseconds() {
        return nowMs;
    }

    @Override
    public long nanoseconds() {
        return TimeUnit.MILLISECONDS.toNanos(nowMs);
    }

    @Override
    public void sleep(long ms) {
        // a pinned clock does not advance: nothing waits for it
    }

    @Override
    public void waitObject(Object obj, Supplier<Boolean> condition, long deadlineMs) {
        if (!condition.get()) {
            throw new IllegalStateException("a pinned clock cannot wait for a condition");
        }
    }
}
