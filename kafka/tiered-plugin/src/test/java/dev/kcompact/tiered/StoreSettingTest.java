package dev.kcompact.tiered;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.junit.jupiter.api.Test;

class StoreSettingTest {

    @Test
    void aTrailingPropertiesCommentIsRefusedNamingTheSetting() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> StoreSetting.of(
                Map.of("kcompact.store", "s3://bucket/prefix            # or a local directory", "broker.id", "11"),
                "rsm.config."));
        assertTrue(e.getMessage().startsWith("rsm.config.kcompact.store is 's3://bucket/prefix "), e.getMessage());
        assertTrue(e.getMessage().contains("lines of their own"), e.getMessage());
    }

    @Test
    void theTwoManagersOfABrokerMustNameTheSameStore() {
        assertEquals("/data/store", StoreSetting.of(Map.of("kcompact.store", "/data/store", "broker.id", "12"),
                "rsm.config."));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> StoreSetting.of(
                Map.of("kcompact.store", "/data/other", "broker.id", "12"), "rlmm.config."));
        assertEquals("rsm.config.kcompact.store is '/data/store' but rlmm.config.kcompact.store is '/data/other': "
                + "the storage manager would write segments where the metadata manager does not look; set both to "
                + "the same store", e.getMessage());
        assertEquals("/data/store", StoreSetting.of(Map.of("kcompact.store", "/data/store", "broker.id", "12"),
                "rlmm.config."));
        assertEquals("/data/store", StoreSetting.of(Map.of("kcompact.store", "/data/store", "broker.id", "13"),
                "rlmm.config."), "another broker's setting is its own");
    }

    @Test
    void aMissingStoreIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> StoreSetting.of(Map.of("broker.id", "14"), "rlmm.config."));
    }
}
