"""Hidden checks of lesson 01 (float formats). See grader/content/cases/__init__.py."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

_ALL_CODES_ORACLES = {
    "FP16": "torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()",
    "BF16": "torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()",
    "FP8_E4M3": "torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)"
    ".float()",
    "FP8_E5M2": "torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e5m2)"
    ".float()",
}

# Bit patterns decode to exactly one number, and each format here fits in a float64 (a float32 for
# the tensors): every correct decoding gives the same bits, on every machine.
_BITS = "a bit pattern stands for one exact number; no arithmetic on it rounds"
EXACT = {name: _BITS for name in ("decode", "decode_tensor", "max_finite", "smallest_normal",
                                   "smallest_subnormal", "machine_epsilon")}

CASES: dict[str, list[Case | str]] = {
    "FloatFormat": [
        "(FP32.bias, FP16.bias, BF16.bias, FP8_E4M3.bias, FP8_E5M2.bias)",
        "(FP32.total_bits, FP16.total_bits, BF16.total_bits, FP8_E4M3.total_bits)",
        "FloatFormat('fp80ish', 15, 64).bias",
        "FloatFormat('fp64', 11, 52).total_bits",
        "FloatFormat('e3m2', 3, 2, False).bias",
    ],
    "split_bits": [
        "split_bits(0xFBFF, FP16)",
        "split_bits(0x8001, BF16)",
        "split_bits(0xFF, FP8_E4M3)",
        "split_bits(0x7F800000, FP32)",
        "split_bits(0, FP8_E5M2)",
        "split_bits(0xC2F7, BF16)",
        raises("split_bits(0x10000, FP16)", "ValueError"),
        raises("split_bits(-1, BF16)", "ValueError"),
    ],
    "decode": [
        "decode(0x7BFF, FP16)",
        "decode(0x0001, FP16)",
        "decode(0x03FF, FP16)",
        "decode(0x8000, FP16)",
        "decode(0xFC00, FP16)",
        "decode(0x7E01, FP16)",
        "decode(0x7F7F, BF16)",
        "decode(0x3DCD, BF16)",
        "decode(0x7E, FP8_E4M3)",
        "decode(0x78, FP8_E4M3)",
        "decode(0xFF, FP8_E4M3)",
        "decode(0x07, FP8_E4M3)",
        "decode(0x7B, FP8_E5M2)",
        "decode(0x7C, FP8_E5M2)",
        "decode(0x83, FP8_E5M2)",
        "decode(0x3DCCCCCD, FP32)",
        "decode(0x00000001, FP32)",
    ],
    "encode": [
        "encode(0.1, FP32)",
        # Just above a tie: rounded to float32 first, each lands on the tie and rounds down.
        "encode(1 + 2**-11 + 2**-40, FP16)",
        "encode(1 + 2**-4 + 2**-40, FP8_E4M3)",
        "encode(0.1, BF16)",
        "encode(-2.5, FP16)",
        "encode(65504.0, FP16)",
        "encode(65519.99, FP16)",
        "encode(65520.0, FP16)",
        "encode(1e-8, FP16)",
        "encode(-3e-8, FP16)",
        "encode(2.0**-25 * 3, FP16)",
        "encode(1.0 + 2.0**-11, FP16)",
        "encode(1.0 + 3 * 2.0**-11, FP16)",
        "encode(1.0 + 2.0**-8, BF16)",
        "encode(-0.0, BF16)",
        "encode(float('inf'), BF16)",
        "encode(float('nan'), FP16)",
        "encode(3.4e38, BF16)",
        "encode(448.0, FP8_E4M3)",
        "encode(464.0, FP8_E4M3)",
        "encode(470.0, FP8_E4M3)",
        "encode(470.0, FP8_E4M3, saturate=True)",
        "encode(-1e9, FP8_E4M3, saturate=True)",
        "encode(float('-inf'), FP8_E4M3, saturate=True)",
        "encode(float('inf'), FP8_E4M3)",
        "encode(2.0**-10, FP8_E4M3)",
        "encode(2.0**-9 * 0.75, FP8_E4M3)",
        "encode(60000.0, FP8_E5M2)",
        "encode(61440.0, FP8_E5M2)",
        "encode(61440.0, FP8_E5M2, saturate=True)",
        "encode(2.0**-17, FP8_E5M2)",
        "encode(1e-30, FP32)",
        "encode(1e39, FP32)",
    ],
    "max_finite": [
        "[max_finite(f) for f in (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)]",
        "max_finite(FloatFormat('e3m2', 3, 2, False))",
        "max_finite(FloatFormat('fp64', 11, 52))",
    ],
    "smallest_normal": [
        "[smallest_normal(f) for f in (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)]",
        "smallest_normal(FloatFormat('fp64', 11, 52))",
    ],
    "smallest_subnormal": [
        "[smallest_subnormal(f) for f in (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)]",
        "smallest_subnormal(FloatFormat('fp64', 11, 52))",
    ],
    "machine_epsilon": [
        "[machine_epsilon(f) for f in (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)]",
        "machine_epsilon(FloatFormat('fp64', 11, 52))",
    ],
    "decode_tensor": [
        *(
            Case(f"decode_tensor(torch.arange({n}), {fmt})", expected=oracle)
            for fmt, oracle in _ALL_CODES_ORACLES.items()
            for n in [65536 if fmt in ("FP16", "BF16") else 256]
        ),
        Case(
            "decode_tensor(torch.arange(65536, dtype=torch.int32).to(torch.int16), FP16)",
            expected=_ALL_CODES_ORACLES["FP16"],
        ),
        "decode_tensor(torch.tensor([[0x3F800000, 0x7F800000], [0x80000001, 0xFF800000]]), FP32)",
        "decode_tensor(torch.tensor([0x7F, 0xFF, 0x7E, 0x80], dtype=torch.uint8), FP8_E4M3)",
        raises("decode_tensor(torch.tensor([1.0, 2.0]), FP16)", "TypeError"),
    ],
    "tensor_bytes": [
        "tensor_bytes((4 * 12288, 12288), torch.float32)",
        "tensor_bytes((4 * 12288, 12288), torch.bfloat16)",
        "tensor_bytes((4 * 12288, 12288), torch.float8_e4m3fn)",
        "tensor_bytes((), torch.float64)",
        "tensor_bytes((3, 0, 5), torch.float16)",
        "tensor_bytes((7, 3, 5), torch.int64)",
        raises("tensor_bytes((3, -1), torch.float32)", "ValueError"),
    ],
    # A prediction, graded within a band: the sum stops at a power of two s (4 for the default,
    # 0.01), and 25% accepts s give or take s / 4 while refusing the neighbouring powers: s / 2
    # (stopping once the increment is below the whole gap, not half of it) and 2 s (epsilon taken
    # as 2**-8). float(): an int counts too.
    "predicted_bf16_stall": [Case("float(predicted_bf16_stall)", rel_tol=0.25)],
}

# Each student's increment for the graded prediction, and where its bf16 sum stops: 0.01 at 4 (the
# default: the lesson's measurement runs it), 0.18 at 64, 0.025 at 8, 0.1 at 32, 0.045 at 16 (not
# one that stops at 1 or 2: the lesson prints 1.0 and 2.0 long before). In every one 256 x the
# increment lies between 0.64 s and 0.81 s, well inside (s / 2, s), so the increment rounded to bf16
# or not gives the same s, and only the rule (half the gap) decides; every sum reaches s in under
# 400 additions. Each stalls at its own power of two, so no student's answer passes another's band.
# tests/test_floats.py runs each one's sum in bf16.
VARIANTS = {
    "predicted_bf16_stall": Variants(
        ("increment",), ((0.01,), (0.18,), (0.025,), (0.1,), (0.045,)),
        "the bf16 sum adds increment = {increment} at each step"),
}


# Hidden inputs of each student's own (grader/content/variants.py): a bit pattern decodes to one
# exact number and a tensor's bytes are an integer product, so inputs drawn anywhere in what the
# exercise accepts need no tolerance, and no answer copied from another student's checks passes.
_FIELDS = {"FP16": (5, 10), "BF16": (8, 7), "FP8_E4M3": (4, 3), "FP8_E5M2": (5, 2)}


def _drawn_decode(rng: random.Random) -> list[str]:
    """Three finite patterns, each of another format: a sign, an exponent field short of all ones
    (no infinity or NaN; E4M3's top binade is in the fixed cases) and any mantissa."""
    calls = []
    for fmt in rng.sample(sorted(_FIELDS), 3):
        exponent_bits, mantissa_bits = _FIELDS[fmt]
        bits = ((rng.randrange(2) << exponent_bits | rng.randrange(2**exponent_bits - 1))
                << mantissa_bits | rng.randrange(2**mantissa_bits))
        digits = (1 + exponent_bits + mantissa_bits) // 4
        calls.append(f"decode(0x{bits:0{digits}X}, {fmt})")
    return calls


def _drawn_tensor_bytes(rng: random.Random) -> list[str]:
    """A bias vector, a weight matrix and a batch of activations (batch, sequence, width, or
    with a head dimension too), each of a dtype of its own. Each stays under 600 MB, so that an
    answer that builds the tensor to read its size runs too."""
    dtypes = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float64", "int64", "uint8")
    if rng.randrange(2):  # (batch, sequence, width)
        activations = (rng.randint(1, 32), rng.randint(1, 2048), 64 * rng.randint(1, 16))
    else:  # (batch, heads, sequence, head width)
        activations = (rng.randint(1, 8), rng.randint(1, 16), rng.randint(1, 2048),
                       rng.choice((64, 128)))
    shapes = [(rng.randint(1, 100_000),), (64 * rng.randint(1, 64), 64 * rng.randint(1, 64)),
              activations]
    return [f"tensor_bytes({shape!r}, torch.{rng.choice(dtypes)})" for shape in shapes]


DRAWN = {"decode": _drawn_decode, "tensor_bytes": _drawn_tensor_bytes}
