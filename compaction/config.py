"""Kafka's topic-level compaction configs, with Kafka's names, defaults and validation.

Names as in Kafka's `TopicConfig`, defaults and validation as in its `LogConfig`.

`TopicConfig` is one topic's settings as a frozen, validated value; `KcompactConfig` is `defaults:` plus
per-topic overrides. Values are parsed the way Kafka's `ConfigDef` parses them: a long or int may be given
as a number or a decimal string, a ratio as a number or a string, a list (cleanup.policy) as a
comma-separated string or a list; booleans and fractional longs are refused. Every error is a
`ConfigValueError` naming the key (and, once located by the loader, the file):

    conf/x.yaml: topics.orders.min.cleanable.dirty.ratio: 1.5 is not in [0, 1]

Our resolution of KIP-280's open point: `compaction.strategy=header` with a blank
`compaction.strategy.header` is an error here, where KIP-280 silently falls back to `offset`; a strategy
nobody can act on should not look configured. The header key is matched exactly (case-sensitive).

The classes read no files and no environment; `load_config` is the one function that reads a file, and
`parse_config` is its pure core.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from compaction.errors import ConfigError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class CleanupPolicy(StrEnum):
    COMPACT = "compact"
    DELETE = "delete"


class CompactionStrategy(StrEnum):
    """KIP-280's `compaction.strategy`: which record of a key survives."""

    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    HEADER = "header"


