"""Hidden checks of each lesson: call expressions whose expected values come from `solutions`.

Each lesson module here defines ``CASES: dict[str, list[Case | str]]``, keyed by the graded
function's name. ``python -m grader sync`` evaluates every expression on the reference code and
writes ``check(expression, <expected value as a literal>)`` into the hidden region of the
function's test cell, so the grading kernel never imports ``solutions``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One hidden check.

    Args:
        expression: a call evaluated in the notebook's namespace, e.g. ``"decode(0x7C00, FP16)"``.
        expected: source of an oracle expression for the expected value, evaluated in the
            notebook (for values too large to write out, e.g. a tensor of 65536 floats). The
            reference code must agree with it when the notebook is synced. None: the expected
            value is the reference's result, written out as a literal.
        rel_tol, abs_tol: tolerances for floats and float tensors (0 means exact).
    """

    expression: str
    expected: str | None = None
    rel_tol: float = 0.0
    abs_tol: float = 0.0


def as_case(case: Case | str) -> Case:
    return case if isinstance(case, Case) else Case(case)
