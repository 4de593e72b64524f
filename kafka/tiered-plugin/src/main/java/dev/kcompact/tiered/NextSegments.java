package dev.kcompact.tiered;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.LongSupplier;

/**
 * Which segment a consumer reading a partition's tier enters next, from a listing of the partition's {@code .log}
 * objects in the store. The storage manager learns a segment's id only when the broker asks for its offset index,
 * just before reading it, so the segment's first chunk would be fetched while the broker waits; with the next segment
 * known from its key ({@link SegmentObjectKeys}: the start offset is in it), its first chunk is fetched while the
 * consumer still reads the last chunk of the one before.
 *
 * <p>A hint, never an answer the broker relies on: only a start offset that exactly one listed {@code .log} object
 * has is taken (a segment kcompact replaced stays in the store until {@code kcompact gc}, and may start where its
 * replacement does: then nothing is fetched ahead). A partition is listed again when the offset sought is not in its
 * last listing, at most once per {@code relistMs}; the entries behind the offset sought are dropped, so a listing
 * holds the segments ahead of the partition's readers.
 */
final class NextSegments {

    /** Lists the objects under a prefix with a suffix: {@link PythonStore#list}. */
    interface Lister {
        CompletableFuture<List<PythonStore.Listed>> list(String prefix, String suffix);
    }

    /** Told of the next segment found: its {@code .log} key and size. */
    interface Ahead {
        void fetch(String key, long size);
    }

    private static final class Listing {
        NavigableMap<Long, List<PythonStore.Listed>> byStart = new TreeMap<>();
        boolean listed;
        long listedAtMs;
        boolean listing;
    }

    private final Lister lister;
    private final long relistMs;
    private final LongSupplier clockMs;
    private final Map<String, Listing> partitions = new ConcurrentHashMap<>();

    NextSegments(Lister lister, long relistMs, LongSupplier clockMs) {
        this.lister = lister;
        this.relistMs = relistMs;
        this.clockMs = clockMs;
    }

    /** Calls {@code ahead} with the segment of the partition under {@code prefix} that starts at {@code offset}, now
     * if the last listing has it, else once a new listing (if one is due) does; never if it is not exactly one. */
    void find(String prefix, long offset, Ahead ahead) {
        Listing listing = partitions.computeIfAbsent(prefix, p -> new Listing());
        PythonStore.Listed found;
        synchronized (listing) {
            found = only(listing, offset);
            if (found == null) {
                if (listing.listing || listing.listed && clockMs.getAsLong() - listing.listedAtMs < relistMs) {
                    return;
                }
                listing.listing = true;
                listing.listed = true;
                listing.listedAtMs = clockMs.getAsLong();
            }
        }
        if (found != null) {
            ahead.fetch(found.key(), found.size());
            return;
        }
        lister.list(prefix, "." + SegmentObjectKeys.Suffix.LOG.text).whenComplete((objects, failure) -> {
            PythonStore.Listed now = null;
            synchronized (listing) {
                listing.listing = false;
                if (failure == null) {
                    listing.byStart = byStart(prefix, objects);
                    now = only(listing, offset);
                }
            }
            if (now != null) {
                ahead.fetch(now.key(), now.size());
            }
        });
    }

    /** The one object starting at {@code offset}, or null; drops the entries behind it. Holding the listing's lock. */
    private static PythonStore.Listed only(Listing listing, long offset) {
        listing.byStart.headMap(offset, false).clear();
        List<PythonStore.Listed> at = listing.byStart.get(offset);
        return at != null && at.size() == 1 ? at.get(0) : null;
    }

    private static NavigableMap<Long, List<PythonStore.Listed>> byStart(String prefix,
                                                                        List<PythonStore.Listed> objects) {
        NavigableMap<Long, List<PythonStore.Listed>> out = new TreeMap<>();
        for (PythonStore.Listed object : objects) {
            String name = object.key().substring(prefix.length());
            int dash = name.indexOf('-');
            if (dash == 20 && name.chars().limit(20).allMatch(Character::isDigit)) {
                out.computeIfAbsent(Long.parseLong(name.substring(0, 20)), s -> new ArrayList<>()).add(object);
            }
        }
        return out;
    }
}
