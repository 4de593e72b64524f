"""`KCOMPACT_PREBUILT_KERNELS_ONLY=1`: a kernel called with argument types that have no cached code raises."""

from __future__ import annotations

import numpy as np
import pytest

from compaction.format.scan_kernels import gather_ranges
from compaction.kernels.cache import PREBUILT_ONLY, KernelNotBuilt


def test_an_unbuilt_signature_raises_instead_of_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREBUILT_ONLY, "1")
    buf = np.zeros(8, np.uint8)
    narrow = np.zeros(2, np.int16)  # no run calls it with 16-bit positions, so build.py compiled none
    with pytest.raises(KernelNotBuilt, match=f"gather_ranges.*{PREBUILT_ONLY}=1"):
        gather_ranges(buf, buf, np.zeros(1, np.bool_), narrow, narrow, narrow)


def test_a_built_signature_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREBUILT_ONLY, "1")
    buf = np.arange(8, dtype=np.uint8)
    buf.setflags(write=False)
    positions = np.array([1, 4], np.int64)
    offsets, data = gather_ranges(buf, buf, np.zeros(1, np.bool_), np.zeros(2, np.int64), positions,
                                  np.array([2, 3], np.int64))
    assert offsets.tolist() == [0, 2, 5] and data.tolist() == [1, 2, 4, 5, 6]