class ConfigValueError(ConfigError):
    """One config value is unknown or invalid. `key` is the full dotted key, `where` the file if known."""

    def __init__(self, key: str, problem: str, where: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.where = where
        super().__init__(f"{where}: {key}: {problem}" if where else f"{key}: {problem}")

    def located(self, where: str, prefix: str = "") -> ConfigValueError:
        """The same error, anchored in file `where` under key path `prefix` (e.g. `topics.orders.`)."""
        return ConfigValueError(prefix + self.key, self.problem, where)


@dataclass(frozen=True)
class TopicConfig:
    """One topic's compaction settings; every default is Kafka's (`LogConfig`).

    Raises `ConfigValueError` on construction if a value is out of Kafka's range, or if
    max.compaction.lag.ms < min.compaction.lag.ms (KIP-354).
    """

    cleanup_policy: frozenset[CleanupPolicy] = frozenset({CleanupPolicy.DELETE})
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86_400_000
    retention_ms: int = 604_800_000  # applied to compact,delete topics only (`compaction.retention`)
    retention_bytes: int = -1
    segment_bytes: int = 1_073_741_824
    segment_ms: int = 604_800_000
    segment_index_bytes: int = 10_485_760
    index_interval_bytes: int = 4096
    compaction_strategy: CompactionStrategy = CompactionStrategy.OFFSET
    compaction_strategy_header: str | None = None
    producer_id_expiration_ms: int = 86_400_000
    file_delete_delay_ms: int = 60_000
    bloom_filter_fpp: float | None = None  # None: derived from the partition's bytes (`bloom.sizing`)

    def __post_init__(self) -> None:
        for key in KEYS.values():
            key.check(getattr(self, key.attr))
        if self.max_compaction_lag_ms < self.min_compaction_lag_ms:
            raise ConfigValueError(
                "max.compaction.lag.ms",
                f"{self.max_compaction_lag_ms} is less than min.compaction.lag.ms ({self.min_compaction_lag_ms});"
                " KIP-354 requires max.compaction.lag.ms >= min.compaction.lag.ms",
            )
        blank_header = not (self.compaction_strategy_header or "").strip()
        if self.compaction_strategy is CompactionStrategy.HEADER and blank_header:
            raise ConfigValueError(
                "compaction.strategy.header",
                "compaction.strategy=header needs a header key (KIP-280 would fall back to offset; kcompact refuses)",
            )

    @property
    def is_compacted(self) -> bool:
        """True if cleanup.policy contains `compact` (`compact` or `compact,delete`)."""
        return CleanupPolicy.COMPACT in self.cleanup_policy

    @property
    def has_retention(self) -> bool:
        """True for `compact,delete`: kcompact applies retention.ms / retention.bytes only to a topic it also
        compacts (a plain `delete` topic's retention belongs to whoever tiers it, e.g. the broker)."""
        return self.cleanup_policy == frozenset(CleanupPolicy)

    @property
    def cleanup_policy_text(self) -> str:
        """cleanup.policy as Kafka writes it: `compact`, `delete` or `compact,delete`."""
        return ",".join(p.value for p in CleanupPolicy if p in self.cleanup_policy)

    @classmethod
    def from_kafka(cls, values: Mapping[str, Any], base: TopicConfig | None = None) -> TopicConfig:
        """`base` (Kafka's defaults if None) with the Kafka-named `values` applied.

        Raises:
            ConfigValueError: an unknown name, a value of the wrong type, or a value out of range.
        """
        changes: dict[str, Any] = {}
        for name, raw in values.items():
            key = KEYS.get(str(name))
            if key is None:
                raise ConfigValueError(str(name), _unknown(str(name)))
            changes[key.attr] = key.parse(raw)
        return replace(base or cls(), **changes)

    def to_kafka(self) -> dict[str, str | int | float | None]:
        """Every setting under its Kafka name, as `from_kafka` accepts it back (plain JSON values)."""
        out: dict[str, str | int | float | None] = {}
        for key in KEYS.values():
            value = getattr(self, key.attr)
            if key.attr == "cleanup_policy":
                value = self.cleanup_policy_text
            out[key.name] = value.value if isinstance(value, StrEnum) else value
        return out


@dataclass(frozen=True)
class KcompactConfig:
    """`defaults` for every topic, and whole per-topic configs (already merged over the defaults).

    `topics` is read-only; the value pickles (it may cross the Spark boundary).
    """

    defaults: TopicConfig = field(default_factory=TopicConfig)
    topics: Mapping[str, TopicConfig] = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", MappingProxyType(dict(self.topics)))

    def __reduce__(self) -> tuple[type[KcompactConfig], tuple[TopicConfig, dict[str, TopicConfig], str | None]]:
        return (type(self), (self.defaults, dict(self.topics), self.source))

    def for_topic(self, name: str) -> TopicConfig:
        """The topic's own config if it has one, else the defaults."""
        return self.topics.get(name, self.defaults)


# --- parsing, as Kafka's ConfigDef does --------------------------------------------------------------


def _integer(raw: object, bits: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"{raw!r} is not an integer")
    try:
        value = int(raw.strip()) if isinstance(raw, str) else raw
    except ValueError:
        raise ValueError(f"{raw!r} is not an integer") from None
    limit = 2 ** (bits - 1)
    if not -limit <= value < limit:
        raise ValueError(f"{raw!r} does not fit in a {bits}-bit {'long' if bits == 64 else 'int'}")
    return value


def _long(raw: object) -> int:
    return _integer(raw, 64)


def _int(raw: object) -> int:
    return _integer(raw, 32)


def _double(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"{raw!r} is not a number")
    try:
        value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if math.isnan(value):
        raise ValueError("NaN is not a number")
    return value


def _policy(raw: object) -> frozenset[CleanupPolicy]:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple | set | frozenset):
        raise ValueError(f"{raw!r} is not a list (expected compact, delete or compact,delete)")
    names = [str(i).strip().lower() for i in items]
    bad = [n for n in names if n not in {p.value for p in CleanupPolicy}]
    if bad or not names:
        raise ValueError(f"{raw!r} is not a valid cleanup.policy (expected compact, delete or compact,delete)")
    return frozenset(CleanupPolicy(n) for n in names)


def _strategy(raw: object) -> CompactionStrategy:
    text = str(raw).strip().lower() if isinstance(raw, str | CompactionStrategy) else None
    if text not in {s.value for s in CompactionStrategy}:
        raise ValueError(f"{raw!r} is not a compaction strategy (expected offset, timestamp or header)")
    return CompactionStrategy(text)


def _header(raw: object) -> str | None:
    if raw is not None and not isinstance(raw, str):
        raise ValueError(f"{raw!r} is not a header key (a string)")
    return raw


@dataclass(frozen=True)
class _Key:
    """One config: Kafka name, field, parser of raw (YAML or string) values, and inclusive bounds."""

    name: str
    attr: str
    parse_raw: Callable[[object], Any]
    low: float | None = None
    high: float | None = None
    open_bounds: bool = False

    def parse(self, raw: object) -> Any:
        if raw is None and self.attr not in ("compaction_strategy_header", "bloom_filter_fpp"):
            raise ConfigValueError(self.name, "has no value (remove the line to use the default)")
        if raw is None:
            return None
        try:
            value = self.parse_raw(raw)
        except ValueError as e:
            raise ConfigValueError(self.name, str(e)) from None
        self.check(value)
        return value

    def check(self, value: Any) -> None:
        if self.low is None or self.high is None or value is None:
            return
        inside = self.low < value < self.high if self.open_bounds else self.low <= value <= self.high
        if not inside:
            brackets = "()" if self.open_bounds else "[]"
            raise ConfigValueError(
                self.name, f"{value} is not in {brackets[0]}{_num(self.low)}, {_num(self.high)}{brackets[1]}"
            )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


