# Checks for the exercises. `check("f(1, 2)", expected)` runs f(1, 2) and stops with a one-line
# message when the result differs from `expected`. Types are compared before values: a float
# must be a float, a tensor must have the expected dtype and shape, nan equals nan, -0.0 is not 0.0.
# `check_raises("f(-1)", ValueError)` passes when f(-1) raises a ValueError (or a subclass).
# A cell that calls an exercise not done yet says which one to finish, in one line.
# `check_prediction("my_guess", sealed)` says how close your prediction is, without showing the
# answer in the cell (it is sealed: packed, not written out); a graded prediction's check says
# only that your number is in: it is graded against your own numbers (`your_variant`), once
# handed in. `compare_prediction("my_guess", measured)` sets it beside a measurement. Run first,
# this cell says whose numbers the notebook uses, and makes a cell run too early, an exercise
# not done yet or the stop button say so in one line (the lab's kernels do that from their start,
# so that a cell run after a restart says so too).
import base64 as _base64
import json as _json
import math as _math
import os as _os
import re as _re
import sys as _sys
import zlib as _zlib

from IPython import get_ipython as _get_ipython

# How a student sets their id: one instruction, word for word the same in the README, the
# student's guide, the top of each lesson (this cell), `make lab` and the hub's guide.
SET_YOUR_ID = ("To use your own numbers, start the lab with your student id and the code your "
               "instructor gives you: make lab STUDENT=your-id CODE=your-code (on your course's "
               "JupyterHub they are set for you).")

# The parts of a tuple an exercise returns, so that a message can name the one that differs.
_FIELDS = {
    "split_bits": ("sign", "exponent", "mantissa"),
    "transpose": ("shape", "strides"), "permute": ("shape", "strides"),
    "slice_dim": ("shape", "strides", "offset"),
    "two_layer_forward_backward": ("loss", "grad_w1", "grad_w2"),
    "quantize_blockwise": ("q", "scales"),
    "loss_scale_update": ("scale", "growth_tracker"),
    "ring_all_reduce": ("results", "bytes_sent"),
    "compute_optimal": ("n_opt", "d_opt"), "lifetime_optimal": ("n_params", "n_tokens"),
    "run_cost": ("dollars", "kwh", "tonnes_co2"),
}
# Exercises that return a bit pattern: a message writes it in hex, as the lessons do (0x3F80).
_BIT_PATTERNS = {"encode"}


class CheckFailed(AssertionError):
    """A check that failed: shown as its one line, without the checker's own frames."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {self}"]


def check(expression: str, expected: object, *, rel_tol: float = 0.0, abs_tol: float = 0.0,
          tried: str = ""):
    """Evaluate ``expression`` in the notebook's namespace and compare it with ``expected``.
    ``tried`` says in words what the expression tries, for a message where its code would say
    less (a call wrapped in a lambda to set a gradient first)."""
    namespace = _sys._getframe(1).f_globals
    said = tried or expression
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise CheckFailed(f"{said}: not implemented yet") from None
    except NameError as error:
        raise CheckFailed(_undefined(expression, error) if not tried else
                          f"{said} raised {_raised(error)}") from None
    except Exception as error:
        raise CheckFailed(f"{said} raised {_raised(error)}") from None
    problem = _difference(got, expected, rel_tol, abs_tol)
    called = _re.match(r"\s*(\w+)\(", expression)
    if problem is not None and called and called.group(1) in _BIT_PATTERNS \
            and type(got) is int and type(expected) is int:
        problem = f"expected {expected:#X} ({expected}), got {got:#X} ({got})".replace("0X", "0x")
    if problem is not None:
        raise CheckFailed(f"{said}: {_name_items(expression, problem)}")


def check_raises(expression: str, error: type[Exception]):
    """Evaluate ``expression`` in the notebook's namespace; it must raise ``error``."""
    namespace = _sys._getframe(1).f_globals
    try:
        got = eval(expression, namespace)
    except NotImplementedError:
        raise CheckFailed(f"{expression}: not implemented yet") from None
    except error:
        return
    except NameError as other:
        raise CheckFailed(_undefined(expression, other)) from None
    except Exception as other:
        raise CheckFailed(f"{expression}: expected {error.__name__}, got {_raised(other)}") \
            from None
    raise CheckFailed(f"{expression}: expected {error.__name__}, got a result {got!r:.200}")


