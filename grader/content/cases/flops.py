"""Hidden checks of lesson 03 (matmul FLOPs, arithmetic intensity, roofline, MFU).
See grader/content/cases/__init__.py."""

from grader.content.cases import Case, raises

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
    # A prediction, graded within 10%: the answer is the ridge point, 295.3 tokens (the
    # intensity is about B while B << D, F). The exact crossing for a layer as wide as GPT-3's
    # MLP, (12288, 49152), is 305, 3% above: right too. Taking the sparse peak (twice the
    # answer) or fp32's 4 bytes per element (intensity B / 2) is not. float(): a whole number of
    # tokens, written as an int, is as good an answer.
    "predicted_critical_batch_h100": [Case("float(predicted_critical_batch_h100)", rel_tol=0.1)],
}
