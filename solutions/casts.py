"""Which NaN or infinite values a computation casts to an integer dtype (lesson 05).

C++ leaves the conversion of NaN or infinity to an integer undefined, and so does torch's cast:
``torch.tensor(float("nan")).to(torch.int8)`` gives 0 on the usual x86 and Arm CPUs, but
nothing promises it. So a check that compares the codes an exercise returns cannot tell code
that divides 0 by 0 and casts the NaN from code that never makes it. ``nan_casts`` watches the
casts themselves: run in a ``TorchDispatchMode``, every conversion (``aten._to_copy`` and
``aten.copy_``) to an integer dtype whose source holds NaN or infinity is named. A cast made in
NumPy (``.numpy().astype(np.int8)``) never reaches torch's dispatcher; NumPy reports it instead,
as the warning "invalid value encountered in cast", from the flag that IEEE 754 makes every CPU
raise when it converts NaN or infinity to an integer, and ``nan_casts`` names that too.
"""

from __future__ import annotations


def nan_casts(expression: str) -> list[str]:
    """What ``expression``, evaluated in the caller's namespace, casts from NaN or infinity to
    an integer dtype: one ``"NaN -> torch.int8"`` (or ``"inf -> ..."``) per cast, one
    ``"NaN or inf -> an integer, in NumPy"`` per such cast made in NumPy, none for code that
    keeps them from its casts.

    Args:
        expression: a call, e.g. ``"quantize_blockwise(torch.zeros(4), 2)"``.

    Returns:
        The casts: torch's in the order they ran, then NumPy's.
    """
    import sys  # here: the notebook gets this function alone, as given code
    import warnings

    import numpy
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    namespace = sys._getframe(1).f_globals
    found: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("_to_copy", "copy_", "copy") and type(out) is torch.Tensor \
                    and not (out.is_floating_point() or out.is_complex()
                             or out.dtype == torch.bool):
                source = args[1] if name != "_to_copy" else args[0]
                if type(source) is torch.Tensor and source.is_floating_point():
                    if bool(source.isnan().any()):
                        found.append(f"NaN -> {out.dtype}")
                    elif bool(source.isinf().any()):
                        found.append(f"inf -> {out.dtype}")
            return out

    with warnings.catch_warnings(record=True) as warned, numpy.errstate(invalid="warn"), Watch():
        warnings.simplefilter("always")
        eval(expression, namespace)
    found += ["NaN or inf -> an integer, in NumPy" for w in warned
              if issubclass(w.category, RuntimeWarning)
              and str(w.message) == "invalid value encountered in cast"]
    return found