def check_prediction(name: str, sealed: str | None = None, *, rel_tol: float = 0.25,
                     graded: bool = False) -> None:
    """Say whether the number you predicted, ``name``, is within ``rel_tol`` of the answer; the
    answer stays sealed until you have committed to yours. A graded prediction's check holds no
    answer: it says your number is in (a number, not how close), and grading compares it with
    the answer for your own numbers (the feedback page shows both)."""
    namespace = _sys._getframe(1).f_globals
    guess = namespace.get(name)
    if guess is None or guess is Ellipsis:
        if graded:  # its test cell: not done yet, as an exercise whose code is still to write
            raise CheckFailed(f"{name}: not done yet: write your prediction as a number in the "
                              "cell above, run it, then run this cell")
        print("No prediction yet: write your number in place of None and run this cell again.")
        return
    if type(guess) not in (int, float) or not _math.isfinite(guess):
        raise CheckFailed(f"{name}: write your prediction as a number (got {guess!r:.60})")
    shown = f"{name} = {readable(guess)}"
    if graded:
        _verdict(f"{shown}: recorded; graded when you hand in: within {rel_tol:.0%} of the "
                 "answer for your numbers earns its point (only grading knows that answer), and "
                 "your feedback shows it. The next cells show why; keep your number, and "
                 "compare.", "in")
        return
    answer = _unseal(sealed)
    if _math.isclose(guess, answer, rel_tol=rel_tol):
        print(f"{shown}: within {rel_tol:.0%} of the answer. Well predicted.")
    else:
        side = "above" if guess > answer else "below"
        print(f"{shown}: {side} the answer by more than {rel_tol:.0%}. The next cells show why; "
              "keep your number, and compare.")


_said_default = False  # the note that no student id is set: once per kernel


def your_variant(exercise: str, names: tuple, choices: list, words: str):
    """Your own numbers for the graded prediction ``exercise``: the choice drawn for your
    student id (which the lab or the hub gives this kernel in ``CTC_VARIANTS``), shown in plain
    words and returned (one value, or a tuple for several names). Without an id, the first
    choice: the course's default, which the text around it describes."""
    global _said_default
    try:
        given = _json.loads(_os.environ.get("CTC_VARIANTS") or "{}")
        student, index = given.get("student"), given.get("draws", {}).get(exercise, 0)
        course = given.get("course", "")
    except (ValueError, AttributeError):
        student, index, course = None, 0, ""
    if type(student) is not str or type(index) is not int or not 0 <= index < len(choices):
        student, index = None, 0
    course = course if type(course) is str and student is not None else ""
    values = tuple(choices[index])
    text = words.format(**dict(zip(names, values, strict=True)))
    if student is not None:
        line = f"Your numbers (drawn for {student}): {text}"
    else:
        line = f"Your numbers: {text}"
        if not _said_default:
            line += ("\n(No student id is set, so these are the course's default numbers, "
                     f"which the text above describes: fine for self-study. {SET_YOUR_ID})")
            _said_default = True
    from IPython.display import publish_display_data

    publish_display_data({"text/plain": line}, metadata={"counting_the_cost": {"variant": {
        "exercise": exercise, "student": student, "index": index, "course": course[:40]}}})
    return values[0] if len(values) == 1 else values


def compare_prediction(name: str, measured: float, *, unit: str = "") -> None:
    """Print your prediction ``name`` beside what the cell measured, and how far apart they
    are (for predictions of a measurement, whose answer no one knows before the run)."""
    namespace = _sys._getframe(1).f_globals
    guess = namespace.get(name)
    got = f"measured {readable(measured)}{unit}"
    if guess is None or guess is Ellipsis:
        print(f"{got}; no prediction yet: write yours in the cell above, and compare.")
    elif type(guess) not in (int, float) or not _math.isfinite(guess) or measured == 0:
        print(f"{got}; your prediction {guess!r:.60} is not a number to compare with it.")
    else:
        ratio = guess / measured
        how = ("within 10% of it. Well predicted." if abs(ratio - 1) <= 0.1 else
               f"{ratio:.2g} times the measurement." if ratio > 1 else
               f"{1 / ratio:.2g} times smaller than the measurement." if ratio > 0 else
               "of the other sign.")
        print(f"{got}; your prediction, {readable(guess)}{unit}, is {how}")


