"""Lesson 01: float formats as bit layouts.

Every format here is a sign bit, an exponent field and a mantissa (fraction) field. A normal
number is ``(-1)**sign * 1.mantissa * 2**(exponent - bias)``; an exponent field of zero holds the
subnormals ``(-1)**sign * 0.mantissa * 2**(1 - bias)`` and the two zeros. What the all-ones
exponent means depends on the format: IEEE-like formats (fp32, fp16, bf16, fp8 E5M2) use it for
infinities and NaNs, while fp8 E4M3 "fn" (finite, NaN) has no infinity and spends it on more
normal numbers, keeping only S.1111.111 as NaN.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, then exponent bits, then mantissa bits.

    Args:
        name: short name, such as ``"bf16"``.
        exponent_bits: width of the exponent field.
        mantissa_bits: width of the mantissa (fraction) field, without the implicit leading 1.
        ieee_specials: True when the all-ones exponent encodes infinities and NaNs (IEEE 754
            style); False for the "fn" formats, where it encodes normal numbers and only the
            all-ones pattern is NaN.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    ieee_specials: bool = True

    @property
    def bias(self) -> int:
        """The exponent bias: 2**(exponent_bits - 1) - 1."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def total_bits(self) -> int:
        """Bits per number: sign + exponent + mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits


FP32 = FloatFormat("fp32", exponent_bits=8, mantissa_bits=23)
FP16 = FloatFormat("fp16", exponent_bits=5, mantissa_bits=10)
BF16 = FloatFormat("bf16", exponent_bits=8, mantissa_bits=7)
FP8_E4M3 = FloatFormat("fp8_e4m3", exponent_bits=4, mantissa_bits=3, ieee_specials=False)
FP8_E5M2 = FloatFormat("fp8_e5m2", exponent_bits=5, mantissa_bits=2)


def split_bits(bits: int, fmt: FloatFormat) -> tuple[int, int, int]:
    """Split a bit pattern into its three fields.

    Args:
        bits: the pattern as an unsigned integer, 0 <= bits < 2**fmt.total_bits.
        fmt: the format the pattern belongs to.

    Returns:
        (sign, exponent field, mantissa field), each an unsigned integer.
    """
    bits = operator.index(bits)
    if not 0 <= bits < 2**fmt.total_bits:
        raise ValueError(
            f"bits={bits} is not a {fmt.total_bits}-bit pattern of {fmt.name}; "
            f"pass an unsigned integer in [0, {2**fmt.total_bits - 1}]"
        )
    mantissa = bits & (2**fmt.mantissa_bits - 1)
    exponent = (bits >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    sign = bits >> (fmt.exponent_bits + fmt.mantissa_bits)
    return sign, exponent, mantissa


def decode(bits: int, fmt: FloatFormat) -> float:
    """The value a bit pattern stands for.

    Args:
        bits: the pattern as an unsigned integer (see ``split_bits``).
        fmt: its format.

    Returns:
        The exact value as a Python float: normals, subnormals, +-0.0, +-inf and nan.
    """
    sign, exponent, mantissa = split_bits(bits, fmt)
    all_ones = 2**fmt.exponent_bits - 1
    if exponent == all_ones:
        if fmt.ieee_specials:
            return math.nan if mantissa else (-math.inf if sign else math.inf)
        if mantissa == 2**fmt.mantissa_bits - 1:
            return math.nan
    if exponent == 0:  # subnormal or zero: no implicit leading 1, exponent fixed at 1 - bias
        magnitude = math.ldexp(mantissa, 1 - fmt.bias - fmt.mantissa_bits)
    else:
        significand = 2**fmt.mantissa_bits + mantissa
        magnitude = math.ldexp(significand, exponent - fmt.bias - fmt.mantissa_bits)
    return -magnitude if sign else magnitude


def encode(x: float, fmt: FloatFormat, saturate: bool = False) -> int:
    """The bit pattern of the number of ``fmt`` nearest to ``x`` (round to nearest, ties to even).

    Args:
        x: any Python float (a double), including +-0.0, +-inf and nan.
        fmt: the target format.
        saturate: what to do with values too large for ``fmt``. False: IEEE behaviour, +-inf
            (nan for E4M3, which has no infinity). True: clamp to +-max finite, infinities too,
            as torch's casts to float8_e4m3fn do on the CPU from torch 2.13 (older versions
            give nan).

    Returns:
        The pattern as an unsigned integer. A nan input gives ``_nan_code(fmt)``, the one NaN
        pattern this lesson uses (IEEE 754 leaves a NaN's sign and other mantissa bits free).
    """
    x = float(x)
    if math.isnan(x):
        return _nan_code(fmt)
    sign = 1 << (fmt.total_bits - 1) if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        return sign | _overflow_code(fmt, saturate)
    if x == 0.0:
        return sign
    # |x| = significand * 2**exponent exactly, with an integer significand: a double has 53 bits.
    fraction, binary_exponent = math.frexp(abs(x))
    significand, exponent = int(fraction * 2**53), binary_exponent - 53
    # Exponent field of the result, clamped to 1 for subnormals (which share 2**(1 - bias)).
    biased = max(binary_exponent - 1 + fmt.bias, 1)
    quantum = biased - fmt.bias - fmt.mantissa_bits  # the last mantissa bit is worth 2**quantum
    shift = quantum - exponent
    if shift <= 0:
        steps = significand << -shift
    else:  # significand / 2**shift, rounded to the nearest integer, ties to even
        steps, remainder = significand >> shift, significand & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if remainder > half or (remainder == half and steps & 1):
            steps += 1
    # One formula covers normals and subnormals: a carry out of the mantissa lands in the exponent.
    magnitude = ((biased - 1) << fmt.mantissa_bits) + steps
    if magnitude > _max_finite_code(fmt):
        return sign | _overflow_code(fmt, saturate)
    return sign | magnitude


def _nan_code(fmt: FloatFormat) -> int:
    """The lesson's NaN: sign 0, exponent all ones, the quiet bit (top mantissa bit) alone;
    0.1111.111 for E4M3, its only positive NaN. Any other NaN pattern is as correct; this one
    is what ml_dtypes gives for +nan and RISC-V's canonical NaN."""
    if fmt.ieee_specials:
        return _exponent_all_ones(fmt) | (1 << (fmt.mantissa_bits - 1))
    return (1 << (fmt.exponent_bits + fmt.mantissa_bits)) - 1


def _overflow_code(fmt: FloatFormat, saturate: bool) -> int:
    """The unsigned pattern a too-large magnitude becomes: max finite, inf, or (E4M3) nan."""
    if saturate:
        return _max_finite_code(fmt)
    return _exponent_all_ones(fmt) if fmt.ieee_specials else _nan_code(fmt)


def _exponent_all_ones(fmt: FloatFormat) -> int:
    """The pattern with an all-ones exponent field and a zero mantissa (+inf where IEEE)."""
    return (2**fmt.exponent_bits - 1) << fmt.mantissa_bits


def _max_finite_code(fmt: FloatFormat) -> int:
    """The pattern of the largest finite positive number of ``fmt``."""
    if fmt.ieee_specials:
        return _exponent_all_ones(fmt) - 1  # exponent all ones but one, mantissa all ones
    return (1 << (fmt.exponent_bits + fmt.mantissa_bits)) - 2  # S.1111.110: .111 is nan


def max_finite(fmt: FloatFormat) -> float:
    """The largest finite number of ``fmt`` (448 for E4M3, 57344 for E5M2, 65504 for fp16)."""
    if fmt.ieee_specials:
        exponent = 2**fmt.exponent_bits - 2 - fmt.bias
        return math.ldexp(2 - 2.0**-fmt.mantissa_bits, exponent)
    exponent = 2**fmt.exponent_bits - 1 - fmt.bias
    return math.ldexp(2 - 2.0 ** (1 - fmt.mantissa_bits), exponent)


def smallest_normal(fmt: FloatFormat) -> float:
    """The smallest positive normal number: 2**(1 - bias)."""
    return math.ldexp(1.0, 1 - fmt.bias)


def smallest_subnormal(fmt: FloatFormat) -> float:
    """The smallest positive number: one unit in the last mantissa place, 2**(1 - bias - m)."""
    return math.ldexp(1.0, 1 - fmt.bias - fmt.mantissa_bits)


def machine_epsilon(fmt: FloatFormat) -> float:
    """The gap between 1.0 and the next larger number: 2**-mantissa_bits."""
    return math.ldexp(1.0, -fmt.mantissa_bits)


def rounding_limits(fmt: FloatFormat) -> tuple[float, float]:
    """Where rounding to nearest, ties to even, leaves the finite nonzero numbers of ``fmt``.

    Args:
        fmt: the format.

    Returns:
        (to_zero, to_overflow), magnitudes. Up to ``to_zero``, half the smallest subnormal, a
        value rounds to 0: exactly ``to_zero`` is a tie, and 0 is the even neighbour.
        ``to_overflow`` lies halfway between the largest finite number and the next step above
        it: below it a value rounds to at most the largest finite number, above it past that
        (inf, or nan for E4M3). Exactly at it, ties to even decide: IEEE-style formats overflow
        (their largest mantissa, all ones, is odd); E4M3 keeps 448 (mantissa 110, even).
    """
    top = max_finite(fmt)
    below = decode(encode(top, fmt) - 1, fmt)  # the finite number just below the largest
    return smallest_subnormal(fmt) / 2, top + (top - below) / 2


def decode_tensor(bits: Tensor, fmt: FloatFormat) -> Tensor:
    """Decode a tensor of bit patterns at once, without a Python loop over its elements.

    Args:
        bits: integer tensor of any shape. Either unsigned patterns (0 <= b < 2**total_bits) or
            the same patterns read as signed integers of width ``total_bits`` (what
            ``x.view(torch.int16)`` gives for fp16).
        fmt: their format.

    Returns:
        float32 tensor of the same shape; exact, since every format here fits in float32.
    """
    if bits.is_floating_point() or bits.is_complex() or bits.dtype == torch.bool:
        raise TypeError(f"decode_tensor needs an integer tensor of bit patterns, got {bits.dtype}")
    codes = bits.to(torch.int64) & (2**fmt.total_bits - 1)
    mantissa = codes & (2**fmt.mantissa_bits - 1)
    exponent = (codes >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    negative = (codes >> (fmt.total_bits - 1)) == 1
    is_subnormal = exponent == 0
    significand = torch.where(is_subnormal, mantissa, mantissa + 2**fmt.mantissa_bits)
    scale = torch.where(is_subnormal, 1, exponent) - fmt.bias - fmt.mantissa_bits
    # float64 holds every significand and power of two here exactly, so the product is exact.
    values = torch.ldexp(significand.to(torch.float64), scale.to(torch.float64))
    all_ones = exponent == 2**fmt.exponent_bits - 1
    if fmt.ieee_specials:
        values = torch.where(all_ones & (mantissa == 0), math.inf, values)
        values = torch.where(all_ones & (mantissa != 0), math.nan, values)
    else:
        values = torch.where(all_ones & (mantissa == 2**fmt.mantissa_bits - 1), math.nan, values)
    return torch.where(negative, -values, values).to(torch.float32)


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes needed to store a dense tensor of ``shape`` and ``dtype``: elements x bytes each.

    Args:
        shape: the tensor's shape, e.g. ``(4 * 12288, 12288)``.
        dtype: a torch dtype, e.g. ``torch.bfloat16``.

    Returns:
        The number of bytes, as an int.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.bfloat16, got {dtype!r}")
    if any(operator.index(size) < 0 for size in shape):
        raise ValueError(f"shape {tuple(shape)} has a negative size")
    return math.prod(shape) * dtype.itemsize


# ---------------------------------------------------------------- predict, then measure
# The answers to the questions of section 12, computed from the functions above. The notebook
# holds them sealed; tests/test_notebooks.py checks that each sealed value is the one here.

# What torch stores for 1e-8 in fp16. The options: (a) a number close to 1e-8, (b) 0.0, (c) the
# smallest subnormal, 2**-24. The answer is the option nearest what rounding to fp16 gives.
FP16_1E8_OPTIONS = {"a": 1e-8, "b": 0.0, "c": smallest_subnormal(FP16)}
choice_fp16_1e8 = min(FP16_1E8_OPTIONS, key=lambda option: abs(
    FP16_1E8_OPTIONS[option] - decode(encode(1e-8, FP16), FP16)))

# Where a bf16 running sum of an increment stops: the first power of two s at which the
# increment, as stored in bf16, is at most half the gap above s, which is s * eps / 2 (a tie keeps
# s). From torch's own numbers, so that this graded answer depends on no exercise: a mistake costs
# its points once. Each student adds an increment of their own (grader/content/cases/floats.py);
# this is the default's, which the notebook's text describes.
increment = 0.01
predicted_bf16_stall = 2.0 ** math.ceil(math.log2(
    2 * torch.tensor(increment, dtype=torch.bfloat16).item() / torch.finfo(torch.bfloat16).eps))

# One GPT-3 feed-forward weight matrix, of shape (4 * 12288, 12288), in bf16, in GiB.
predicted_ffn_gib_bf16 = tensor_bytes((4 * 12288, 12288), torch.bfloat16) / 2**30
