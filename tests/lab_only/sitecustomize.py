"""Python as a student's `make lab` leaves it: the packages of the grading and test groups
(pyproject.toml's `grade` and `dev`) cannot be imported, though this environment has them.

tests/test_lab.py puts this folder first on PYTHONPATH for a lab it starts, so that every
Python of that lab (the command, its JupyterLab server, Validate's kernels) imports nothing a
student's environment lacks: an import of one of them fails as it would there.
"""

import sys

HIDDEN = {"celery", "kombu", "redis", "psycopg", "psycopg_binary", "nh3", "latex2mathml",
          "copydetect", "pytest", "_pytest", "xdist", "hypothesis", "playwright", "jupyterhub",
          "ruff", "jupytext"}


class _Hidden:
    """A finder in front of another that finds nothing of ``HIDDEN``."""

    def __init__(self, finder: object) -> None:
        self.finder = finder

    def find_spec(self, name: str, path=None, target=None):
        if name.partition(".")[0] in HIDDEN or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.finder, attribute)


sys.meta_path[:] = [_Hidden(finder) for finder in sys.meta_path]
