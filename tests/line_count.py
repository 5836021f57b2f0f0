"""Counting the Python lines a call runs in one module: a loop over elements shows up."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def lines_run(module: ModuleType, call: Callable[[], Any]) -> tuple[int, Any]:
    """How many lines of ``module``'s file ``call()`` executes, and what it returned."""
    lines = 0

    def count_lines(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename == module.__file__:
            lines += event == "line"
            return count_lines
        return None

    previous = sys.gettrace()
    sys.settrace(count_lines)
    try:
        result = call()
    finally:
        sys.settrace(previous)
    return lines, result
