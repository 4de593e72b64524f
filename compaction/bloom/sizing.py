"""How large a segment's filter is, derived from the data when `bloom.filter.fpp` is not set.

A clean segment holding none of a run's D dirty keys still tests positive with probability ~D·p for filters
of false-positive rate p; a filter costs 1.44·log2(1/p) bits per key, read every run. Per key of the clean
region, a run pays b(p) = 1.44·log2(1/p)/8 bytes of filter plus D·p·R bytes of needless segment reads (R: bytes
per key). That is smallest at p = 1.44 / (8·ln 2 · D·R) ≈ 0.26 / (D·R). Sized for runs that change up to 1% of
the partition's K keys (D = K/100), with K·R = B the partition's bytes: p = 26 / B. For a 1 GB partition
p = 2.6e-8 (4.5 bytes of filter per key); whatever B, the filters are ~1.44·log2(B/26)/8 bytes a key and the
needless reads stay near 0.1% of the clean region at D = 1% of the keys.
"""

from __future__ import annotations

MIN_FPP = 1e-9
MAX_FPP = 0.01


def filter_fpp(configured: float | None, partition_bytes: int) -> float:
    """The rate of the filters written for a partition of `partition_bytes`: `configured` if set, else 26 / B."""
    if configured is not None:
        return configured
    return min(MAX_FPP, max(MIN_FPP, 26.0 / max(1, partition_bytes)))


__all__ = ["MAX_FPP", "MIN_FPP", "filter_fpp"]