KEYS: Mapping[str, _Key] = MappingProxyType(
    {
        k.name: k
        for k in (
            _Key("cleanup.policy", "cleanup_policy", _policy),
            _Key("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", _double, 0, 1),
            _Key("min.compaction.lag.ms", "min_compaction_lag_ms", _long, 0, LONG_MAX),
            _Key("max.compaction.lag.ms", "max_compaction_lag_ms", _long, 1, LONG_MAX),
            _Key("delete.retention.ms", "delete_retention_ms", _long, 0, LONG_MAX),
            _Key("retention.ms", "retention_ms", _long, -1, LONG_MAX),
            _Key("retention.bytes", "retention_bytes", _long),
            _Key("segment.bytes", "segment_bytes", _int, 14, INT_MAX),
            _Key("segment.ms", "segment_ms", _long, 1, LONG_MAX),
            _Key("segment.index.bytes", "segment_index_bytes", _int, 4, INT_MAX),
            _Key("index.interval.bytes", "index_interval_bytes", _int, 0, INT_MAX),
            _Key("compaction.strategy", "compaction_strategy", _strategy),
            _Key("compaction.strategy.header", "compaction_strategy_header", _header),
            _Key("producer.id.expiration.ms", "producer_id_expiration_ms", _int, 1, INT_MAX),
            _Key("file.delete.delay.ms", "file_delete_delay_ms", _long, 0, LONG_MAX),
            _Key("bloom.filter.fpp", "bloom_filter_fpp", _double, 0, 1, open_bounds=True),
        )
    }
)
"""Every config name kcompact knows, in Kafka's spelling (bloom.filter.fpp is kcompact's own)."""


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, list(KEYS), n=1)
    hint = f"did you mean {close[0]}?" if close else f"known names: {', '.join(KEYS)}"
    return f"unknown config name; {hint}"


# --- the YAML file ------------------------------------------------------------------------------------


def parse_config(document: object, where: str) -> KcompactConfig:
    """The `KcompactConfig` of a parsed YAML document (`defaults:` and `topics: {<topic>: {...}}`).

    Pure; `where` names the source in errors.

    Raises:
        ConfigValueError: an unknown or invalid key, named with its full path and `where`.
    """
    if document is None:
        return KcompactConfig(source=where)
    doc = _mapping(document, "", where)
    for name in doc:
        if name not in ("defaults", "topics"):
            raise ConfigValueError(str(name), "unknown section; expected defaults: and topics:", where)
    defaults = _topic_config(doc.get("defaults"), TopicConfig(), "defaults.", where)
    topics: dict[str, TopicConfig] = {}
    for topic, values in _mapping(doc.get("topics"), "topics", where).items():
        if not isinstance(topic, str) or not _is_topic_name(topic):
            raise ConfigValueError(f"topics.{topic}", "is not a Kafka topic name (1-249 of [a-zA-Z0-9._-])", where)
        topics[topic] = _topic_config(values, defaults, f"topics.{topic}.", where)
    return KcompactConfig(defaults, topics, where)


def load_config(path: str | Path) -> KcompactConfig:
    """Read and validate a kcompact YAML config file.

    Raises:
        ConfigError: the file is missing or not YAML; `ConfigValueError` naming key and file for an unknown
            or invalid key.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read config file: {e.strerror or e}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {e}") from None
    return parse_config(document, where)


def _mapping(value: object, key: str, where: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigValueError(key or "(top level)", f"expected a mapping, found {type(value).__name__}", where)
    return value


def _topic_config(values: object, base: TopicConfig, prefix: str, where: str) -> TopicConfig:
    mapping = _mapping(values, prefix.rstrip("."), where)
    try:
        return TopicConfig.from_kafka(mapping, base)
    except ConfigValueError as e:
        raise e.located(where, prefix) from None


_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def _is_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")
