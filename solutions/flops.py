"""Lesson 03: matmul FLOPs, arithmetic intensity, the roofline and MFU.

A FLOP here is one floating-point multiply or one add. A matmul of an (m, k) matrix by a (k, n)
matrix computes m*n dot products of length k: m*k*n multiplies and m*(k - 1)*n adds, which the
convention rounds up to m*k*n, so 2*m*k*n FLOPs. The same count holds for any two-operand
einsum: one multiply and one add for each combination of index values.

Whether a chip can do those FLOPs at its peak rate depends on how many bytes it has to move for
them. Arithmetic intensity = FLOPs / bytes moved. The roofline model says an operation of intensity
I runs at most at min(peak FLOP/s, I x memory bandwidth): below the ridge point
peak / bandwidth it is memory-bound, above it compute-bound. Model FLOPs utilisation (MFU) is the
fraction of the peak that a measured run achieved.

Peaks are dense figures. Datasheets also print "with sparsity" figures, twice as large, that only
2:4 structured-sparse matrices reach; the 1979 TFLOP/s often quoted for an H100 SXM in bf16 is
one of those (dense: 989.4 TFLOP/s).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) matmul: one multiply and one add per term, 2*m*k*n.

    Args:
        m: rows of the left matrix (and of the result).
        k: the inner (contracted) dimension.
        n: columns of the right matrix (and of the result).

    Returns:
        The FLOP count as an int.
    """
    sizes = {"m": operator.index(m), "k": operator.index(k), "n": operator.index(n)}
    negative = [f"{name}={size}" for name, size in sizes.items() if size < 0]
    if negative:
        raise ValueError(f"matrix sizes must be >= 0, got {', '.join(negative)}")
    return 2 * sizes["m"] * sizes["k"] * sizes["n"]


def einsum_flops(equation: str, *shapes: Sequence[int]) -> int:
    """FLOPs of a two-operand einsum such as ``"bij,bjk->bik"``: 2 x the product of every
    distinct index size (one multiply and one add per combination of index values).

    Batch indices (in both operands and the output), contracted indices (in both operands, not
    in the output) and free indices (in one operand and the output) all count the same way.
    ``torch.utils.flop_counter.FlopCounterMode`` agrees when every index is in both operands or
    in the output and at least one contracted index has a size above 1. It differs in two cases:
    an index in only one operand and not in the output is summed out before the multiplication
    (a sum it does not count, so it counts fewer FLOPs), and a product with nothing left to
    contract (an outer or elementwise product, or a contraction over size-1 indices only) runs
    as an elementwise ``mul``, which it counts as 0.

    Args:
        equation: ``"<operand>,<operand>-><output>"``, each part a string of index letters
            with no letter repeated within it; the explicit ``->`` output is required.
        shapes: the two operands' shapes, one size per index letter.

    Returns:
        The FLOP count as an int.
    """
    if not isinstance(equation, str):
        raise TypeError(f"equation must be a str such as 'ij,jk->ik', got {equation!r}")
    spec = "".join(equation.split())  # like torch.einsum, ignore spaces
    if "." in spec:
        raise ValueError(f"{equation!r}: ellipsis ('...') is not supported; name every index")
    if spec.count("->") != 1:
        raise ValueError(f"{equation!r}: write the output explicitly after one '->', "
                         "as in 'ij,jk->ik'")
    inputs, output = spec.split("->")
    operands = inputs.split(",")
    if len(operands) != 2:
        raise ValueError(f"{equation!r}: expected two operands, found {len(operands)}")
    if len(shapes) != len(operands):
        raise ValueError(f"{equation!r} has 2 operands but {len(shapes)} shapes were given")
    sizes: dict[str, int] = {}
    for position, (indices, shape) in enumerate(zip(operands, shapes, strict=True)):
        if not isinstance(shape, Sequence):
            raise TypeError(f"shape of operand {position} must be a sequence of ints such as "
                            f"(2, 3), got {shape!r}")
        shape = tuple(operator.index(size) for size in shape)
        where = f"operand {position} ({indices!r}, shape {shape})"
        if not all(letter.isascii() and letter.isalpha() for letter in indices):
            raise ValueError(f"{equation!r}: {where}: indices must be letters a-z or A-Z")
        if len(set(indices)) != len(indices):
            raise ValueError(f"{equation!r}: {where} repeats an index (diagonals and traces "
                             "are not supported)")
        if len(indices) != len(shape):
            raise ValueError(f"{equation!r}: {where} has {len(indices)} indices but "
                             f"{len(shape)} dimensions")
        for letter, size in zip(indices, shape, strict=True):
            if size < 0:
                raise ValueError(f"{equation!r}: {where}: size of {letter!r} is negative")
            if sizes.setdefault(letter, size) != size:
                raise ValueError(f"{equation!r}: index {letter!r} has size {sizes[letter]} in "
                                 f"one operand and {size} in the other")
    for letter in output:
        if letter not in sizes:
            raise ValueError(f"{equation!r}: output index {letter!r} is in neither operand")
    if len(set(output)) != len(output):
        raise ValueError(f"{equation!r}: the output {output!r} repeats an index")
    return 2 * math.prod(sizes.values())


