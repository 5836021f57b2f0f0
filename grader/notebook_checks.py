# Checks for the exercises. `check("f(1, 2)", expected)` runs f(1, 2) and stops with a one-line
# message when the result differs from `expected`. Types are compared before values: a float
# must be a float, a tensor must have the expected dtype and shape, nan equals nan, -0.0 is not 0.0.
# `check_raises("f(-1)", ValueError)` passes when f(-1) raises a ValueError (or a subclass).
import math as _math
import sys as _sys

import torch as _torch


def check(expression: str, expected: object, *, rel_tol: float = 0.0, abs_tol: float = 0.0):
    """Evaluate ``expression`` in the notebook's namespace and compare it with ``expected``."""
    namespace = _sys._getframe(1).f_globals
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise AssertionError(f"{expression}: not implemented yet") from None
    except Exception as error:
        message = f"{expression} raised {type(error).__name__}: {error}"
        raise AssertionError(message) from error
    problem = _difference(got, expected, rel_tol, abs_tol)
    if problem is not None:
        raise AssertionError(f"{expression}: {problem}")


def check_raises(expression: str, error: type[Exception]):
    """Evaluate ``expression`` in the notebook's namespace; it must raise ``error``."""
    namespace = _sys._getframe(1).f_globals
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise AssertionError(f"{expression}: not implemented yet") from None
    except error:
        return
    except Exception as other:
        message = f"{expression}: expected {error.__name__}, got {type(other).__name__}: {other}"
        raise AssertionError(message) from other
    raise AssertionError(f"{expression}: expected {error.__name__}, got a result {got!r:.200}")


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _same_float(got: float, expected: float, rel_tol: float, abs_tol: float) -> bool:
    if _math.isnan(expected) or _math.isnan(got):
        return _math.isnan(expected) and _math.isnan(got)
    if rel_tol == 0.0 and abs_tol == 0.0:
        return got == expected and _math.copysign(1.0, got) == _math.copysign(1.0, expected)
    return _math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)


def _difference(got: object, expected: object, rel_tol: float, abs_tol: float) -> str | None:
    """None when ``got`` matches ``expected``, else what differs, in a few words."""
    # Exact type first: a subclass could redefine ==, so only the plain built-in types pass.
    if type(expected) is _torch.Tensor:
        return _tensor_difference(got, expected, rel_tol, abs_tol)
    if type(got) is not type(expected):
        return (
            f"expected {_type_name(expected)} {expected!r}, got {_type_name(got)} {got!r:.200}"
        )
    if type(expected) is float:
        if not _same_float(got, expected, rel_tol, abs_tol):
            return f"expected {expected!r}, got {got!r}"
        return None
    if type(expected) in (tuple, list):
        if len(got) != len(expected):
            return f"expected {len(expected)} items {expected!r}, got {len(got)} items {got!r}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = _difference(g, e, rel_tol, abs_tol)
            if problem is not None:
                return f"item {i}: {problem}"
        return None
    if type(expected) is dict:
        if list(got) != list(expected):
            return f"expected keys {list(expected)}, got keys {list(got)}"
        for key in expected:
            problem = _difference(got[key], expected[key], rel_tol, abs_tol)
            if problem is not None:
                return f"[{key!r}]: {problem}"
        return None
    if type(expected) in (int, bool, str, type(None)):
        return None if got == expected else f"expected {expected!r}, got {got!r}"
    raise TypeError(f"check() cannot compare values of type {_type_name(expected)}")


def _tensor_difference(got: object, expected, rel_tol: float, abs_tol: float) -> str | None:
    if type(got) is not _torch.Tensor:
        return f"expected a torch.Tensor, got {_type_name(got)}"
    if got.dtype != expected.dtype:
        return f"expected dtype {expected.dtype}, got {got.dtype}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if not (got.is_floating_point() or got.is_complex()):
        wrong = got != expected
    else:
        got64, expected64 = got.to(_torch.float64), expected.to(_torch.float64)
        nan_mismatch = got64.isnan() != expected64.isnan()
        both = ~(got64.isnan() | expected64.isnan())
        if rel_tol == 0.0 and abs_tol == 0.0:
            value_wrong = (got64 != expected64) | (got64.signbit() != expected64.signbit())
        else:
            limit = abs_tol + rel_tol * expected64.abs()
            value_wrong = ~((got64 == expected64) | ((got64 - expected64).abs() <= limit))
        wrong = nan_mismatch | (both & value_wrong)
    n_wrong = int(wrong.sum())
    if n_wrong == 0:
        return None
    first = tuple(int(i) for i in wrong.nonzero()[0])
    return (
        f"{n_wrong} of {expected.numel()} values differ; at index {first} expected "
        f"{expected[first].item()!r}, got {got[first].item()!r}"
    )
