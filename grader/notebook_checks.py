# Checks for the exercises. `check("f(1, 2)", expected)` runs f(1, 2) and stops with a one-line
# message when the result differs from `expected`. Types are compared before values: a float
# must be a float, a tensor must have the expected dtype and shape, nan equals nan, -0.0 is not 0.0.
# `check_raises("f(-1)", ValueError)` passes when f(-1) raises a ValueError (or a subclass).
# A cell that calls an exercise not done yet says which one to finish, in one line.
# `check_prediction("my_guess", sealed)` says how close your prediction is, without showing the
# answer in the cell (it is sealed: packed, not written out).
import base64 as _base64
import json as _json
import math as _math
import re as _re
import sys as _sys
import zlib as _zlib

import torch as _torch
from IPython import get_ipython as _get_ipython

# The parts of a tuple an exercise returns, so that a message can name the one that differs.
_FIELDS = {
    "split_bits": ("sign", "exponent", "mantissa"),
    "transpose": ("shape", "strides"), "permute": ("shape", "strides"),
    "slice_dim": ("shape", "strides", "offset"),
    "two_layer_forward_backward": ("loss", "grad_w1", "grad_w2"),
    "quantize_blockwise": ("q", "scales"),
    "loss_scale_update": ("scale", "growth_tracker"),
    "ring_all_reduce": ("results", "bytes_sent"),
}


class CheckFailed(AssertionError):
    """A check that failed: shown as its one line, without the checker's own frames."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {self}"]


def check(expression: str, expected: object, *, rel_tol: float = 0.0, abs_tol: float = 0.0):
    """Evaluate ``expression`` in the notebook's namespace and compare it with ``expected``."""
    namespace = _sys._getframe(1).f_globals
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise CheckFailed(f"{expression}: not implemented yet") from None
    except Exception as error:
        raise CheckFailed(f"{expression} raised {_raised(error)}") from None
    problem = _difference(got, expected, rel_tol, abs_tol)
    if problem is not None:
        raise CheckFailed(f"{expression}: {_name_items(expression, problem)}")


def check_raises(expression: str, error: type[Exception]):
    """Evaluate ``expression`` in the notebook's namespace; it must raise ``error``."""
    namespace = _sys._getframe(1).f_globals
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise CheckFailed(f"{expression}: not implemented yet") from None
    except error:
        return
    except Exception as other:
        raise CheckFailed(f"{expression}: expected {error.__name__}, got {_raised(other)}") \
            from None
    raise CheckFailed(f"{expression}: expected {error.__name__}, got a result {got!r:.200}")


def check_prediction(name: str, sealed: str, *, rel_tol: float = 0.25) -> None:
    """Say whether the number you predicted, ``name``, is within ``rel_tol`` of the answer; the
    answer stays sealed until you have committed to yours."""
    namespace = _sys._getframe(1).f_globals
    guess = namespace.get(name)
    if type(guess) not in (int, float) or not _math.isfinite(guess):
        raise CheckFailed(f"{name}: write your prediction as a number first (got {guess!r:.60})")
    answer = _unseal(sealed)
    if _math.isclose(guess, answer, rel_tol=rel_tol):
        print(f"{name} = {guess:g}: within {rel_tol:.0%} of the answer. Well predicted.")
    else:
        side = "above" if guess > answer else "below"
        print(f"{name} = {guess:g}: {side} the answer by more than {rel_tol:.0%}. The next cells "
              "show why; keep your number, and compare.")


def check_choice(name: str, sealed: str) -> None:
    """Say whether the option you chose, ``name`` (a letter), is the right one."""
    namespace = _sys._getframe(1).f_globals
    choice = namespace.get(name)
    if type(choice) is not str or not choice.strip():
        raise CheckFailed(f"{name}: write your choice as a letter first (got {choice!r:.60})")
    right = choice.strip().lower() == _unseal(sealed)
    print(f"{name} = {choice!r}: " + ("right." if right else "not this one. The next cells show "
                                      "which, and why."))


def seal(answer: object) -> str:
    """Pack an answer so that a cell does not show it (not a secret: a student can unpack it)."""
    return _base64.b64encode(_zlib.compress(_json.dumps(answer).encode())).decode()


def _unseal(sealed: str) -> object:
    return _json.loads(_zlib.decompress(_base64.b64decode(sealed)))


def _raised(error: BaseException) -> str:
    """``ValueError: message (in decode, line 7 of its cell)``: the error and where in the
    notebook's own code it was raised."""
    where, tb = "", error.__traceback__
    own = (check.__code__, check_raises.__code__)
    while tb is not None:
        code = tb.tb_frame.f_code
        if (tb.tb_frame.f_globals is _sys._getframe(0).f_globals and code not in own
                and code.co_name != "<module>"):
            where = f" (in {code.co_name}, line {tb.tb_lineno} of its cell)"
        tb = tb.tb_next
    return f"{type(error).__name__}: {error}{where}"


def _name_items(expression: str, problem: str) -> str:
    """``item 1: ...`` as ``item 1 (exponent): ...`` where the exercise's result has names."""
    called = _re.match(r"\s*(\w+)\(", expression)
    fields = _FIELDS.get(called.group(1)) if called else None
    item = _re.match(r"item (\d+): ", problem)
    if fields and item and int(item.group(1)) < len(fields):
        index = int(item.group(1))
        return f"item {index} ({fields[index]}): {problem[item.end():]}"
    return problem


def _not_done(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for NotImplementedError: name the exercise to finish first, in one
    line, when the error comes from a function of this notebook; else the usual traceback.
    IPython ignores what the handler returns, so it shows the lines itself."""
    name, step, innermost = None, tb, None
    while step is not None:
        frame = step.tb_frame
        if frame.f_globals is shell.user_ns and frame.f_code.co_name != "<module>":
            owner = frame.f_locals.get("self")  # a method: name its class too
            name = (f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None
                    else frame.f_code.co_name)
        innermost, step = frame, step.tb_next
    in_the_cell = (innermost is not None and innermost.f_globals is shell.user_ns
                   and innermost.f_code.co_name == "<module>")
    if str(value) or (name is None and not in_the_cell):
        lines = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset)
    elif in_the_cell:  # the cell itself: a prediction or an answer to write in
        lines = ["\x1b[0;31mNotImplementedError\x1b[0m: this cell is yours to fill in: replace "
                 "`raise NotImplementedError()` with your answer, then run it again"]
    else:
        lines = [f"\x1b[0;31mNotImplementedError\x1b[0m: `{name}` is an exercise not done "
                 "yet: finish it above (its checks pass), then run this cell again"]
    shell._showtraceback(etype, value, lines)


if _get_ipython() is not None:  # in a notebook, not imported as a module
    _get_ipython().set_custom_exc((NotImplementedError,), _not_done)


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
