"""The error a command ends with when it cannot do its job: a message for the user, no
traceback (grader/cli/ prints it and exits 2)."""

from __future__ import annotations


class CourseError(Exception):
    """A problem the user can fix; the command line prints its message and exits with 2."""
