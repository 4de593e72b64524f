"""compaction.config: Kafka's names and defaults, parsing as Kafka's ConfigDef does, errors naming key and file."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml

from compaction.config import (
    KEYS,
    LONG_MAX,
    CleanupPolicy,
    CompactionStrategy,
    ConfigValueError,
    KcompactConfig,
    TopicConfig,
    load_config,
    parse_config,
)
from compaction.errors import ConfigError, ExitCode

REPO = Path(__file__).resolve().parents[2]
MIN_LAG, MAX_LAG = "min.compaction.lag.ms", "max.compaction.lag.ms"

# Kafka's defaults, as Kafka prints them (`kafka-configs --describe --all`); bloom.filter.fpp is kcompact's own.
KAFKA_DEFAULTS: dict[str, Any] = {
    "cleanup.policy": "delete",
    "min.cleanable.dirty.ratio": 0.5,
    "min.compaction.lag.ms": 0,
    "max.compaction.lag.ms": 9223372036854775807,
    "delete.retention.ms": 86400000,
    "retention.ms": 604800000,
    "retention.bytes": -1,
    "segment.bytes": 1073741824,
    "segment.ms": 604800000,
    "segment.index.bytes": 10485760,
    "index.interval.bytes": 4096,
    "compaction.strategy": "offset",
    "compaction.strategy.header": None,
    "producer.id.expiration.ms": 86400000,
    "file.delete.delay.ms": 60000,
    "bloom.filter.fpp": None,  # derived from the partition's bytes (compaction.bloom.sizing)
}

# (key, raw value as written in YAML, parsed value): every key, as a number and as a string.
VALID = [
    ("cleanup.policy", "compact", frozenset({CleanupPolicy.COMPACT})),
    ("cleanup.policy", "Compact", frozenset({CleanupPolicy.COMPACT})),
    ("cleanup.policy", "compact,delete", frozenset(CleanupPolicy)),
    ("cleanup.policy", " DELETE , compact ", frozenset(CleanupPolicy)),
    ("cleanup.policy", ["compact", "delete"], frozenset(CleanupPolicy)),
    ("min.cleanable.dirty.ratio", 0, 0.0),
    ("min.cleanable.dirty.ratio", 1, 1.0),
    ("min.cleanable.dirty.ratio", "0.25", 0.25),
    ("min.compaction.lag.ms", 3600000, 3600000),
    ("min.compaction.lag.ms", " 3600000 ", 3600000),
    ("max.compaction.lag.ms", 1, 1),
    ("max.compaction.lag.ms", "9223372036854775807", LONG_MAX),
    ("delete.retention.ms", 0, 0),
    ("delete.retention.ms", "1000", 1000),
    ("retention.ms", -1, -1),
    ("retention.ms", "3600000", 3600000),
    ("retention.bytes", -1, -1),
    ("retention.bytes", "1073741824", 1073741824),
    ("segment.bytes", 14, 14),
    ("segment.bytes", "1024", 1024),
    ("segment.index.bytes", 4, 4),
    ("segment.index.bytes", "1024", 1024),
    ("index.interval.bytes", 0, 0),
    ("index.interval.bytes", "1", 1),
    ("compaction.strategy", "timestamp", CompactionStrategy.TIMESTAMP),
    ("compaction.strategy", "OFFSET", CompactionStrategy.OFFSET),
    ("compaction.strategy.header", "version", "version"),
    ("compaction.strategy.header", None, None),
    ("producer.id.expiration.ms", 1, 1),
    ("producer.id.expiration.ms", "86400000", 86400000),
    ("file.delete.delay.ms", 0, 0),
    ("file.delete.delay.ms", "60000", 60000),
    ("bloom.filter.fpp", 0.001, 0.001),
    ("bloom.filter.fpp", "0.5", 0.5),
]

# (key, raw value, the problem the error states after "<key>: ").
INVALID = [
    ("cleanup.policy", "compacted", "'compacted' is not a valid cleanup.policy"),
    ("cleanup.policy", "", "'' is not a valid cleanup.policy"),
    ("cleanup.policy", 1, "1 is not a list"),
    ("min.cleanable.dirty.ratio", 1.5, "1.5 is not in [0, 1]"),
    ("min.cleanable.dirty.ratio", -0.1, "-0.1 is not in [0, 1]"),
    ("min.cleanable.dirty.ratio", "half", "'half' is not a number"),
    ("min.cleanable.dirty.ratio", ".nan", "'.nan' is not a number"),
    ("min.compaction.lag.ms", -1, "-1 is not in [0, 9223372036854775807]"),
    ("min.compaction.lag.ms", 1.5, "1.5 is not an integer"),
    ("min.compaction.lag.ms", True, "True is not an integer"),
    ("max.compaction.lag.ms", 0, "0 is not in [1, 9223372036854775807]"),
    ("max.compaction.lag.ms", 2**63, "9223372036854775808 does not fit in a 64-bit long"),
    ("delete.retention.ms", -5, "-5 is not in [0, 9223372036854775807]"),
    ("retention.ms", -2, "-2 is not in [-1, 9223372036854775807]"),
    ("retention.bytes", "1GB", "'1GB' is not an integer"),
    ("segment.bytes", 13, "13 is not in [14, 2147483647]"),
    ("segment.bytes", 2**31, "2147483648 does not fit in a 32-bit int"),
    ("segment.index.bytes", 3, "3 is not in [4, 2147483647]"),
    ("index.interval.bytes", -1, "-1 is not in [0, 2147483647]"),
    ("compaction.strategy", "newest", "'newest' is not a compaction strategy"),
    ("compaction.strategy.header", 7, "7 is not a header key"),
    ("producer.id.expiration.ms", 0, "0 is not in [1, 2147483647]"),
    ("file.delete.delay.ms", "soon", "'soon' is not an integer"),
    ("bloom.filter.fpp", 0, "0.0 is not in (0, 1)"),
    ("bloom.filter.fpp", 1, "1.0 is not in (0, 1)"),
    ("segment.bytes", None, "has no value"),
]


def write(tmp_path: Path, document: object, name: str = "kcompact.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return path


def test_defaults_are_kafkas() -> None:
    assert TopicConfig().to_kafka() == KAFKA_DEFAULTS
    assert set(KEYS) == set(KAFKA_DEFAULTS)
    assert {k.attr for k in KEYS.values()} == {f.name for f in dataclasses.fields(TopicConfig)}


def test_defaults_round_trip_through_kafka_names() -> None:
    c = TopicConfig.from_kafka({"cleanup.policy": "compact,delete", "compaction.strategy": "header",
                                "compaction.strategy.header": "v", "min.compaction.lag.ms": 5})  # fmt: skip
    assert TopicConfig.from_kafka(c.to_kafka()) == c


@pytest.mark.parametrize(("key", "raw", "expected"), VALID)
def test_every_key_parses(key: str, raw: object, expected: object) -> None:
    config = TopicConfig.from_kafka({key: raw})
    assert getattr(config, KEYS[key].attr) == expected


@pytest.mark.parametrize(("key", "raw", "problem"), INVALID)
def test_invalid_values_name_the_key(key: str, raw: object, problem: str) -> None:
    with pytest.raises(ConfigValueError) as e:
        TopicConfig.from_kafka({key: raw})
    assert e.value.key == key
    assert str(e.value).startswith(f"{key}: {problem}")


@pytest.mark.parametrize(("key", "raw", "problem"), INVALID)
def test_invalid_values_in_a_file_name_key_and_file(tmp_path: Path, key: str, raw: object, problem: str) -> None:
    path = write(tmp_path, {"topics": {"orders": {key: raw}}})
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: topics.orders.{key}: {problem}")
    assert e.value.exit_code is ExitCode.CONFIG


def test_error_message_example(tmp_path: Path) -> None:
    path = write(tmp_path, "topics:\n  orders:\n    min.cleanable.dirty.ratio: 1.5\n", "x.yaml")
    with pytest.raises(
        ConfigError, match=r"^.*x\.yaml: topics\.orders\.min\.cleanable\.dirty\.ratio: 1\.5 is not in \[0, 1\]$"
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"defaults": {"min.cleanable.ratio": 0.5}}, "defaults.min.cleanable.ratio"),
        ({"topics": {"o": {"log.cleaner.min.compaction.lag.ms": 1}}}, "topics.o.log.cleaner.min.compaction.lag.ms"),
        ({"default": {}}, "default"),
        ({"topics": {"bad topic": {}}}, "topics.bad topic"),
        ({"topics": ["orders"]}, "topics"),
        ({"topics": {"orders": "compact"}}, "topics.orders"),
    ],
)  # fmt: skip
def test_unknown_names_name_key_and_file(tmp_path: Path, document: object, key: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(ConfigValueError) as e:
        load_config(path)
    assert e.value.key == key and e.value.where == str(path)
    assert str(e.value).startswith(f"{path}: {key}: ")


def test_unknown_name_suggests_the_close_one() -> None:
    with pytest.raises(ConfigValueError, match=r"did you mean min\.cleanable\.dirty\.ratio\?"):
        TopicConfig.from_kafka({"min.cleanable.dirty.ratios": 0.5})


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"defaults": {MIN_LAG: 10, MAX_LAG: 5}}, f"defaults.{MAX_LAG}"),
        ({"topics": {"t": {MIN_LAG: 10, MAX_LAG: 5}}}, f"topics.t.{MAX_LAG}"),
        # the topic raises min above the max it inherits from defaults
        ({"defaults": {MAX_LAG: 5}, "topics": {"t": {MIN_LAG: 10}}}, f"topics.t.{MAX_LAG}"),
    ],
)  # fmt: skip
def test_max_lag_below_min_lag_is_refused(tmp_path: Path, document: object, key: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(ConfigValueError, match=r"5 is less than min\.compaction\.lag\.ms \(10\)") as e:
        load_config(path)
    assert e.value.key == key


def test_max_lag_equal_to_min_lag_is_fine() -> None:
    c = TopicConfig.from_kafka({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 10})
    assert (c.min_compaction_lag_ms, c.max_compaction_lag_ms) == (10, 10)


@pytest.mark.parametrize("header", [None, "", "   "])
def test_header_strategy_needs_a_header_key(header: str | None) -> None:
    with pytest.raises(ConfigValueError) as e:
        TopicConfig.from_kafka({"compaction.strategy": "header", "compaction.strategy.header": header})
    assert e.value.key == "compaction.strategy.header"


def test_header_key_is_kept_exactly() -> None:
    c = TopicConfig.from_kafka({"compaction.strategy": "header", "compaction.strategy.header": "Version"})
    assert c.compaction_strategy is CompactionStrategy.HEADER and c.compaction_strategy_header == "Version"


@pytest.mark.parametrize(("policy", "compacted"), [("compact", True), ("compact,delete", True), ("delete", False)])
def test_is_compacted(policy: str, compacted: bool) -> None:
    assert TopicConfig.from_kafka({"cleanup.policy": policy}).is_compacted is compacted
    assert TopicConfig.from_kafka({"cleanup.policy": policy}).cleanup_policy_text == policy


def test_direct_construction_is_validated_and_frozen() -> None:
    with pytest.raises(ConfigValueError, match=r"^min.cleanable.dirty.ratio: 2 is not in \[0, 1\]"):
        TopicConfig(min_cleanable_dirty_ratio=2)
    c = TopicConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.segment_bytes = 1  # type: ignore[misc]


def test_topics_override_single_keys_over_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "defaults": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.3", "segment.bytes": 2048},
            "topics": {"orders": {"segment.bytes": "4096"}, "logs": {"cleanup.policy": "delete"}},
        },
    )
    config = load_config(path)
    assert config.source == str(path)
    orders = config.for_topic("orders")
    assert (orders.segment_bytes, orders.min_cleanable_dirty_ratio, orders.is_compacted) == (4096, 0.3, True)
    assert not config.for_topic("logs").is_compacted
    assert config.for_topic("unlisted") == config.defaults
    with pytest.raises(TypeError):
        config.topics["new"] = TopicConfig()  # type: ignore[index]


@pytest.mark.parametrize("text", ["", "# only comments\n", "defaults:\ntopics:\n"])
def test_empty_files_mean_kafka_defaults(tmp_path: Path, text: str) -> None:
    config = load_config(write(tmp_path, text))
    assert config.defaults == TopicConfig() and dict(config.topics) == {}


def test_unreadable_or_malformed_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: cannot read config file"):
        load_config(missing)
    bad = write(tmp_path, "defaults: [unclosed\n", "bad.yaml")
    with pytest.raises(ConfigError, match=f"^{bad}: not valid YAML"):
        load_config(bad)
    top = write(tmp_path, "- a\n- b\n", "list.yaml")
    with pytest.raises(ConfigError, match=f"^{top}: \\(top level\\): expected a mapping"):
        load_config(top)


def test_configs_pickle() -> None:
    config = parse_config({"topics": {"orders": {"cleanup.policy": "compact"}}}, "<inline>")
    assert pickle.loads(pickle.dumps(config)) == config


def test_parse_config_is_pure() -> None:
    config = parse_config({"topics": {"orders": {"cleanup.policy": "compact"}}}, "<inline>")
    assert config == KcompactConfig(
        TopicConfig(), {"orders": TopicConfig(frozenset({CleanupPolicy.COMPACT}))}, "<inline>"
    )


def test_shipped_example_lists_every_key_with_kafkas_default() -> None:
    path = REPO / "conf" / "kcompact.yaml"
    document = yaml.safe_load(path.read_text())
    assert document["defaults"] == KAFKA_DEFAULTS
    config = load_config(path)
    assert config.defaults == TopicConfig()
    assert all(config.for_topic(t).is_compacted for t in config.topics)
