"""Hidden checks of each lesson: call expressions whose expected values come from `solutions`.

Each lesson module here defines ``CASES: dict[str, list[Case | str]]``, keyed by the graded
function's name. ``python -m grader sync`` evaluates every expression on the reference code and
writes ``check(expression, <expected value as a literal>)`` into the hidden region of the
function's test cell, so the grading kernel never imports ``solutions``. A case with ``raises``
checks that bad input is refused: ``check_raises(expression, ValueError)``.

Portable truth: another CPU, BLAS, thread count or torch version (and a student's correct code
in another order) may round a float differently in its last bits. So a case whose result holds a
float that was rounded gets a tolerance, chosen from the numerics with a comment. Only values
that every correct implementation produces bit for bit are compared exactly: integers, bit
patterns, and floats that no rounding touched (small integers and halves from exact inputs, an
input picked by a maximum). A lesson module may also define ``EXACT: dict[str, str]``: graded
functions whose float results are exact by construction however long their mantissas, each
with the reason. ``tests/test_portability.py`` holds every case to this, moves every rounded
reference value by a few units in the last place, and checks that nothing changes.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from grader.common import syntax
from grader.common.errors import CourseError


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
        raises: the name of a built-in exception (``"ValueError"``) that the call must raise,
            as the exercise's text asks; the reference must raise it too. A subclass counts.
    """

    expression: str
    expected: str | None = None
    rel_tol: float = 0.0
    abs_tol: float = 0.0
    raises: str | None = None

    def __post_init__(self) -> None:
        if self.raises is None:
            return
        error = getattr(builtins, self.raises, None)
        if not (isinstance(error, type) and issubclass(error, Exception)):
            raise ValueError(f"Case.raises must name a built-in exception, got {self.raises!r}")
        if self.expected is not None or self.rel_tol or self.abs_tol:
            raise ValueError("a Case that raises has no expected value or tolerance")


def raises(expression: str, error: str) -> Case:
    """A check that ``expression`` raises the built-in exception named ``error``."""
    return Case(expression, raises=error)


def as_case(case: Case | str) -> Case:
    return case if isinstance(case, Case) else Case(case)


def reference_value(case: Case, namespace: dict) -> object:
    """What the reference code returns for ``case`` (which must not be a ``raises`` case).

    The one place where sync (the notebook's literals) and grading (the expected values)
    evaluate a case on the reference, so that a test can make both see what another machine
    would compute.
    """
    try:
        return syntax.evaluate(case.expression, dict(namespace))
    except Exception as error:
        raise CourseError(f"the check {case.expression!r} fails on the reference code: "
                          f"{type(error).__name__}: {error}") from error


def reference_raises(case: Case, namespace: dict) -> None:
    """Stop unless the reference code raises what ``case.raises`` names."""
    error = getattr(builtins, str(case.raises))
    try:
        value = syntax.evaluate(case.expression, dict(namespace))
    except error:
        return
    except Exception as other:
        raise CourseError(f"the check {case.expression!r} should raise {case.raises}, but the "
                          f"reference raises {type(other).__name__}: {other}") from other
    raise CourseError(f"the check {case.expression!r} should raise {case.raises}, but the "
                      f"reference returns {value!r:.100}")
