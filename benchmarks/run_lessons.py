"""Run the instructor version of each lesson on this machine and say what it did.

    python benchmarks/run_lessons.py [LESSON ...] [--grading] [--out DIR]

For each lesson (all of them by default) the notebook with its solutions runs end to end in a
fresh kernel, as an instructor's Run All does before class (``--grading`` sets
NBGRADER_EXECUTION as nbgrader does, so the demo cells do less work, and makes figures without
drawing them, as Validate and the grader do). The report gives the
wall time, how many exercises' visible checks passed, every error with the cell it came from,
and the text printed by the cells that behave differently on a GPU (those that mention CUDA), so
that a run on a machine with a GPU shows what its students will see there. ``--out`` keeps the
executed notebooks, outputs and plots (drawn unless ``--grading``) included, for reading
afterwards.

A script for checking the course on new hardware, not a test: it prints and asserts nothing; it
exits 1 when a lesson raised an error, so that a script calling it can tell.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from grader.lab.progress import execute

REPO = Path(__file__).resolve().parent.parent
PASSED = "all visible checks passed"
RECORDED = "recorded; graded when you hand in"  # a graded prediction's check


def text_of(cell: nbformat.NotebookNode) -> str:
    """What a code cell printed: its streams and the plain text of its results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.get("data", {}).get("text/plain", "") + "\n")
    return "".join(parts)


def run(notebook: Path, grading: bool, out: Path | None) -> bool:
    """Execute one notebook and print its report; True when no cell raised."""
    nb = nbformat.read(notebook, as_version=4)
    start = time.perf_counter()
    ok = True
    try:
        # allow_errors: run every cell, so one failure does not hide the rest of the lesson.
        execute(nb, notebook.parent, "validate" if grading else None, 600, allow_errors=True)
    except (CellTimeoutError, DeadKernelError) as error:  # a cell timed out, the kernel died
        print(f"  the run stopped: {type(error).__name__}: {(str(error) or '?').splitlines()[0]}")
        ok = False
    seconds = time.perf_counter() - start
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    errors = [(i, o) for i, c in code for o in c.get("outputs", []) if o.output_type == "error"]
    passed = sum(PASSED in text_of(c) or RECORDED in text_of(c) for _, c in code)
    tests = sum(bool(c.metadata.get("nbgrader", {}).get("grade")) for _, c in code)
    images = sum("image/png" in o.get("data", {}) for _, c in code for o in c.get("outputs", []))
    print(f"  {seconds:.1f} s; visible checks passed (or prediction recorded) for {passed} of "
          f"{tests} exercises; {images} plots; {len(errors)} errors")
    for index, error in errors:
        print(f"  ERROR in cell {index}: {error.ename}: {error.evalue}")
    for index, cell in code:
        if "cuda" in cell.source.lower() and text_of(cell).strip():
            shown = "\n".join("    | " + line for line in text_of(cell).strip().splitlines()[:30])
            print(f"  cell {index} (a cell that uses the GPU when there is one) printed:\n{shown}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / notebook.name)
    return ok and not errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson folders' names (default: all)")
    parser.add_argument("--grading", action="store_true",
                        help="run as nbgrader does (NBGRADER_EXECUTION set: smaller demos)")
    parser.add_argument("--out", type=Path, help="a folder for the executed notebooks")
    args = parser.parse_args()
    folders = sorted(p for p in (REPO / "notebooks").iterdir() if p.is_dir())
    if args.lessons:
        unknown = set(args.lessons) - {f.name for f in folders}
        if unknown:
            sys.exit(f"no such lesson: {', '.join(sorted(unknown))}; "
                     f"the lessons are {', '.join(f.name for f in folders)}")
        folders = [f for f in folders if f.name in args.lessons]

    import torch  # after the argument check: a typo should not wait for torch to load

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"python {platform.python_version()}, torch {torch.__version__}, GPU: {gpu}, "
          f"{os.cpu_count()} CPUs, {'grading' if args.grading else 'lecture'} mode")
    ok = True
    for folder in folders:
        print(f"\n{folder.name}")
        ok &= run(next(folder.glob("*.ipynb")), args.grading, args.out)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
