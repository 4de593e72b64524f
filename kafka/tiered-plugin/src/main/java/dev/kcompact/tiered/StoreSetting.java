package dev.kcompact.tiered;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The {@code kcompact.store} setting, which both managers take under their own prefix ({@code rsm.config.},
 * {@code rlmm.config.}) and which must name the same store: the storage manager writes the segments' objects where
 * the metadata manager's rows say they are. Kafka hands each manager only its own prefix's settings, so the two
 * values meet here, per broker, in the broker's JVM: the second manager configured refuses a value that differs
 * from the first's, and either refuses one holding whitespace, which no directory or {@code s3://} URI kcompact
 * takes does, but which a properties line {@code ...store=s3://bucket/prefix   # a comment} gives: Java properties
 * keep a trailing {@code # comment} as part of the value. Either way the broker stops at start-up, naming both
 * settings, rather than tiering into one place and listing another.
 */
final class StoreSetting {

    static final String NAME = "kcompact.store";

    private record Configured(String prefix, String store) {
    }

    private static final Map<String, Configured> BY_BROKER = new ConcurrentHashMap<>();

    private StoreSetting() {
    }

    /**
     * The store {@code configs} names for the manager configured under {@code prefix}, checked as the class comment
     * says; remembered for the broker of {@code configs}' {@code broker.id} (a manager configured again under the
     * same prefix replaces its value).
     *
     * @throws IllegalArgumentException the setting is missing, holds whitespace, or differs from the other
     *     manager's on the same broker
     */
    static String of(Map<String, ?> configs, String prefix) {
        Object value = configs.get(NAME);
        if (value == null) {
            throw new IllegalArgumentException(prefix + NAME + " is required: kcompact's store directory or "
                    + "s3://bucket/prefix, the same for rsm.config. and rlmm.config.");
        }
        String store = value.toString();
        if (store.isEmpty() || store.chars().anyMatch(Character::isWhitespace)) {
            throw new IllegalArgumentException(prefix + NAME + " is '" + store + "': a store directory or URI holds "
                    + "no whitespace (a properties file keeps a '# comment' after a value as part of the value: put "
                    + "comments on lines of their own)");
        }
        Configured mine = new Configured(prefix, store);
        Configured first = BY_BROKER.merge(broker(configs), mine,
                (old, now) -> old.prefix().equals(now.prefix()) ? now : old);
        if (!first.store().equals(store)) {
            throw new IllegalArgumentException(first.prefix() + NAME + " is '" + first.store() + "' but " + prefix
                    + NAME + " is '" + store + "': the storage manager would write segments where the metadata "
                    + "manager does not look; set both to the same store");
        }
        return store;
    }

    private static String broker(Map<String, ?> configs) {
        Object id = configs.get("broker.id");
        return id == null ? "" : id.toString();
    }
}