def check_choice(name: str, sealed: str) -> None:
    """Say whether the option you chose, ``name`` (a letter), is the right one."""
    namespace = _sys._getframe(1).f_globals
    choice = namespace.get(name)
    if choice is None or choice is Ellipsis:
        print("No prediction yet: write your letter in place of None and run this cell again.")
        return
    if type(choice) is not str or not choice.strip():
        raise CheckFailed(f"{name}: write your choice as a letter (got {choice!r:.60})")
    right = choice.strip().lower() == _unseal(sealed)
    print(f"{name} = {choice!r}: " + ("right." if right else "not this one. The next cells show "
                                      "which, and why."))


def readable(x: float) -> str:
    """A number as people write it: 18,874,368, 295.3, 0.0123, 1.5e-08."""
    if type(x) is int or (type(x) is float and x.is_integer() and abs(x) < 1e18):
        return f"{int(x):,}"
    if x != 0 and not 1e-4 <= abs(x) < 1e18:
        return f"{x:.3g}"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _verdict(line: str, verdict: str) -> None:
    """Show ``line`` as a cell's output, marked with ``verdict`` for Validate's summary (which
    reads the mark; the student sees the line)."""
    from IPython.display import publish_display_data

    publish_display_data({"text/plain": line},
                         metadata={"counting_the_cost": {"verdict": verdict}})


def seal(answer: object) -> str:
    """Pack an answer so that a cell does not show it (not a secret: a student can unpack it)."""
    return _base64.b64encode(_zlib.compress(_json.dumps(answer).encode())).decode()


def _unseal(sealed: str) -> object:
    return _json.loads(_zlib.decompress(_base64.b64decode(sealed)))


def _undefined(expression: str, error: NameError) -> str:
    """A check of a name that is not defined: its cell has not run, or raised (a SyntaxError
    stops a cell before it defines anything); a NameError inside the student's own function
    is that function's error."""
    if error.__traceback__ is not None and error.__traceback__.tb_next is not None \
            and error.__traceback__.tb_next.tb_next is not None:  # raised inside a function
        return f"{expression} raised {_raised(error)}"
    return (f"{expression}: `{getattr(error, 'name', None) or error}` is not defined: run "
            "the cell that defines it (if it shows an error, a SyntaxError for one, fix that "
            "first)")


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


def _own_frames(shell, tb):
    """The frames of ``tb`` that run the notebook's own code (its cells and the functions
    defined in them), outermost first."""
    frames = []
    while tb is not None:
        if tb.tb_frame.f_globals is shell.user_ns:
            frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _where(frames, shell=None) -> str:
    """`` (in MoELayer.forward, line 37 of cell [21])`` for the innermost function of the
    notebook's own code (a method with its class; the cell by the number Jupyter shows beside
    it, where IPython knows it), or the line of the cell itself."""
    for frame, line in reversed(frames):
        name = frame.f_code.co_name
        if name != "<module>":
            owner = frame.f_locals.get("self") if frame.f_code.co_argcount else None
            if owner is not None and callable(getattr(type(owner), name, None)):
                name = f"{type(owner).__name__}.{name}"
            filenames = getattr(getattr(shell, "compile", None), "_filename_map", {})
            number = filenames.get(frame.f_code.co_filename)
            cell = f"cell [{number}]" if number is not None else "its cell"
            return f" (in {name}, line {line} of {cell})"
    return f" (line {frames[-1][1]} of this cell)" if frames else ""


_RUN_ABOVE = "Run the cells above first (Run > Run All Above Selected Cell)"


