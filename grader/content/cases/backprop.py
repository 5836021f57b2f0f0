"""Hidden checks of lesson 04 (backprop FLOPs, transformer accounting, 6ND).
See grader/content/cases/__init__.py."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# two_layer_forward_backward in float32: a student may order the same matmuls and the 2/numel
# factor differently (2 * y / n, y * (2 / n), (y / n) * 2), which moves results by a few ulps
# (float32 eps 1.2e-7) on sums of at most 4 terms. rel_tol 1e-6 allows that and nothing more;
# abs_tol covers entries whose exact value is 0. float64 gets 1e-12.
_F32 = {"rel_tol": 1e-6, "abs_tol": 1e-7}
_F64 = {"rel_tol": 1e-12, "abs_tol": 1e-15}
# Products and quotients of several rounded floats: another order may differ in the last bit.
_REL = 1e-12

CASES: dict[str, list[Case | str]] = {
    "two_layer_forward_backward": [
        Case("two_layer_forward_backward(torch.arange(6.).reshape(2, 3) / 5, torch.eye(3), "
             "torch.ones(3, 2))", **_F32),
        # every value a small integer: exact in any order
        "two_layer_forward_backward(torch.ones(1, 1), torch.full((1, 1), 2.0), "
        "torch.full((1, 1), 3.0))",
        Case("two_layer_forward_backward(torch.tensor([[1.0, -2.0]]), "
             "torch.tensor([[0.5, 1.0], [-1.0, 0.25]]), torch.tensor([[2.0, 0.0, -1.0, 1.0], "
             "[1.0, 3.0, 0.5, -2.0]]))", **_F32),  # K > D: w2 is (2, 4)
        Case("two_layer_forward_backward(torch.linspace(-1, 1, 12, dtype=torch.float64)"
             ".reshape(4, 3), torch.linspace(0.5, -0.5, 9, dtype=torch.float64).reshape(3, 3), "
             "torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64))", **_F64),
        Case("two_layer_forward_backward(torch.arange(8.).reshape(4, 2) - 3.5, "
             "torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([[0.5], [-0.25]]))", **_F32),
        # x has 3 columns but w1 4 rows; x is 1-d; w1's dtype is not x's
        raises("two_layer_forward_backward(torch.ones(2, 3), torch.ones(4, 2), torch.ones(2, 1))",
               "ValueError"),
        raises("two_layer_forward_backward(torch.ones(3), torch.ones(3, 2), torch.ones(2, 1))",
               "ValueError"),
        raises("two_layer_forward_backward(torch.ones(2, 3), torch.ones(3, 2, dtype=torch.float64),"
               " torch.ones(2, 1))", "ValueError"),
        raises("two_layer_forward_backward(torch.ones(2, 3, dtype=torch.int64), "
               "torch.ones(3, 2, dtype=torch.int64), torch.ones(2, 1, dtype=torch.int64))",
               "ValueError"),
        raises("two_layer_forward_backward(torch.ones(0, 3), torch.ones(3, 2), torch.ones(2, 1))",
               "ValueError"),
    ],
    "two_layer_flops": [
        "two_layer_flops(2, 3, 4)",
        "two_layer_flops(2, 3, 4, input_requires_grad=True)",
        "two_layer_flops(1, 1, 1)",
        "two_layer_flops(1, 1, 1, True)",
        "two_layer_flops(32, 512, 10)",
        "two_layer_flops(4096, 1024, 1024, input_requires_grad=False)",
        "two_layer_flops(4096, 1024, 1024, input_requires_grad=True)",
        raises("two_layer_flops(0, 3, 4)", "ValueError"),
        raises("two_layer_flops(2, 3.5, 4)", "TypeError"),
    ],
    "transformer_params": [
        "transformer_params(2, 16, 50)",
        "transformer_params(2, 16, 50, tied_embeddings=True)",
        "transformer_params(1, 1, 1)",
        "transformer_params(3, 12, 20, d_ff=20)",
        "transformer_params(12, 768, 50257, tied_embeddings=True)",  # GPT-2 small's matrices
        "transformer_params(96, 12288, 50257)",  # GPT-3 175B, untied
        "transformer_params(32, 4096, 32000, d_ff=16512)",  # Llama 2 7B's SwiGLU as 2 matrices
        raises("transformer_params(0, 16, 50)", "ValueError"),
        raises("transformer_params(2.5, 16, 50)", "TypeError"),
    ],
    "transformer_forward_flops": [
        "transformer_forward_flops(2, 16, 12, 50)",
        "transformer_forward_flops(1, 1, 1, 1)",
        "transformer_forward_flops(3, 12, 7, 20, d_ff=20)",
        "transformer_forward_flops(2, 8, 96, 30)",  # long context: attention dominates
        "transformer_forward_flops(12, 768, 1024, 50257)",  # GPT-2 small, one full context
        "transformer_forward_flops(96, 12288, 2048, 50257)",  # GPT-3 175B
        raises("transformer_forward_flops(0, 64, 128, 1000)", "ValueError"),
        raises("transformer_forward_flops(2.5, 64, 128, 1000)", "TypeError"),
    ],
    "training_flops": [
        Case("training_flops(70e9, 15e12)", rel_tol=_REL),
        "training_flops(1, 1)",
        "training_flops(0, 10**12)",
        Case("training_flops(175e9, 300e9)", rel_tol=_REL),  # GPT-3: 3.15e23
        "training_flops(124439808, 1024)",
        raises("training_flops(-1.0, 1e12)", "ValueError"),
    ],
    "training_days": [
        Case("training_days(6 * 70e9 * 15e12, 1024, 989.4e12, 0.5)", rel_tol=_REL),
        "training_days(86400.0, 1, 1.0, 1.0)",
        "training_days(8 * 86400, 2, 4.0, 0.5)",
        "training_days(0.0, 8, 312e12, 0.4)",
        Case("training_days(3.15e23, 1024, 312e12, 0.4)", rel_tol=_REL),
        Case("training_days(6 * 70e9 * 15e12, 1024, 1978.9e12, 0.5)", rel_tol=_REL),
        raises("training_days(1e24, 1024, 989e12, 0.0)", "ValueError"),
        raises("training_days(1e24, 1024, 989e12, 1.5)", "ValueError"),
        raises("training_days(-1e24, 1024, 989e12, 0.5)", "ValueError"),
        raises("training_days(1e24, 0, 989e12, 0.5)", "ValueError"),
        raises("training_days(math.inf, 1024, 989e12, 0.5)", "ValueError"),
        raises("training_days(1e24, 1024, math.nan, 0.5)", "ValueError"),
        raises("training_days('1e24', 8, 989e12, 0.5)", "ValueError"),  # not a real number
        raises("training_days(1e24, 2.5, 989e12, 0.5)", "TypeError"),
    ],
    # A prediction, graded within 10% of the answer for the student's run (VARIANTS below):
    # 143.9 days for the default. Rounding the peak to 1000 TFLOP/s (1% off) or the answer to
    # two significant figures (at most 5% off: 140 or 150 days for the default) is right; the
    # sparse figure (half the answer), leaving out the MFU (0.3 to 0.5 times it) or counting 2ND
    # (a third) is not, in every variant. float(): a whole number of days, written as an int, is
    # as good an answer.
    "predicted_days_70b": [Case("float(predicted_days_70b)", rel_tol=0.1)],
}

# Each student's training run for the graded prediction, on H100 SXM GPUs in bf16 (models and
# token counts of published runs): 143.9 days (the default), 82.3 (Llama 3 8B's 15T tokens on 256
# GPUs), 65.1 (Llama 3 405B on 16384), 15.8 (Llama 2 13B) and 12.0 (GPT-3 175B's 300B tokens).
# Every two answers are more than 10% apart, so the default's number, or another run's, does not
# pass; tests/test_backprop.py checks each against a count of its own.
VARIANTS = {
    "predicted_days_70b": Variants(
        ("run_params_billions", "run_tokens_trillions", "run_gpus", "run_mfu"),
        ((70, 15, 1024, 0.5), (8, 15, 256, 0.4), (405, 15, 16384, 0.4), (13, 2, 256, 0.45),
         (175, 0.3, 1024, 0.3)),
        "a model of {run_params_billions:g}B parameters trained on {run_tokens_trillions:g}T "
        "tokens, on {run_gpus} H100 SXM GPUs at {run_mfu:.0%} MFU, in bf16"),
}


def _d_ff(rng: random.Random, d_model: int) -> str:
    """A d_ff argument: none (4 x d_model) half the time, else a width of its own."""
    return "" if rng.random() < 0.5 else f", d_ff={rng.randrange(d_model, 8 * d_model + 1)}"


def _drawn_transformer_params(rng: random.Random) -> list[str]:
    calls = []
    for _ in range(3):
        d_model = 64 * rng.randrange(1, 97)
        tied = ", tied_embeddings=True" if rng.random() < 0.5 else ""
        calls.append(f"transformer_params({rng.randrange(1, 49)}, {d_model}, "
                     f"{rng.randrange(1000, 200_001)}{_d_ff(rng, d_model)}{tied})")
    return calls


def _drawn_transformer_forward_flops(rng: random.Random) -> list[str]:
    calls = []
    for _ in range(3):
        d_model = 64 * rng.randrange(1, 97)
        calls.append(f"transformer_forward_flops({rng.randrange(1, 49)}, {d_model}, "
                     f"{rng.randrange(1, 8193)}, {rng.randrange(1000, 200_001)}"
                     f"{_d_ff(rng, d_model)})")
    return calls


# Hidden inputs of each student's own: these two count whole numbers of parameters and FLOPs,
# exact for any positive sizes, so any draw has one right answer with no tolerance to choose, and
# an answer written out for the fixed cases above does not carry over. Widths are multiples of 64
# so that tests/test_backprop.py can build each model (heads of 64) and count it.
DRAWN = {"transformer_params": _drawn_transformer_params,
         "transformer_forward_flops": _drawn_transformer_forward_flops}
