"""Hypothesis profiles for the property tests: ``ci`` (the default) and ``fuzz``.

``ci`` keeps the whole folder well under a minute on a two-core machine; ``fuzz`` (selected with
``HYPOTHESIS_PROFILE=fuzz``, as ``bench/fuzz.py`` does) tries many more inputs per property.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    max_examples=2_000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
