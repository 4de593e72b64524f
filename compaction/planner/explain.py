"""Why a partition is or is not cleaned, in words, and the number formats of plan output.

A reason never just says "no": a partition below the ratio says how many more cleanable bytes would
make it eligible and when max.compaction.lag.ms would force it; one held back says by what (the min lag
with the time it passes, an open transaction, a clean log) and when that changes. Pure.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from compaction.config import LONG_MAX, TopicConfig
from compaction.planner.regions import Decision, Regions, UncleanableBound

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC (`2024-05-01T12:00:00.250Z`), or `<ms> ms` if out of range."""
    try:
        t = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms} ms"
    millis = f".{ms % 1000:03d}" if ms % 1000 else ""
    return t.strftime("%Y-%m-%dT%H:%M:%S") + millis + "Z"


def duration(ms: int) -> str:
    """A duration like `1d 2h 3m 4s 5ms`; `unbounded` for Long.MAX_VALUE."""
    if ms >= LONG_MAX:
        return "unbounded"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return sign + (" ".join(parts) or "0ms")


def byte_size(n: int) -> str:
    """`812 B`, `1.5 KiB`, `3.0 MiB`, `1.2 GiB`."""
    if abs(n) < 1024:
        return f"{n} B"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    raise AssertionError("unreachable")


def ratios(ratio: float, threshold: float) -> tuple[str, str]:
    """Both ratios with 2 decimals, or 6 where 2 would make different values look equal."""
    a, b = f"{ratio:.2f}", f"{threshold:.2f}"
    return (f"{ratio:.6f}", f"{threshold:.6f}") if a == b and ratio != threshold else (a, b)


def more_bytes_needed(clean: int, cleanable: int, threshold: float) -> int | None:
    """The fewest extra cleanable bytes d with (cleanable + d) / (clean + cleanable + d) > threshold.

    None if no amount will do (threshold >= 1).
    """
    if threshold >= 1:
        return None

    def enough(d: int) -> bool:
        return (cleanable + d) / (clean + cleanable + d) > threshold if clean + cleanable + d else False

    d = max(int((threshold * (clean + cleanable) - cleanable) / (1 - threshold)), 0)
    while not enough(d):
        d += 1
    while d > 0 and enough(d - 1):
        d -= 1
    return d


def reason(regions: Regions, config: TopicConfig, decision: Decision) -> str:
    """Why `decision` (taken without --force) was taken for a partition with `regions`."""
    text = {
        Decision.MUST_CLEAN: _must_clean,
        Decision.DIRTY_RATIO: _dirty_ratio,
        Decision.BELOW_RATIO: _below_ratio,
    }.get(decision, _nothing_cleanable)(regions, config)
    if regions.checkpoint_reset:
        text += (
            f"; cleaner checkpoint {regions.checkpoint} is outside the log [{regions.log_start_offset}, "
            f"{regions.log_end_offset}] and is reset to the log start"
        )
    return text


def _cleanable(regions: Regions) -> str:
    n = regions.cleanable_segment_count
    return (
        f"{byte_size(regions.cleanable_bytes)} cleanable in {n} segment{'s' * (n != 1)} "
        f"[{regions.first_dirty_offset}, {regions.first_uncleanable_offset})"
    )


def _must_clean(regions: Regions, config: TopicConfig) -> str:
    r, m = ratios(regions.dirty_ratio, config.min_cleanable_dirty_ratio)
    if regions.dirty_ratio > config.min_cleanable_dirty_ratio:
        ratio = f"dirty ratio {r} > min.cleanable.dirty.ratio {m} too"
    else:
        ratio = f"dirty ratio {r} ≤ min.cleanable.dirty.ratio {m} alone would not qualify"
    return (
        f"must clean: the oldest dirty batch ({timestamp(regions.earliest_dirty_batch_ms or 0)}) is "
        f"{duration(regions.max_compaction_delay_ms)} past max.compaction.lag.ms "
        f"{duration(config.max_compaction_lag_ms)}; {_cleanable(regions)}; {ratio}"
    )


