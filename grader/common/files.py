"""Files the grader removes: a folder however deep its tree."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Remove a folder however deep its tree (shutil.rmtree recurses in Python, and raises
    RecursionError on a tree deeper than about a thousand folders)."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False,
                       capture_output=True)
