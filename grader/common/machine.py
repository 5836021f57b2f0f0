"""What the machine the grader runs on offers it."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container's or a `taskset`'s
    share, not the machine's count), at least 1. macOS has no affinity: its count there."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