def _one_line(shell, etype, value, tb) -> list[str] | None:
    """One line for three errors a student meets while working through a lesson, where the
    usual traceback says nothing more (None for any other error, which keeps it):
    - NotImplementedError from a function of this notebook: name the exercise to finish;
    - NameError of a name the notebook's code reads: in a kernel that has not run the cells
      above (it restarted, or has just started), say so; in the cell's own code, a cell run
      before the ones above it (running ahead); in a function, say where, and what to run or
      check;
    - KeyboardInterrupt (the stop button): say where the cell was stopped, and that a Run All
      stops there."""
    frames = _own_frames(shell, tb)
    innermost = frames[-1][0] if frames else None
    raised_here = innermost is not None and tb is not None and _innermost(tb) is innermost
    # The cell's own code: its module, and the generator expressions, comprehensions and
    # lambdas in it (their frames have the cell's file and a name in <...>).
    in_the_cell = raised_here and innermost.f_code.co_filename == frames[0][0].f_code.co_filename \
        and innermost.f_code.co_name.startswith("<")
    if issubclass(etype, NotImplementedError) and not str(value):
        functions = [f for f, _ in frames if not f.f_code.co_name.startswith("<")]
        if functions:
            owner = functions[-1].f_locals.get("self")  # a method: name its class too
            name = functions[-1].f_code.co_name
            name = f"{type(owner).__name__}.{name}" if owner is not None else name
            return [f"\x1b[0;31mNotImplementedError\x1b[0m: `{name}` is an exercise not done "
                    "yet: finish it above (its checks pass), then run this cell again"]
        if in_the_cell:  # the cell itself: a prediction or an answer to write in
            return ["\x1b[0;31mNotImplementedError\x1b[0m: this cell is yours to fill in: "
                    "replace `raise NotImplementedError()` with your answer, then run it again"]
    elif issubclass(etype, NameError) and not issubclass(etype, UnboundLocalError) \
            and raised_here and getattr(value, "name", None):
        name = f"\x1b[0;31mNameError\x1b[0m: `{value.name}` is not defined"
        if "CheckFailed" not in shell.user_ns:  # the checks cell, near the top, has not run
            return [f"{name}: the kernel restarted (or has just started), so the cells above "
                    f"have not run in it. {_RUN_ABOVE}, then this one"]
        if in_the_cell:
            return [f"{name} yet: it comes from a cell above this one. {_RUN_ABOVE}, then "
                    "this one"]
        return [f"{name}{_where(frames, shell)}: if a cell above defines it, run them first "
                "(Run > Run All Above Selected Cell); if not, check its spelling"]
    elif issubclass(etype, KeyboardInterrupt):
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted{_where(frames, shell)}; "
                "a Run All stops here, and the cells below have not run (Run > Run Selected "
                "Cell and All Below goes on from this one)"]
    return None


def _innermost(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


def _install_one_line_errors(shell) -> None:
    """Show the errors of ``_one_line`` in one line wherever IPython shows a traceback: a
    cell's, and a widget's callback or output (ipywidgets calls ``showtraceback`` too). Run
    again, it replaces its own wrapper, never wraps it twice."""
    plain = getattr(shell.showtraceback, "_plain", shell.showtraceback)

    def showtraceback(exc_tuple=None, filename=None, tb_offset=None, exception_only=False,
                      running_compiled_code=False):
        lines = None
        try:
            etype, value, tb = shell._get_exc_info(exc_tuple)
            if not exception_only:
                lines = _one_line(shell, etype, value, tb)
        except Exception:  # never lose the error itself: IPython shows it as usual
            lines = None
        if lines is None:
            return plain(exc_tuple, filename, tb_offset, exception_only, running_compiled_code)
        shell._showtraceback(etype, value, lines)
        return None

    showtraceback._plain = plain
    shell.showtraceback = showtraceback


def whose_numbers() -> str:
    """Whose numbers the notebook uses, with the one instruction for setting one's id when none
    is set: the first thing the checks cell says."""
    try:
        student = _json.loads(_os.environ.get("CTC_VARIANTS") or "{}").get("student")
    except (ValueError, AttributeError):
        student = None
    if type(student) is str:
        return (f"This notebook uses the numbers drawn for {student}: your graded prediction "
                "asks about them.")
    return ("No student id is set: this notebook uses the course's default numbers, fine for "
            f"working on your own. {SET_YOUR_ID}")


if _get_ipython() is not None:  # in a kernel: this notebook's checks cell, or the lab's start
    _install_one_line_errors(_get_ipython())
    if __name__ == "__main__":  # the checks cell (the lab's start imports this file instead)
        print(whose_numbers())


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
    import torch as _torch  # here: the lab's kernels load this file at their start, unhurried

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
    import torch as _torch

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
