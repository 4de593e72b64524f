"""Shared fixtures. The SparkSession (spark/ tests) and the moto server (integration/) live in their own conftests."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".numba-cache"))

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("soak" if os.environ.get("KCOMPACT_SOAK") == "full" else "ci")
