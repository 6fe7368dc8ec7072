"""Settings for the whole suite."""

from __future__ import annotations

from hypothesis import settings

# The property tests check plans, indexes and codecs, not speed: on a loaded CI machine one example
# can take longer than Hypothesis's default deadline (200 ms), which would fail a correct test.
settings.register_profile("truba", deadline=None)
settings.load_profile("truba")
