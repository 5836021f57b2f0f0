"""Hidden checks of lesson 06 (one training step: FLOPs, saved activations, loss scaling,
checkpoint bytes). See grader/content/cases/__init__.py."""

from grader.content.cases import Case, raises

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
        raises("loss_scale_update(-1.0, 0, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, 1)", "TypeError"),
        raises("loss_scale_update(65536.0, 2000, False)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, growth_factor=1.0)", "ValueError"),
        raises("loss_scale_update(65536.0, 0, False, backoff_factor=1.5)", "ValueError"),
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
    # A prediction, graded within 5%: 8,153,092 bytes, three quarters of them saved activations.
    # The small terms may be missed and still pass: the causal masks or the token ids and targets
    # (0.1% each), the norms' statistics (less). Missing a real part fails: the gradients (6.4%
    # low), AdamW's state (13%), everything saved outside the blocks (9.8%: the log-softmax over
    # the vocabulary is most of it), or the activations altogether. float() accepts the number
    # written as an int or as a float.
    "predicted_step_bytes": [Case("float(predicted_step_bytes)", rel_tol=0.05)],
}
