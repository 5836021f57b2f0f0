"""Hypothesis profiles.

``make test`` (and CI) uses ``repeatable``: the property tests draw the same examples on every run,
so a submission's result does not depend on luck. ``HYPOTHESIS_PROFILE=explore make test`` draws
fresh examples each run, to look for new failures; record any it finds as an ``@example``.
"""

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