def matmul_bytes(m: int, k: int, n: int, bytes_per_element: int) -> int:
    """Bytes moved by an (m, k) @ (k, n) matmul that reads each input once and writes the
    output once: (m*k + k*n + m*n) x bytes_per_element.

    Args:
        m, k, n: the matmul's sizes, as in ``matmul_flops``.
        bytes_per_element: 4 for fp32, 2 for bf16, 1 for fp8.

    Returns:
        The byte count as an int.
    """
    sizes = {"m": operator.index(m), "k": operator.index(k), "n": operator.index(n)}
    negative = [f"{name}={size}" for name, size in sizes.items() if size < 0]
    if negative:
        raise ValueError(f"matrix sizes must be >= 0, got {', '.join(negative)}")
    bytes_per_element = operator.index(bytes_per_element)
    if bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element must be positive, got {bytes_per_element}")
    m, k, n = sizes["m"], sizes["k"], sizes["n"]
    return (m * k + k * n + m * n) * bytes_per_element


def arithmetic_intensity(flops: float, bytes: float) -> float:
    """FLOPs done per byte moved to or from memory.

    Args:
        flops: FLOPs of the operation (>= 0).
        bytes: bytes it moves (> 0).

    Returns:
        flops / bytes, in FLOP/byte, as a float.
    """
    if not bytes > 0:
        raise ValueError(f"bytes must be positive, got {bytes!r}")
    if not flops >= 0:
        raise ValueError(f"flops must be >= 0, got {flops!r}")
    return float(flops / bytes)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The arithmetic intensity where the roofline bends: below it an operation is
    memory-bound, above it compute-bound.

    Args:
        peak_flops: peak compute rate, FLOP/s (dense).
        bandwidth: memory bandwidth, bytes/s.

    Returns:
        peak_flops / bandwidth, in FLOP/byte, as a float.
    """
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    return float(peak_flops / bandwidth)


def roofline(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The highest FLOP/s an operation of a given arithmetic intensity can reach:
    min(peak_flops, intensity x bandwidth).

    Args:
        intensity: the operation's arithmetic intensity, FLOP/byte (>= 0).
        peak_flops: peak compute rate, FLOP/s.
        bandwidth: memory bandwidth, bytes/s.

    Returns:
        The attainable FLOP/s, as a float.
    """
    if not intensity >= 0:
        raise ValueError(f"intensity must be >= 0, got {intensity!r}")
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    return float(min(peak_flops, intensity * bandwidth))


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of the peak that a measured run achieved.

    Args:
        flops: FLOPs the run did, counted on paper (e.g. with ``matmul_flops``).
        seconds: wall-clock time it took (> 0).
        peak_flops: the hardware's dense peak, FLOP/s.

    Returns:
        flops / seconds / peak_flops, a float (0.5 means half the peak).
    """
    if not flops >= 0:
        raise ValueError(f"flops must be >= 0, got {flops!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    return float(flops / seconds / peak_flops)


# ------------------------------------------------------------------ predictions
# The answers to the lesson's "predict first" questions. The notebook holds each one sealed
# (grader.content.notebook_checks.seal); tests/test_flops.py checks each against its oracle.

# Section 5: what FlopCounterMode counts for `a @ v`, a (256, 256) matrix times a vector of 256:
# (a) 2 x 256 x 256, as matmul_flops(256, 256, 1); (b) 0; (c) 256 x 256. torch runs it as
# aten::mv, for which FlopCounterMode has no formula (oracle: FlopCounterMode itself).
MV_COUNT_OPTIONS = {"a": 2 * 256 * 256, "b": 0, "c": 256 * 256}
choice_mv_flops = "b"

# Section 8 (graded): the batch B (tokens) from which a (B, D) @ (D, F) weight matmul is
# compute-bound on a GPU. With b bytes per element it does 2BDF FLOPs and moves
# b(BD + DF + BF) bytes, so its intensity is (2B / b) / (1 + B/F + B/D): about 2B / b while
# B << D, F. It is compute-bound from about 2B / b = the ridge point, the dense peak over the
# bandwidth, so from B = ridge point x b / 2: the ridge point itself in bf16. Each student answers
# for a GPU and dtype of their own (grader/content/cases/flops.py); these are the default's, which
# the notebook's text describes, as data/hardware.json has them (tests/test_flops.py checks). The
# 1e12 of TFLOP/s and TB/s cancel in the ridge point.
layer_gpu = "H100 SXM"
layer_dtype = "bf16"
layer_bytes = 2  # bytes per element of layer_dtype
layer_peak_tflops = 989.4  # layer_gpu's dense peak in layer_dtype, TFLOP/s
layer_bandwidth_tbs = 3.35  # its memory bandwidth, TB/s
predicted_critical_batch_h100 = layer_peak_tflops / layer_bandwidth_tbs * layer_bytes / 2

# Section 11: per FLOP, how many times longer the large add takes than the best matmul:
# (a) under 2 times; (b) 2 to 10 times; (c) more than 10 times. The roofline's answer: an add
# does 1 FLOP per 3 elements moved, 1/12 FLOP/byte in fp32 (1/6 in bf16), so it reaches at most
# bandwidth / 12 FLOP/s, while a large matmul can reach the peak: a ratio of 12 x the ridge
# point in fp32 (6 x in bf16). Even at 20% MFU for the matmul that is over 10 wherever the ridge
# point is above 4.2 FLOP/byte (8.4 in bf16): every GPU of hardware.json and most CPUs.
ADD_VS_MATMUL_OPTIONS = {"a": (1, 2), "b": (2, 10), "c": (10, float("inf"))}
choice_add_vs_matmul = "c"
