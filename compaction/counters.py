"""Counters kept as a dataclass of ints, added and subtracted field by field.

A report totals many of them (the store requests of several executors, gc's counts over partitions) with `+`
and `sum(..., Zero())`; `-` says what was counted since an earlier copy.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Self


class Counters:
    """Field-by-field `+` and `-` for a dataclass whose fields are all counters, in declaration order."""

    def __add__(self, other: Self) -> Self:
        """The sum of two counters, e.g. to total the stats of several executors."""
        return self._combined(other, operator.add)

    def __sub__(self, other: Self) -> Self:
        """What was counted since `other` (an earlier copy of the same counters)."""
        return self._combined(other, operator.sub)

    def _combined(self, other: Self, op: Callable[[Any, Any], Any]) -> Self:
        instance: Any = self
        return type(self)(*(op(getattr(self, f.name), getattr(other, f.name)) for f in fields(instance)))
