"""Hidden checks of lesson 03 (matmul FLOPs, arithmetic intensity, roofline, MFU).
See grader/content/cases/__init__.py."""

import random
import string

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# Every rounded float gets a tolerance: the same formula written in another order
# (flops / (seconds * peak) instead of flops / seconds / peak, flops * (1 / bytes) instead of
# flops / bytes) may differ in the last bit or two, about 2e-16 relative. 1e-12 allows that
# and nothing a wrong formula gives. Whole numbers and halves stay exact.
_REL = 1e-12

CASES: dict[str, list[Case | str]] = {
    "matmul_flops": [
        "matmul_flops(2, 3, 4)",
        "matmul_flops(1, 1, 1)",
        "matmul_flops(1, 8192, 1)",  # a dot product
        "matmul_flops(128, 1, 256)",  # an outer product
        "matmul_flops(0, 5, 7)",
        "matmul_flops(2048 * 4, 12288, 4 * 12288)",  # GPT-3's FFN up-projection on 4 sequences
        raises("matmul_flops(2, -3, 4)", "ValueError"),
    ],
    "einsum_flops": [
        "einsum_flops('ij,jk->ik', (2, 3), (3, 4))",
        "einsum_flops('bij,bjk->bik', (8, 16, 32), (8, 32, 64))",
        "einsum_flops('bhqd,bhkd->bhqk', (2, 12, 128, 64), (2, 12, 128, 64))",
        "einsum_flops('i,j->ij', (5,), (7,))",  # outer product
        "einsum_flops('ij,ij->', (3, 4), (3, 4))",  # full contraction
        "einsum_flops('ij,jk->i', (2, 3), (3, 4))",  # k only in one operand: still counted
        "einsum_flops('bsd,df->bsf', (1, 1, 1), (1, 1))",
        "einsum_flops('ab,cd->dcba', (1, 2), (3, 4))",
        raises("einsum_flops('ij,jk', (2, 3), (3, 4))", "ValueError"),
        raises("einsum_flops('ij->ij', (2, 3))", "ValueError"),
        raises("einsum_flops('ij,jk->ik', (2, 3, 1), (3, 4))", "ValueError"),
        raises("einsum_flops('ii,jk->ik', (3, 3), (3, 4))", "ValueError"),
        raises("einsum_flops('ij,jk->ik', (2, 3), (5, 4))", "ValueError"),
    ],
    "matmul_bytes": [
        "matmul_bytes(2, 3, 4, 4)",
        "matmul_bytes(1, 1, 1, 1)",
        "matmul_bytes(4096, 4096, 4096, 2)",
        "matmul_bytes(1, 8192, 1, 4)",
        "matmul_bytes(8192, 1, 8192, 2)",
        "matmul_bytes(0, 16, 16, 4)",
        raises("matmul_bytes(2, 3, -4, 4)", "ValueError"),
        raises("matmul_bytes(2, 3, 4, 0)", "ValueError"),
    ],
    "arithmetic_intensity": [
        Case("arithmetic_intensity(48, 104)", rel_tol=_REL),
        "arithmetic_intensity(6, 3)",
        Case("arithmetic_intensity(2 * 4096**3, 3 * 4096**2 * 2)", rel_tol=_REL),
        # an fp32 elementwise add: 1/12
        Case("arithmetic_intensity(1024, 12 * 1024)", rel_tol=_REL),
        "arithmetic_intensity(0, 100)",
        "arithmetic_intensity(3.0, 0.5)",
        raises("arithmetic_intensity(10, 0)", "ValueError"),
        raises("arithmetic_intensity(-1, 10)", "ValueError"),
    ],
    "ridge_point": [
        Case("ridge_point(989.4e12, 3.35e12)", rel_tol=_REL),
        Case("ridge_point(312e12, 2.039e12)", rel_tol=_REL),
        "ridge_point(8, 2)",
        Case("ridge_point(332.8e9, 20e9)", rel_tol=_REL),
        raises("ridge_point(0, 2e12)", "ValueError"),
        raises("ridge_point(1e12, -2e12)", "ValueError"),
    ],
    "roofline": [
        Case("roofline(1.0, 989.4e12, 3.35e12)", rel_tol=_REL),
        Case("roofline(1000.0, 989.4e12, 3.35e12)", rel_tol=_REL),
        "roofline(0.0, 100.0, 10.0)",
        "roofline(10.0, 100.0, 10.0)",  # at the ridge
        "roofline(4, 100, 10)",  # ints in, a float out
        Case("roofline(1 / 12, 989.4e12, 3.35e12)", rel_tol=_REL),
        raises("roofline(-1.0, 100.0, 10.0)", "ValueError"),
        raises("roofline(1.0, 100.0, 0.0)", "ValueError"),
    ],
    "mfu": [
        Case("mfu(2 * 8192**3, 2e-3, 989.4e12)", rel_tol=_REL),
        "mfu(989.4e12, 1.0, 989.4e12)",
        "mfu(0, 1.0, 1e12)",
        "mfu(100, 4, 5)",
        Case("mfu(6 * 70e9 * 15e12, 144 * 86400 * 1024, 989.4e12)", rel_tol=_REL),
        raises("mfu(-1, 1.0, 1e12)", "ValueError"),
        raises("mfu(1e12, 0.0, 1e12)", "ValueError"),
    ],
    # A prediction, graded within 10% of the answer for the student's GPU and dtype (VARIANTS
    # below): the ridge point x b / 2 for b bytes per element (the intensity is about 2B / b
    # while B << D, F), so the ridge point itself in bf16; 295.3 tokens for the default. The
    # exact crossing for a layer as wide as GPT-3's MLP, (12288, 49152), is higher by the factor
    # 1 + B/F + B/D: 305 for the default, 3% above, and under 5% above in every variant: right
    # too. Taking the sparse peak (twice the answer; in the 16- and 8-bit dtypes, which have
    # one), or the wrong bytes per element (fp32's 4, intensity B / 2 in bf16; or 2 in fp8, or
    # leaving b out; 2 for fp32's 4), is off by 2 and is not. float(): a
    # whole number of tokens, written as an int, is as good an answer.
    "predicted_critical_batch_h100": [Case("float(predicted_critical_batch_h100)", rel_tol=0.1)],
}

