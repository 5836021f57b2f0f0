"""Hidden checks of lesson 05 (AdamW, training memory, blockwise quantisation).
See grader/content/cases/__init__.py."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# AdamW and dequantisation results come out of several rounded float32 operations, and a
# student's correct code may order them differently (m / (1 - beta1**t) before or after the
# division, p - lr*wd*p instead of p * (1 - lr*wd)): each ordering moves a value by a few units in
# the last place, about 1e-7 relative, per step. 1e-6 allows that over the few steps run here;
# the bugs worth catching (coupled weight decay, a missing bias correction, eps inside the square
# root, decay after the update) move the values by 1e-3 or more. Every expected value is well
# away from 0, so a relative tolerance is enough. Integer results (codes, byte counts) are exact;
# no input sits on a rounding tie (x / absmax * 127 = k + 1/2), where computing x * (127 / absmax)
# instead could round the other way. tests/test_memory.py runs such variants through these cases.
_REL = 1e-6


def _adamw(param: str, grad: str, steps: int, hyper: str = "", returns: str = "p") -> str:
    """An expression that gives the tensor ``param`` the gradient ``grad``, takes ``steps`` AdamW
    steps with that fixed gradient and returns ``returns`` (``p`` or a tuple of its state)."""
    options = f", {hyper}" if hyper else ""
    return (f"(lambda p, opt: (setattr(p, 'grad', {grad}), [opt.step() for _ in range({steps})], "
            f"{returns})[-1])(*(lambda p: (p, AdamW([p]{options})))({param}.requires_grad_()))")


_P4 = "torch.tensor([1.0, -2.0, 3.0, 0.5])"
_G4 = "torch.tensor([0.1, -0.2, 0.3, -0.4])"
_P23 = "torch.tensor([[0.8, -1.2, 2.5], [-0.3, 1.7, -2.2]])"
_G23 = "torch.tensor([[0.05, 0.3, -0.7], [1.5, -0.02, 0.4]])"
_STATE = "(opt.state[p]['exp_avg'], opt.state[p]['exp_avg_sq'])"
_X10 = "torch.tensor([0.3, -1.15, 0.7, 0.05, -0.42, 2.2, 0.9, -0.61, 1.3, -0.27])"
_X33 = "torch.tensor([[0.21, -0.4, 0.1], [0.0, 0.0, 0.0], [1.0, -3.0, 0.5]])"  # a row of zeros

# quantize_blockwise's scales are each block's absmax: a maximum picks an input, rounds nothing.
EXACT = {"quantize_blockwise": "its floats are absmax values, picked from the input by a maximum"}

CASES: dict[str, list[Case | str]] = {
    "AdamW": [
        Case(_adamw(_P4, _G4, 1), rel_tol=_REL),  # defaults, one step: about p - lr * sign(g)
        Case(_adamw(_P4, _G4, 5, "lr=0.1, weight_decay=0.1"), rel_tol=_REL),
        Case(_adamw(_P23, _G23, 8, "lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.2"),
             rel_tol=_REL),
        Case(_adamw(_P23, _G23, 6, "lr=0.05, betas=(0.8, 0.99), weight_decay=0.0",
                    returns=_STATE), rel_tol=_REL),
        Case(_adamw(_P4, _G4, 3, "betas=(0.0, 0.0), lr=0.1"), rel_tol=_REL),  # m = g, v = g*g
        Case(_adamw(_P4, _G4, 4, "lr=0.0, weight_decay=0.5"), rel_tol=_REL),  # nothing moves
        Case(_adamw("torch.tensor([1.5, -0.75, 2.25], dtype=torch.float64)",
                    "torch.tensor([0.2, 0.01, -3.0], dtype=torch.float64)", 20,
                    "lr=0.02, weight_decay=0.3"), rel_tol=_REL),
        # Two parameter groups, the second with its own lr and no weight decay.
        Case("(lambda a, b: (setattr(a, 'grad', torch.tensor([0.5, -0.25])), "
             "setattr(b, 'grad', torch.tensor([[-1.0], [2.0]])), "
             "[opt.step() for opt in [AdamW([{'params': [a]}, {'params': [b], 'lr': 0.3, "
             "'weight_decay': 0.0}], lr=0.1, weight_decay=0.1)] for _ in range(4)], (a, b))[-1])"
             "(torch.tensor([1.0, 2.0]).requires_grad_(), "
             "torch.tensor([[-1.5], [0.75]]).requires_grad_())", rel_tol=_REL),
        # A parameter without a gradient is skipped: no change, no state. Its neighbour moves.
        Case("(lambda a, b, opt: (setattr(b, 'grad', torch.tensor([[0.25], [-1.0]])), "
             "[opt.step() for _ in range(3)], (a, len(opt.state[a]), b))[-1])"
             "(*(lambda a, b: (a, b, AdamW([a, b], lr=0.05, weight_decay=0.2)))"
             "(torch.tensor([1.0, -2.0, 3.0, 0.5]).requires_grad_(), "
             "torch.tensor([[-1.5], [0.75]]).requires_grad_()))", rel_tol=_REL),
        raises("AdamW([torch.zeros(2, requires_grad=True)], lr=-0.1)", "ValueError"),
        raises("AdamW([torch.zeros(2, requires_grad=True)], betas=(0.9, 1.0))", "ValueError"),
        raises("AdamW([torch.zeros(2, requires_grad=True)], weight_decay=-0.01)", "ValueError"),
        raises("AdamW([torch.zeros(2, requires_grad=True)], betas=(-0.1, 0.9))", "ValueError"),
    ],
    "training_memory": [
        "training_memory(1, 'fp32')",
        "training_memory(7_000_000_000, 'fp32')",
        "training_memory(1, 'mixed_bf16')",
        "training_memory(70_000_000_000, 'mixed_bf16')",
        "training_memory(256, 'adam8bit')",
        "training_memory(257, 'adam8bit')",  # a second, partial block of scales
        "training_memory(0, 'adam8bit')",
        "training_memory(405_000_000_000, 'adam8bit')",
        "training_memory(2**53 + 1, 'adam8bit')",  # a float ceiling gives one block too few
        raises("training_memory(-1, 'fp32')", "ValueError"),
        raises("training_memory(10, 'bf16')", "ValueError"),
    ],
    "quantize_blockwise": [
        f"quantize_blockwise({_X10}, 4)",  # the last block holds 2 elements
        f"quantize_blockwise({_X10})",  # one block of the default 256
        f"quantize_blockwise({_X10}.reshape(2, 5), block_size=5)",
        f"quantize_blockwise({_X33}, 3)",
        "quantize_blockwise(torch.tensor([0.01, 0.02, -0.03, 100.0, 0.04, -0.05, 0.06, 0.07]), 4)",
        "quantize_blockwise(torch.tensor([0.3, -2.0, 0.0, 5.0]), 1)",
        "quantize_blockwise(torch.tensor([1.5, -0.375, 0.8125, 3.0, -0.2], "
        "dtype=torch.bfloat16), 3)",
        "quantize_blockwise(torch.zeros(0))",
        raises("quantize_blockwise(torch.ones(4), 0)", "ValueError"),
        raises("quantize_blockwise(torch.tensor([1.0, float('nan')]))", "ValueError"),
        raises("quantize_blockwise(torch.arange(4))", "TypeError"),
        raises("quantize_blockwise(torch.tensor([1.0, 1e39], dtype=torch.float64))",
               "ValueError"),  # finite in float64, inf in float32
        # A block of zeros: 0 / 0 is NaN, and what its cast to int8 gives is undefined (0 on
        # the usual CPUs, by luck): the codes alone cannot show the missing guard, the casts do.
        "nan_casts('quantize_blockwise(torch.zeros(8), 4)')",
        f"nan_casts('quantize_blockwise({_X33}, 3)')",
    ],
    "dequantize_blockwise": [
        Case("dequantize_blockwise(torch.tensor([127, -64, 3, 0, 127, -127], dtype=torch.int8), "
             "torch.tensor([2.0, 0.5]), (2, 3), 4)", rel_tol=_REL),
        Case("dequantize_blockwise(torch.tensor([5, -127, 90, 127, 0], dtype=torch.int8), "
             "torch.tensor([3.7]), (5,))", rel_tol=_REL),
        Case("dequantize_blockwise(torch.tensor([1, -2, 3, -4, 5, -6, 7, -127], dtype=torch.int8), "
             "torch.tensor([0.1]), (2, 2, 2), block_size=8)", rel_tol=_REL),
        "dequantize_blockwise(torch.zeros(6, dtype=torch.int8), torch.zeros(2), (6,), 3)",
        Case(f"(lambda x: dequantize_blockwise(*quantize_blockwise(x, 4), x.shape, 4))({_X10})",
             rel_tol=_REL),
        Case(f"(lambda x: dequantize_blockwise(*quantize_blockwise(x, 3), x.shape, 3))({_X33})",
             rel_tol=_REL),
        # Near float32's maximum, float32 arithmetic overflows (q * absmax, or 127 * (absmax /
        # 127) rounded up); float64 does not.
        Case("dequantize_blockwise(*quantize_blockwise(torch.tensor([3.3e38, -1.0e38, 2.0, 1.0]), "
             "2), (4,), 2)", rel_tol=_REL),
        Case("dequantize_blockwise(torch.tensor([-127, 5, 127, 0], dtype=torch.int8), "
             "torch.tensor([torch.finfo(torch.float32).max, 1.0]), (2, 2), 2)", rel_tol=_REL),
        raises("dequantize_blockwise(torch.zeros(4), torch.ones(1), (4,), 4)", "TypeError"),
        raises("dequantize_blockwise(torch.zeros(4, dtype=torch.int8), torch.ones(1), (5,), 4)",
               "ValueError"),
        raises("dequantize_blockwise(torch.zeros(4, dtype=torch.int8), torch.ones(1), (4,), 2)",
               "ValueError"),
        raises("dequantize_blockwise(torch.zeros(4, dtype=torch.int8), torch.ones(1), (4,), 0)",
               "ValueError"),
    ],
    "largest_trainable_params": [
        "largest_trainable_params(8, 80e9, 16)",  # 8 H100s, AdamW: 40e9 parameters
        "largest_trainable_params(1, 80e9, 16)",
        "largest_trainable_params(1, 80e9, 18)",
        "largest_trainable_params(8, 80e9, 10 + 1 / 32)",  # 8-bit Adam with its scales
        "largest_trainable_params(8, 141e9, 16)",
        "largest_trainable_params(0, 80e9, 16)",
        "largest_trainable_params(3, 40e9, 12)",
        "largest_trainable_params(1, 24e9, 0.1)",  # 24e9 / 0.1 rounds up to 2.4e11
    ],
    # A prediction, graded within 10%: the answer is 16 bytes for each of the MLP's 3288
    # parameters. Forgetting the biases (3200 parameters) lands 2.7% low and passes: the point is
    # the 16 bytes per parameter. Leaving out the gradients (12 bytes) or the optimizer's state
    # (8) lands 25% or 50% low, counting only the weights 75% low, and those fail. float()
    # accepts the number written as an int or as a float.
    "predicted_mlp_training_bytes": [Case("float(predicted_mlp_training_bytes)", rel_tol=0.1)],
}

# Each student's MLP for the graded prediction (its widths: input, two hidden layers, output).
# In every one the biases are under 3% of the parameters, so 16 bytes per weight alone passes the
# band of 10% and 12 (no AdamW state) or 8 bytes per parameter do not; the answers (52,608
# bytes for the default, which the lesson's cells after the prediction measure; 127,136, 156,416,
# 98,752 and 261,248) are more than 10% apart. tests/test_memory.py measures each one's tensors.
VARIANTS = {
    "predicted_mlp_training_bytes": Variants(
        ("mlp_widths",),
        (((32, 40, 40, 8),), ((48, 64, 64, 10),), ((24, 80, 80, 16),), ((40, 56, 56, 12),),
         ((64, 96, 96, 8),)),
        "the MLP is Linear({mlp_widths[0]}, {mlp_widths[1]}), Tanh, "
        "Linear({mlp_widths[1]}, {mlp_widths[2]}), Tanh, "
        "Linear({mlp_widths[2]}, {mlp_widths[3]}), each Linear with a bias"),
}


def _drawn_training_memory(rng: random.Random) -> list[str]:
    """Three counts of the student's own: any non-negative parameter count and recipe is valid
    input, and the answer is whole bytes (exact), so the inputs are free. One count sits just
    past a block of 256, where the 8-bit scales take a partial block."""
    recipes = ("fp32", "mixed_bf16", "adam8bit")
    return [f"training_memory({rng.randrange(1, 10**12)}, {rng.choice(recipes)!r})",
            f"training_memory({rng.randrange(1, 10**6) * 256 + rng.randrange(1, 256)}, "
            "'adam8bit')",
            f"training_memory({rng.randrange(10**6, 10**9)}, {rng.choice(recipes)!r})"]


DRAWN = {"training_memory": _drawn_training_memory}
