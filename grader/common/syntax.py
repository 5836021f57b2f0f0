"""Python's ``ast.parse``, one thread at a time.

CPython 3.11 keeps the depth of the syntax tree it is building in state that its threads share,
so two threads parsing at once can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython#106905; seen here grading with ``--jobs 2`` on 3.11.7, where it sent an
honest submission to review as a grading error). The grader parses student code in several
threads at once; every parse goes through this lock. A parse takes milliseconds, so nothing
waits for long."""

from __future__ import annotations

import ast
import threading

_ONE_AT_A_TIME = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, holding the lock."""
    with _ONE_AT_A_TIME:
        return ast.parse(source)


def evaluate(expression: str, namespace: dict) -> object:
    """``eval(expression, namespace)``, parsed and compiled holding the lock (the code itself
    runs without it)."""
    with _ONE_AT_A_TIME:
        code = compile(ast.parse(expression, mode="eval"), "<expression>", "eval")
    return eval(code, namespace)


def execute(source: str, namespace: dict) -> None:
    """``exec(source, namespace)``, parsed and compiled holding the lock."""
    with _ONE_AT_A_TIME:
        code = compile(ast.parse(source), "<source>", "exec")
    exec(code, namespace)