# Each student's GPU and dtype for the graded prediction, with the figures of data/hardware.json
# (tests/test_flops.py checks them against it): answers 295.3 tokens (H100 SXM in bf16, the
# default, which the lesson's cells after the prediction work through), 19.1 (A100 SXM 80GB in
# fp32, on its CUDA cores: 4-byte elements, so twice its fp32 ridge point), 27.9 (H200 SXM in
# fp32), 25.1 (A100 SXM 40GB in fp32) and 80.0 (H100 SXM in fp64: 8-byte elements, four times
# its ridge point at the 67 TFLOP/s of its FP64 Tensor Cores, where an fp64 matmul runs;
# hardware.json's fp64_tensor. Its fp64, 34, is the vector rate, which would give 40.6). Every
# two answers are more than 10% apart, so the default's number, or another GPU's, does not
# pass. None in bf16, fp16 or fp8 (twice the bf16 peak on elements of half the bytes): their
# answer is a GPU's bf16 ridge point, which the lesson prints for every GPU before the
# prediction.
VARIANTS = {
    "predicted_critical_batch_h100": Variants(
        ("layer_gpu", "layer_dtype", "layer_bytes", "layer_peak_tflops", "layer_bandwidth_tbs"),
        (("H100 SXM", "bf16", 2, 989.4, 3.35),
         ("A100 SXM 80GB", "fp32", 4, 19.5, 2.039),
         ("H200 SXM", "fp32", 4, 67.0, 4.8),
         ("A100 SXM 40GB", "fp32", 4, 19.5, 1.555),
         ("H100 SXM", "fp64", 8, 67.0, 3.35)),
        "the layer runs on an {layer_gpu} in {layer_dtype} ({layer_bytes}-byte elements): "
        "{layer_peak_tflops:g} TFLOP/s dense, {layer_bandwidth_tbs:g} TB/s (hardware.json)"),
}


def _drawn_matmul_bytes(rng: random.Random) -> list[str]:
    return [f"matmul_bytes({rng.randrange(1, 2**14)}, {rng.randrange(1, 2**14)}, "
            f"{rng.randrange(1, 2**14)}, {rng.choice((1, 2, 4, 8))})" for _ in range(3)]


def _drawn_einsum_flops(rng: random.Random) -> list[str]:
    """Einsums of every kind the exercise counts (batch, contracted and free indices, in any
    order, with any letters), each operand with at least one index."""
    calls = []
    for _ in range(3):
        counts = (rng.randrange(3), rng.randrange(1, 3), rng.randrange(3), rng.randrange(3))
        letters = rng.sample(string.ascii_letters, sum(counts))
        batch, contracted = letters[:counts[0]], letters[counts[0]:counts[0] + counts[1]]
        left = letters[counts[0] + counts[1]:counts[0] + counts[1] + counts[2]]
        right = letters[counts[0] + counts[1] + counts[2]:]
        a, b, out = batch + contracted + left, batch + contracted + right, batch + left + right
        for indices in (a, b, out):
            rng.shuffle(indices)
        size = {letter: rng.randrange(1, 65) for letter in letters}
        calls.append(f"einsum_flops('{''.join(a)},{''.join(b)}->{''.join(out)}', "
                     f"{tuple(size[i] for i in a)}, {tuple(size[i] for i in b)})")
    return calls


# Hidden inputs of each student's own: these two count whole numbers of bytes and FLOPs, exact for
# any valid sizes, so any draw has one right answer with no tolerance to choose, and an answer
# written out for the fixed cases above does not carry over.
DRAWN = {"matmul_bytes": _drawn_matmul_bytes, "einsum_flops": _drawn_einsum_flops}
