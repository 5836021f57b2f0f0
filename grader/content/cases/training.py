"""Hidden checks of lesson 06 (one training step: FLOPs, saved activations, loss scaling,
checkpoint bytes). See grader/content/cases/__init__.py."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# loss_scale_update returns float32 values, as GradScaler keeps its scale. Where a product is
# not exact in float32 (a factor such as 1.7 or 0.3, a scale such as 3.3), rounding it to
# float32 moves it by at most 2**-24 (6e-8) relative; a student who computes in float64 and
# skips that rounding is as right as GradScaler is, so those cases allow 1e-6 relative. A wrong
# factor or a wrong branch moves the scale by 1% or more. Powers of two are exact in both.
_F32 = {"rel_tol": 1e-6}

_TIED = ("(lambda m: (setattr(m[1], 'weight', m[0].weight), m)[-1])"
         "(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)))")
_AMSGRAD = ("(lambda m: (lambda o: (m(torch.ones(2, 3)).sum().backward(), o.step(), "
            "checkpoint_bytes(m, o))[-1])(torch.optim.Adam(m.parameters(), amsgrad=True)))"
            "(nn.Linear(3, 2))")

CASES: dict[str, list[Case | str]] = {
    "train_step_flops": [
        "train_step_flops(2, 16, 8, 50, 3)",
        "train_step_flops(2, 16, 8, 50, 3, recompute=True)",
        "train_step_flops(1, 1, 1, 1, 1)",
        "train_step_flops(1, 1, 1, 1, 1, None, True)",
        "train_step_flops(3, 12, 7, 20, 2, d_ff=20, recompute=True)",
        "train_step_flops(2, 8, 256, 30, 2, recompute=True)",  # long context: T = 32 d
        "train_step_flops(12, 768, 1024, 50257, 8)",  # GPT-2 small's shape, 8 sequences
        "train_step_flops(96, 12288, 2048, 50257, 1536)",  # GPT-3: 3.2M tokens a step
        "train_step_flops(32, 4096, 4096, 32000, 1, d_ff=16512, recompute=True)",  # Llama 2 7B
        raises("train_step_flops(2, 16, 8, 50, 0)", "ValueError"),
        raises("train_step_flops(2, 16.5, 8, 50, 2)", "TypeError"),
        raises("train_step_flops(2.5, 64, 64, 256, 8)", "TypeError"),
        raises("train_step_flops(2, 16, 8, 50, 2, recompute='yes')", "TypeError"),
    ],
    "saved_activation_bytes": [
        "saved_activation_bytes(2, 16, 4, 8, 50, 3)",
        "saved_activation_bytes(2, 16, 4, 8, 50, 3, dtype=torch.bfloat16)",
        "saved_activation_bytes(2, 16, 4, 8, 50, 3, checkpoint_blocks=True)",
        "saved_activation_bytes(1, 1, 1, 1, 1, 1)",
        "saved_activation_bytes(3, 12, 3, 7, 20, 2, d_ff=20, dtype=torch.float64)",
        "saved_activation_bytes(2, 8, 2, 256, 30, 2)",  # long context: the scores dominate
        "saved_activation_bytes(2, 8, 2, 256, 30, 2, None, torch.bfloat16, True)",
        "saved_activation_bytes(96, 12288, 96, 2048, 50257, 1, dtype=torch.bfloat16)",  # GPT-3
        "saved_activation_bytes(32, 4096, 32, 4096, 32000, 1, d_ff=16512, dtype=torch.bfloat16, "
        "checkpoint_blocks=True)",
        raises("saved_activation_bytes(2, 16, 3, 8, 50, 2)", "ValueError"),  # 3 heads, d = 16
        raises("saved_activation_bytes(2, 16, 4, 8, 50, 0)", "ValueError"),
        raises("saved_activation_bytes(2, 16, 4, 8, 50, 2, dtype=torch.int32)", "TypeError"),
        raises("saved_activation_bytes(2, 16, 4, 8, 50, 2, checkpoint_blocks=1)", "TypeError"),
        raises("saved_activation_bytes(2, 16.0, 4, 8, 50, 2)", "TypeError"),
        raises("saved_activation_bytes(2.5, 64, 4, 64, 256, 8)", "TypeError"),
    ],
    "loss_scale_update": [
        "loss_scale_update(65536.0, 0, False)",
        "loss_scale_update(65536.0, 1999, False)",  # the 2000th clean step: the scale doubles
        "loss_scale_update(65536.0, 1234, True)",
        "loss_scale_update(1.0, 4, False, 2.0, 0.5, 5)",
        "loss_scale_update(1024.0, 3, True, growth_factor=4.0, backoff_factor=0.25)",
        Case("loss_scale_update(3.3, 0, True, 1.7, 0.3, 2)", **_F32),
        Case("loss_scale_update(3.3, 1, False, 1.7, 0.3, 2)", **_F32),
        Case("loss_scale_update(0.1, 0, False)", **_F32),  # stored as float32(0.1)
        "loss_scale_update(2.0 ** 127, 0, False, growth_interval=1)",  # 2**128 overflows
        "loss_scale_update(0.0, 0, True)",
        "loss_scale_update(1024.0, 9, True, growth_interval=10)",  # overflow wins at the interval
        # Rounded to float32 first, on a step that keeps the scale: exactly float32's value (the
        # tolerance of the products cannot see a rounding of the scale alone).
        "loss_scale_update(1000.1, 3, False)[0] == _float32(1000.1)",
        raises("loss_scale_update(-1.0, 0, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, 1)", "TypeError"),
        raises("loss_scale_update(65536.0, 2000, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, growth_factor=1.0)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, backoff_factor=1.5)", "ValueError"),
        raises("loss_scale_update(math.inf, 0, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, growth_factor=math.inf)", "ValueError"),
        raises("loss_scale_update(65536.0, -1, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, backoff_factor=0.0)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, growth_interval=0)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, growth_interval=2.5)", "TypeError"),
    ],
    "checkpoint_bytes": [
        "checkpoint_bytes(*run_recipe(TinyTransformer(50, 16, 2, 4), 'fp32'))",
        "checkpoint_bytes(*run_recipe(TinyTransformer(50, 16, 2, 4), 'mixed_bf16'))",
        "checkpoint_bytes(*run_recipe(TinyTransformer(50, 16, 2, 4), 'adam8bit'))",
        "checkpoint_bytes(*run_recipe(TinyTransformer(50, 16, 2, 4), 'fp32', n_steps=0))",
        "checkpoint_bytes(*run_recipe(TinyTransformer(30, 8, 1, 2, tied_embeddings=True), "
        "'fp32', n_steps=2))",
        f"checkpoint_bytes({_TIED}, torch.optim.SGD({_TIED}.parameters(), lr=0.1))",
        _AMSGRAD,  # Adam's third moment buffer, max_exp_avg_sq
        raises("checkpoint_bytes(nn.Linear(2, 2).state_dict(), "
               "torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))", "TypeError"),
        raises("checkpoint_bytes(nn.Linear(2, 2), 'adamw')", "TypeError"),
    ],
    # A prediction, graded within 5%, for each student's own batch (VARIANTS below): the default,
    # 8 sequences of 64 tokens, needs 8,153,092 bytes, three quarters of them saved activations.
    # In every variant the small terms may be missed and still pass: the causal masks (0.6% at
    # most, at 128 tokens), the token ids and targets (0.11%), the norms' statistics (less), all
    # of them together 0.8% at most. Missing a real part fails, each at least: the gradients
    # (6.4% low), AdamW's state (13%), everything saved outside the blocks (7.0%: the log-softmax
    # over the vocabulary is most of it), the softmax outputs, B·h·T² per block (6.9%), or the
    # activations altogether. tests/test_training.py checks these shares for every variant.
    # float() accepts the number written as an int or as a float.
    "predicted_step_bytes": [Case("float(predicted_step_bytes)", rel_tol=0.05)],
}

# Each student's batch for the graded prediction, on the same model of section 1: the default's
# 8 sequences of 64 tokens, 16 shorter ones, or fewer longer ones (the softmax outputs grow with
# T², the rest with B·T). Each keeps the total between 5.7 and 8.2 MB, so the gradients stay
# above the band of 5% (a larger batch would let them be forgotten), and every two answers are
# more than 5% apart (8,153,092 bytes for the default, which the lesson's cells after the
# prediction measure; 7,622,660, 7,044,612, 5,678,084 and 6,607,172); tests/test_training.py
# measures each step's tensors and the hooks' saved storages.
VARIANTS = {
    "predicted_step_bytes": Variants(
        ("step_batch_size", "step_seq_len"),
        ((8, 64), (16, 32), (4, 96), (2, 128), (3, 112)),
        "the step's batch is step_batch_size = {step_batch_size} sequences of "
        "step_seq_len = {step_seq_len} tokens"),
}


# Drawn hidden inputs: both counts are exact integers for every valid shape, so any shape gives
# a check with one right answer, and a function that only fits the visible checks' shapes fails
# a student's own. Small shapes, as in the fixed cases, that tests/test_training.py can measure:
# heads of width 2 and more and contexts of 2 and more keep FlopCounterMode an oracle for them.
def _drawn_step_flops(rng: random.Random) -> list[str]:
    cases = []
    for recompute in (False, True, rng.choice((False, True))):
        d_ff = rng.randrange(4, 129) if rng.random() < 0.5 else None
        cases.append(f"train_step_flops({rng.randint(1, 4)}, {rng.randrange(2, 65)}, "
                     f"{rng.randint(2, 96)}, {rng.randint(2, 300)}, {rng.randint(1, 8)}"
                     + (f", d_ff={d_ff}" if d_ff else "")
                     + (", recompute=True" if recompute else "") + ")")
    return cases


def _drawn_saved_bytes(rng: random.Random) -> list[str]:
    cases = []
    for checkpoint_blocks in (False, True, rng.choice((False, True))):
        n_heads = rng.randint(1, 4)
        d_ff = rng.randrange(4, 129) if rng.random() < 0.5 else None
        dtype = rng.choice(("float32", "bfloat16", "float16", "float64"))
        cases.append(f"saved_activation_bytes({rng.randint(1, 4)}, "
                     f"{n_heads * rng.randint(2, 16)}, {n_heads}, {rng.randint(2, 96)}, "
                     f"{rng.randint(2, 300)}, {rng.randint(1, 8)}"
                     + (f", d_ff={d_ff}" if d_ff else "") + f", dtype=torch.{dtype}"
                     + (", checkpoint_blocks=True" if checkpoint_blocks else "") + ")")
    return cases


DRAWN = {"train_step_flops": _drawn_step_flops, "saved_activation_bytes": _drawn_saved_bytes}