def _dirty_ratio(regions: Regions, config: TopicConfig) -> str:
    r, m = ratios(regions.dirty_ratio, config.min_cleanable_dirty_ratio)
    return f"eligible: dirty ratio {r} > min.cleanable.dirty.ratio {m}; {_cleanable(regions)}"


def _below_ratio(regions: Regions, config: TopicConfig) -> str:
    r, m = ratios(regions.dirty_ratio, config.min_cleanable_dirty_ratio)
    head = f"not eligible: dirty ratio {r} ≤ min.cleanable.dirty.ratio {m}; "
    need = more_bytes_needed(regions.clean_bytes, regions.cleanable_bytes, config.min_cleanable_dirty_ratio)
    by_ratio = None if need is None else f"eligible after ~{byte_size(need)} more cleanable bytes{_held_back(regions)}"
    by_lag = _max_lag_due(regions, config)
    if by_ratio and by_lag:
        return f"{head}{by_ratio}, or {by_lag}"
    if by_ratio:
        return f"{head}{by_ratio} ({_no_max_lag(config)})"
    if by_lag:
        return f"{head}no ratio exceeds {m}: eligible only {by_lag}"
    return f"{head}no ratio exceeds {m} and {_no_max_lag(config)}: only --force will clean it"


def _held_back(regions: Regions) -> str:
    if regions.uncleanable_bytes <= 0 or regions.uncleanable_bound is UncleanableBound.LOG_END:
        return ""
    return f" ({byte_size(regions.uncleanable_bytes)} tiered above it wait for the {regions.uncleanable_bound.value})"


def _max_lag_due(regions: Regions, config: TopicConfig) -> str | None:
    lag, earliest = config.max_compaction_lag_ms, regions.earliest_dirty_batch_ms
    if earliest is None or lag >= LONG_MAX:
        return None
    return (
        f"when the oldest dirty batch ({timestamp(earliest)}) passes max.compaction.lag.ms {duration(lag)} "
        f"at {timestamp(earliest + lag + 1)}"
    )


def _no_max_lag(config: TopicConfig) -> str:
    if config.max_compaction_lag_ms >= LONG_MAX:
        return "max.compaction.lag.ms is not set"
    return "no dirty segment records a first-batch timestamp for max.compaction.lag.ms"


def _nothing_cleanable(regions: Regions, config: TopicConfig) -> str:
    n = regions.dirty_segment_count
    segs = f"{n} dirty segment{'s' * (n != 1)}"
    bound = regions.uncleanable_bound
    if regions.first_dirty_offset >= regions.log_end_offset:
        text = (
            f"not eligible: nothing dirty, all of [{regions.log_start_offset}, {regions.log_end_offset}) "
            "is clean; data tiered from now on will be dirty"
        )
    elif regions.cleanable_segment_count > 0:
        text = (
            f"not eligible: the cleanable segments [{regions.first_dirty_offset}, "
            f"{regions.first_uncleanable_offset}) hold 0 bytes"
        )
    elif bound is UncleanableBound.MIN_COMPACTION_LAG:
        when = timestamp(regions.next_cleanable_at_ms or 0)
        text = (
            f"not eligible: all {segs} are younger than min.compaction.lag.ms "
            f"{duration(config.min_compaction_lag_ms)} (next becomes cleanable at {when})"
        )
    elif bound is UncleanableBound.FIRST_UNSTABLE_OFFSET:
        text = (
            f"not eligible: a transaction tiered without its marker starts at offset "
            f"{regions.first_uncleanable_dirty_offset} (first unstable offset) and holds back all {segs}; "
            "they become cleanable once its marker is tiered"
        )
    else:
        text = f"not eligible: no cleanable bytes in [{regions.first_dirty_offset}, {regions.first_uncleanable_offset})"
    if regions.must_clean:
        text += f"; max.compaction.lag.ms is exceeded by {duration(regions.max_compaction_delay_ms)}, but to no avail"
    return text
