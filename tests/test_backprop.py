"""Lesson 04 reference code against autograd, FlopCounterMode, a real torch transformer's
parameters and the published models of data/models.json."""

from __future__ import annotations

import ast
import itertools
import json
import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from grader.content.cases import as_case, reference_value
from grader.content.cases.backprop import DRAWN as BACKPROP_DRAWN
from grader.content.cases.backprop import VARIANTS as BACKPROP_VARIANTS
from grader.content.lessons import load_lesson
from grader.grading.plans import variant_answer
from solutions.backprop import (
    chinchilla_forward_flops,
    choice_step_vs_6nt,
    gated_mlp_d_ff,
    kaplan_forward_flops,
    model_params,
    per_component_flops,
    predicted_days_70b,
    predicted_step_ratio,
    training_days,
    training_flops,
    transformer_forward_flops,
    transformer_params,
    two_layer_flops,
    two_layer_forward_backward,
)
from solutions.hardware import load_hardware
from solutions.tiny_transformer import TinyTransformer

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
H100_BF16 = load_hardware()["H100 SXM"]["peak_flops"]["bf16"]
# The first torch and FlopCounterMode calls are slow (lazy initialisation): no per-example deadline.
torch_settings = settings(deadline=None, max_examples=40)
size = st.integers(1, 6)

# (n_layers, d_model, n_heads, seq_len, vocab_size, d_ff): small enough to run in milliseconds.
SHAPES = [
    (1, 8, 1, 5, 11, None),
    (2, 16, 4, 12, 50, None),
    (3, 12, 3, 7, 20, 20),  # d_ff other than 4 * d_model
    (2, 8, 2, 96, 30, None),  # long context: T = 12 d, attention dominates
]


def counted_flops(fn, *args) -> int:
    """What FlopCounterMode counts while ``fn(*args)`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def tiny(n_layers, d_model, n_heads, vocab_size, d_ff=None, tied=False) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(vocab_size, d_model, n_layers, n_heads, d_ff, tied_embeddings=tied)


# ---------------------------------------------------------------- two layers, by hand vs autograd


def autograd_two_layer(x, w1, w2):
    w1, w2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    loss = (x @ w1 @ w2).pow(2).mean()
    loss.backward()
    return loss.detach(), w1.grad, w2.grad


@torch_settings
@given(size, size, size, st.integers(0, 2**31))
def test_two_layer_gradients_equal_autograd_in_float64(B: int, D: int, K: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, w1, w2 = (torch.randn(*s, generator=gen, dtype=torch.float64)
                 for s in ((B, D), (D, D), (D, K)))
    ours, theirs = two_layer_forward_backward(x, w1, w2), autograd_two_layer(x, w1, w2)
    # Both sides do the same matmuls, maybe in another order or blocking: values of order 1 to
    # 100 summed over at most 36 terms differ by a few ulps of 2.2e-16. 1e-12 leaves a wide
    # margin yet fails on any wrong factor (a missing 2 or 1/numel is off by 50% or more).
    for got, want in zip(ours, theirs, strict=True):
        assert got.dtype == torch.float64 and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_two_layer_gradients_equal_autograd_in_float32() -> None:
    gen = torch.Generator().manual_seed(4)
    x, w1, w2 = torch.randn(8, 16, generator=gen), torch.randn(16, 16, generator=gen), \
        torch.randn(16, 5, generator=gen)
    # float32 (eps 1.2e-7), sums of 16 products of values up to ~10: agree to ~1e-6 relative.
    for got, want in zip(two_layer_forward_backward(x, w1, w2), autograd_two_layer(x, w1, w2),
                         strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_two_layer_returns_a_zero_dim_loss_and_gradients_shaped_like_the_weights() -> None:
    loss, grad_w1, grad_w2 = two_layer_forward_backward(torch.ones(1, 1), torch.full((1, 1), 2.0),
                                                        torch.full((1, 1), 3.0))
    # y = 6, loss = 36, dL/dy = 12, dL/dw2 = h * 12 = 24, dL/dw1 = x * 12 * w2 = 36
    assert loss.shape == () and loss.item() == 36.0
    assert grad_w1.tolist() == [[36.0]] and grad_w2.tolist() == [[24.0]]


@pytest.mark.parametrize("shapes", [((2, 3), (4, 4), (4, 2)), ((2, 3), (3, 3), (4, 2)),
                                    ((3,), (3, 3), (3, 2)), ((0, 3), (3, 3), (3, 2))])
def test_two_layer_forward_backward_rejects_shapes_that_do_not_chain(shapes) -> None:
    with pytest.raises(ValueError):
        two_layer_forward_backward(*(torch.ones(s) for s in shapes))


def test_two_layer_forward_backward_rejects_mixed_or_integer_dtypes() -> None:
    with pytest.raises(ValueError, match="dtype"):
        two_layer_forward_backward(torch.ones(2, 3), torch.ones(3, 3, dtype=torch.float64),
                                   torch.ones(3, 2))
    with pytest.raises(ValueError, match="floating"):
        two_layer_forward_backward(torch.ones(2, 3, dtype=torch.int64), torch.ones(3, 3),
                                   torch.ones(3, 2))


# ---------------------------------------------------------------- two layers, FLOPs


def measured_two_layer_flops(B: int, D: int, K: int, input_requires_grad: bool) -> dict[str, int]:
    x = torch.randn(B, D, requires_grad=input_requires_grad)
    w1, w2 = torch.randn(D, D, requires_grad=True), torch.randn(D, K, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        loss = (x @ w1 @ w2).pow(2).mean()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return {"forward": forward.get_total_flops(), "backward": backward.get_total_flops()}


@torch_settings
@given(size, size, size, st.booleans())
def test_two_layer_flops_equal_flop_counter(B: int, D: int, K: int, input_grad: bool) -> None:
    flops = two_layer_flops(B, D, K, input_requires_grad=input_grad)
    assert list(flops) == ["forward", "backward"] and all(type(v) is int for v in flops.values())
    assert flops == measured_two_layer_flops(B, D, K, input_grad)


@torch_settings
@given(size, size, size)
def test_skipping_the_input_gradient_puts_a_training_step_below_6_params_tokens(B, D, K) -> None:
    """6 x params x tokens assumes every matmul has three: forward, weight gradient, input
    gradient. The first layer's input gradient is only computed when x needs one, so a step
    with plain data as input does 6·B·(D² + DK) - 2·B·D² FLOPs."""
    six_nd = 6 * (D * D + D * K) * B
    with_grad, without = two_layer_flops(B, D, K, True), two_layer_flops(B, D, K, False)
    assert with_grad["backward"] == 2 * with_grad["forward"]
    assert sum(with_grad.values()) == six_nd
    assert sum(without.values()) == six_nd - 2 * B * D * D


def test_flop_counter_counts_only_the_matmuls_of_the_two_layer_step() -> None:
    x = torch.randn(3, 4)
    w1, w2 = torch.randn(4, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        (x @ w1 @ w2).pow(2).mean().backward()
    ops = {str(op) for op in counter.get_flop_counts()["Global"]}
    assert ops == {"aten.mm"}  # pow, mean and their gradients are not counted at all


@pytest.mark.parametrize("args", [(0, 2, 3), (2, -1, 3), (2, 3, 0)])
def test_two_layer_flops_rejects_sizes_below_one(args) -> None:
    with pytest.raises(ValueError, match="positive"):
        two_layer_flops(*args)


def test_two_layer_flops_rejects_non_integer_sizes_and_flags() -> None:
    with pytest.raises(TypeError):
        two_layer_flops(2.5, 3, 4)
    with pytest.raises(TypeError):
        two_layer_flops(2, 3, 4, input_requires_grad="yes")


# ---------------------------------------------------------------- the tiny transformer


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_transformer_params_equals_numel_of_the_tiny_transformer(shape, tied: bool) -> None:
    n_layers, d_model, n_heads, _, vocab_size, d_ff = shape
    model = tiny(n_layers, d_model, n_heads, vocab_size, d_ff, tied)
    params = transformer_params(n_layers, d_model, vocab_size, d_ff, tied_embeddings=tied)
    assert type(params) is int
    assert params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("n_layers", "d_model", "vocab_size"), [(1, 1, 1), (12, 768, 50257),
                                                                 (96, 12288, 50257)])
def test_transformer_params_is_12_L_d_squared_plus_embeddings(n_layers, d_model, vocab_size):
    untied = transformer_params(n_layers, d_model, vocab_size)
    assert untied == 12 * n_layers * d_model**2 + 2 * vocab_size * d_model
    assert untied - transformer_params(n_layers, d_model, vocab_size, tied_embeddings=True) \
        == vocab_size * d_model


@pytest.mark.parametrize("shape", SHAPES)
def test_transformer_forward_flops_equals_flop_counter(shape) -> None:
    n_layers, d_model, n_heads, seq_len, vocab_size, d_ff = shape
    model, batch = tiny(n_layers, d_model, n_heads, vocab_size, d_ff), 2
    tokens = torch.randint(0, vocab_size, (batch, seq_len))
    flops = transformer_forward_flops(n_layers, d_model, seq_len, vocab_size, d_ff)
    assert type(flops) is int
    assert batch * flops == counted_flops(model, tokens)


def test_heads_do_not_change_the_flops() -> None:
    tokens = torch.randint(0, 20, (1, 9))
    # d_head >= 2: with d_head = 1 the einsum for q @ kᵀ contracts nothing and runs as an
    # elementwise multiply, which FlopCounterMode does not count (see lesson 03).
    counts = {h: counted_flops(tiny(2, 16, h, 20), tokens) for h in (1, 2, 4, 8)}
    assert len(set(counts.values())) == 1
    assert counts[1] == transformer_forward_flops(2, 16, 9, 20)


@pytest.mark.parametrize("shape", SHAPES)
def test_per_component_flops_sum_to_the_total_and_match_each_module(shape) -> None:
    n_layers, d_model, n_heads, seq_len, vocab_size, d_ff = shape
    parts = per_component_flops(n_layers, d_model, seq_len, vocab_size, d_ff)
    assert sum(parts.values()) == transformer_forward_flops(n_layers, d_model, seq_len,
                                                            vocab_size, d_ff)
    with FlopCounterMode(display=False) as counter:
        tiny(n_layers, d_model, n_heads, vocab_size, d_ff)(torch.randint(0, vocab_size,
                                                                         (1, seq_len)))
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    bmm = {name: sum(n for op, n in ops.items() if str(op) == "aten.bmm")
           for name, ops in counter.get_flop_counts().items()}

    def layers(suffix: str, counts=by_module) -> int:
        return sum(counts[f"TinyTransformer.blocks.{i}.{suffix}"] for i in range(n_layers))

    assert parts["qkv"] == layers("attn.q") + layers("attn.k") + layers("attn.v")
    assert parts["output_projection"] == layers("attn.o")
    # q @ kᵀ and weights @ v are the attention module's two bmm calls, of equal size
    assert parts["scores"] == parts["weighted_sum"] == layers("attn", bmm) // 2
    assert parts["mlp_up"] == layers("mlp.up") and parts["mlp_down"] == layers("mlp.down")
    assert parts["unembedding"] == by_module["TinyTransformer.unembedding"]


def test_attention_dominates_when_the_context_is_long() -> None:
    """At T = 12·d the two attention matmuls (4·T²·d per layer) outweigh the projections and
    the MLP (24·T·d² per layer): 4T²d / 24Td² = T / (6d) = 2."""
    n_layers, d_model, _, seq_len, vocab_size, _ = SHAPES[-1]
    parts = per_component_flops(n_layers, d_model, seq_len, vocab_size)
    attention = parts["scores"] + parts["weighted_sum"]
    matrices = sum(parts.values()) - attention - parts["unembedding"]
    assert attention == 2 * matrices
    short = per_component_flops(n_layers, d_model, d_model, vocab_size)  # T = d: 1/6 as much
    assert 6 * (short["scores"] + short["weighted_sum"]) == sum(short.values()) \
        - short["scores"] - short["weighted_sum"] - short["unembedding"]


def test_fused_attention_is_not_counted_as_the_causal_half() -> None:
    """Why the tiny transformer writes attention as two matmuls. FlopCounterMode's formula for
    the fused kernels of F.scaled_dot_product_attention is the full 4·b·h·T²·d_head, causal
    or not; the CPU kernel has no formula at all (torch 2.13 counts 0), so the same model
    would count differently on a CPU and a GPU. The math backend runs two bmm: the full square.
    """
    b, h, seq_len, d_head = 1, 2, 6, 4
    q, k, v = (torch.randn(b, h, seq_len, d_head) for _ in range(3))
    full_square = 4 * b * h * seq_len * seq_len * d_head
    fused = counted_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert fused in (0, full_square)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math_kernel = counted_flops(lambda: F.scaled_dot_product_attention(q, k, v,
                                                                           is_causal=True))
    assert math_kernel == full_square


def training_step_flops(model: TinyTransformer, tokens: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return counter.get_total_flops()


def test_backward_of_the_tiny_transformer_is_twice_its_forward() -> None:
    n_layers, d_model, n_heads, seq_len, vocab_size, _ = SHAPES[1]
    model = tiny(n_layers, d_model, n_heads, vocab_size)
    tokens = torch.randint(0, vocab_size, (1, seq_len))
    forward = transformer_forward_flops(n_layers, d_model, seq_len, vocab_size)
    assert training_step_flops(model, tokens) == 3 * forward


def test_measured_training_step_is_below_6NT_with_untied_embeddings() -> None:
    """A step on token ids (nothing needs their gradient) measures 3 x forward; 6·N·T is below
    the truth by the attention matmuls (3 x 4·L·T²·d) and above it by the input embedding's
    V·d parameters, which do a lookup instead of a matmul (6·T·V·d). Here (L=2, d=16, T=12,
    V=50, N=7744) 6NT = 557,568 and the step measures 555,264: 2,304 FLOPs (0.41%) below,
    the lookup's 57,600 less attention's 55,296. With a context twice as long attention wins
    and the step is above 6NT; at GPT-3's shape (T=2048, d=12288) attention adds T/(6d) = 2.8%."""
    n_layers, d_model, n_heads, seq_len, vocab_size, _ = SHAPES[1]
    n_params = transformer_params(n_layers, d_model, vocab_size)
    measured = training_step_flops(tiny(n_layers, d_model, n_heads, vocab_size),
                                   torch.randint(0, vocab_size, (1, seq_len)))
    six_nt = 6 * n_params * seq_len
    embedding_lookup = 6 * seq_len * vocab_size * d_model
    attention = 3 * 4 * n_layers * seq_len**2 * d_model
    assert six_nt - measured == embedding_lookup - attention == 2_304
    assert (six_nt, measured) == (557_568, 555_264)
    longer = training_step_flops(tiny(n_layers, d_model, n_heads, vocab_size),
                                 torch.randint(0, vocab_size, (1, 2 * seq_len)))
    assert longer > 6 * n_params * 2 * seq_len


def test_measured_training_step_is_above_6NT_by_attention_with_tied_embeddings() -> None:
    """Tied, the one (V, d) matrix does one matmul (the unembedding), as 6N assumes, so what
    is left is attention, which 6N leaves out: 12·L·T²·d above."""
    n_layers, d_model, n_heads, seq_len, vocab_size, _ = SHAPES[1]
    n_params = transformer_params(n_layers, d_model, vocab_size, tied_embeddings=True)
    measured = training_step_flops(tiny(n_layers, d_model, n_heads, vocab_size, tied=True),
                                   torch.randint(0, vocab_size, (1, seq_len)))
    assert measured - 6 * n_params * seq_len == 12 * n_layers * seq_len**2 * d_model


@pytest.mark.parametrize("function", [transformer_params, transformer_forward_flops,
                                      per_component_flops])
def test_transformer_accounting_rejects_sizes_below_one(function) -> None:
    with pytest.raises(ValueError, match="positive"):
        function(0, 16, 12, 50)
    with pytest.raises(ValueError, match="d_ff"):
        function(2, 16, 50, d_ff=-4) if function is transformer_params \
            else function(2, 16, 12, 50, d_ff=-4)


# ---------------------------------------------------------------- published models


def gpt2_checkpoint_shapes(model: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a GPT-2 checkpoint, named as in the released weights (the output layer
    is the token embedding, so it is not listed again)."""
    d, d_ff = model["d_model"], model["d_ff"]
    shapes = {"wte.weight": (model["vocab_size"], d), "wpe.weight": (model["context_length"], d)}
    for i in range(model["n_layers"]):
        shapes |= {f"h.{i}.ln_1.weight": (d,), f"h.{i}.ln_1.bias": (d,),
                   f"h.{i}.attn.c_attn.weight": (d, 3 * d), f"h.{i}.attn.c_attn.bias": (3 * d,),
                   f"h.{i}.attn.c_proj.weight": (d, d), f"h.{i}.attn.c_proj.bias": (d,),
                   f"h.{i}.ln_2.weight": (d,), f"h.{i}.ln_2.bias": (d,),
                   f"h.{i}.mlp.c_fc.weight": (d, d_ff), f"h.{i}.mlp.c_fc.bias": (d_ff,),
                   f"h.{i}.mlp.c_proj.weight": (d_ff, d), f"h.{i}.mlp.c_proj.bias": (d,)}
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,)}


def llama_checkpoint_shapes(model: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LLaMA checkpoint, named as in the Hugging Face release. Under
    grouped-query attention k and v project to n_kv_heads heads of d / n_heads each."""
    d, d_ff, vocab_size = model["d_model"], model["d_ff"], model["vocab_size"]
    kv_width = model["n_kv_heads"] * d // model["n_heads"]
    shapes = {"embed_tokens.weight": (vocab_size, d), "lm_head.weight": (vocab_size, d),
              "norm.weight": (d,)}
    for i in range(model["n_layers"]):
        shapes |= {f"layers.{i}.self_attn.{p}_proj.weight": (d, d) for p in "qo"}
        shapes |= {f"layers.{i}.self_attn.{p}_proj.weight": (kv_width, d) for p in "kv"}
        shapes |= {f"layers.{i}.mlp.{p}_proj.weight": (d_ff, d) for p in ("gate", "up")}
        shapes |= {f"layers.{i}.mlp.down_proj.weight": (d, d_ff),
                   f"layers.{i}.input_layernorm.weight": (d,),
                   f"layers.{i}.post_attention_layernorm.weight": (d,)}
    return shapes


def checkpoint_params(name: str) -> int:
    model = MODELS[name]
    shapes = gpt2_checkpoint_shapes(model) if name.startswith("GPT") \
        else llama_checkpoint_shapes(model)
    return sum(math.prod(shape) for shape in shapes.values())


def formula_params(name: str) -> int:
    """transformer_params from a models.json entry; a gated MLP counts as a wider 2-matrix one."""
    model = MODELS[name]
    return transformer_params(model["n_layers"], model["d_model"], model["vocab_size"],
                              gated_mlp_d_ff(model["d_ff"], model["mlp_matrices"]),
                              model["tied_embeddings"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_names_its_source_and_its_shape(name: str) -> None:
    model = MODELS[name]
    assert "Table" in model["source"] and model["reported_params"] > 0
    assert model["d_model"] % model["n_heads"] == 0
    assert 1 <= model["n_kv_heads"] <= model["n_heads"]
    assert model["n_heads"] % model["n_kv_heads"] == 0  # each key/value head serves a group
    assert model["mlp_matrices"] in (2, 3) and type(model["tied_embeddings"]) is bool


def test_gpt2_small_has_124439808_parameters_counted_from_its_shape() -> None:
    shapes = gpt2_checkpoint_shapes(MODELS["GPT-2 small"])
    assert len(shapes) == 2 + 12 * 12 + 2  # 148 tensors, as in the released checkpoint
    assert checkpoint_params("GPT-2 small") == 124_439_808


@pytest.mark.parametrize("name", [n for n in sorted(MODELS) if "params_in_checkpoint" in MODELS[n]])
def test_count_from_the_shape_equals_the_released_weights(name: str) -> None:
    assert checkpoint_params(name) == MODELS[name]["params_in_checkpoint"]


@pytest.mark.parametrize("name", ["GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL"])
def test_formula_leaves_out_under_one_percent_of_gpt2(name: str) -> None:
    """What 12Ld² + Vd leaves out of GPT-2: biases 9d and LayerNorms 4d per layer, the final
    LayerNorm 2d and the learned positions context·d, exactly; 0.73% of GPT-2 small (908K)."""
    model = MODELS[name]
    d, n_layers = model["d_model"], model["n_layers"]
    left_out = checkpoint_params(name) - formula_params(name)
    assert left_out == n_layers * 13 * d + 2 * d + model["context_length"] * d
    assert left_out / checkpoint_params(name) < 0.0075


def test_gpt2_papers_sizes_match_a_count_with_gpt1s_vocabulary() -> None:
    """The GPT-2 paper's 117M/345M/762M/1542M are below the released weights (124M, 355M, 774M,
    1558M). Counting every tensor with a 40,478-token vocabulary, GPT-1's, instead of 50,257
    gives each reported figure to within 0.5M; with the real vocabulary they are 7M-16M off."""
    for name in ["GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL"]:
        model = MODELS[name]
        with_gpt1_vocab = checkpoint_params(name) - (50_257 - 40_478) * model["d_model"]
        assert abs(with_gpt1_vocab - model["reported_params"]) < 0.5e6
        assert checkpoint_params(name) - model["reported_params"] > 7e6


def test_gpt3_175b_from_its_shape_is_within_one_percent_of_175b() -> None:
    """12·96·12288² + 50257·12288 = 174.56B (tied; 175.18B untied), 0.25% below 175.0B."""
    reported = MODELS["GPT-3 175B"]["reported_params"]
    formula = formula_params("GPT-3 175B")
    assert formula == 174_563_733_504
    assert abs(formula / reported - 1) < 0.01
    untied = transformer_params(96, 12288, 50257, tied_embeddings=False)
    assert abs(untied / reported - 1) < 0.01


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_params_is_the_released_weights_less_the_norms(name: str) -> None:
    """model_params counts every weight matrix at its real width (grouped-query attention's k
    and v included): for the models of the LLaMA family it is the released count less the
    RMSNorm gains, (2L + 1) d; for every model it is within 1% of every parameter there is."""
    model = MODELS[name]
    counted = model_params(model)
    if name.startswith(("LLaMA", "Llama")):
        assert counted == checkpoint_params(name) - (2 * model["n_layers"] + 1) * model["d_model"]
    else:  # no grouped-query attention: the formula of lesson 04
        assert counted == formula_params(name)
    if "params_in_checkpoint" in model:
        assert 0.99 < counted / model["params_in_checkpoint"] <= 1


def test_lesson_04s_formula_counts_llama_3_70b_13_percent_too_large() -> None:
    """Lesson 04: 8 key/value heads for 64 query heads make k and v (d, d/8) matrices; the
    formula, 4 d^2 per block for attention, counts 79.9B against the released 70.6B."""
    model = MODELS["Llama 3 70B"]
    released = model["params_in_checkpoint"]
    assert released == 70_553_706_496 and checkpoint_params("Llama 3 70B") == released
    assert round(formula_params("Llama 3 70B") / 1e9, 1) == 79.9
    assert round(released / 1e9, 1) == 70.6
    assert round(formula_params("Llama 3 70B") / released - 1, 2) == 0.13
    d = model["d_model"]
    assert 2 * d * d + 2 * d * (d // 8) == 2.25 * d * d


def test_llama2_7b_needs_the_third_mlp_matrix() -> None:
    """Llama 2 7B's SwiGLU MLP has three (4096, 11008) matrices. The two-matrix formula with
    d_ff = 11008 gives 5.30B, 21% short of the 6.74B in the released weights; with the width
    1.5·11008 = 16512 it gives 6.7381B, short only by the RMSNorm gains (65·4096 = 266,240).
    The name "7B" rounds up 6.74B by 3.9%."""
    model = MODELS["Llama 2 7B"]
    released = model["params_in_checkpoint"]
    two_matrices = transformer_params(32, 4096, 32000, d_ff=11008)
    assert two_matrices == 5_295_308_800 and released / two_matrices > 1.27
    assert released - formula_params("Llama 2 7B") == (2 * model["n_layers"] + 1) * 4096
    assert 0.96 < formula_params("Llama 2 7B") / model["reported_params"] < 0.97


def test_gated_mlp_d_ff_rejects_widths_that_do_not_divide() -> None:
    assert gated_mlp_d_ff(11008, 3) == 16512 and gated_mlp_d_ff(3072, 2) == 3072
    with pytest.raises(ValueError):
        gated_mlp_d_ff(11, 3)


# ---------------------------------------------------------------- 6ND and training time


def test_70b_params_on_15t_tokens_take_144_days_on_1024_h100s_at_half_mfu() -> None:
    """6 x 70e9 x 15e12 = 6.3e24 FLOPs; 1024 H100 at 50% of the dense bf16 peak (989.4
    TFLOP/s) do 5.07e17 FLOP/s: 1.244e7 s = 143.9 days. The seeds' 1979e12 / 2 = 989.5e12 is
    the same dense figure (the datasheet's 1978.9 with sparsity, halved), not the sparse one."""
    total = training_flops(70e9, 15e12)
    assert type(total) is float and total == pytest.approx(6.3e24, rel=1e-12)
    days = training_days(total, 1024, H100_BF16, 0.5)
    assert type(days) is float and days == pytest.approx(143.9, abs=0.1)
    # The sparse figure would halve the answer: the trap the course warns about.
    assert training_days(total, 1024, 1979e12, 0.5) == pytest.approx(days / 2, rel=1e-3)


def test_training_days_scales_inversely_with_gpus_and_mfu() -> None:
    assert training_days(86_400.0, 1, 1.0, 1.0) == 1.0
    assert training_days(8 * 86_400, 2, 4.0, 0.5) == 2.0
    assert training_flops(1, 1) == 6.0 and training_flops(0, 10**12) == 0.0


@pytest.mark.parametrize("args", [(-1.0, 8, 1e15, 0.5), (1e20, 0, 1e15, 0.5),
                                  (1e20, 8, 0.0, 0.5), (1e20, 8, 1e15, 0.0),
                                  (1e20, 8, 1e15, 1.5), (math.nan, 8, 1e15, 0.5)])
def test_training_days_rejects_impossible_inputs(args) -> None:
    with pytest.raises(ValueError):
        training_days(*args)


@pytest.mark.parametrize("args", [(-1, 10), (10, -1), (math.inf, 1), ("70e9", 1)])
def test_training_flops_rejects_negative_or_non_numbers(args) -> None:
    with pytest.raises(ValueError):
        training_flops(*args)


# ---------------------------------------------------------------- the published counts


@pytest.mark.parametrize("shape", [*SHAPES, (96, 12288, 96, 2048, 50257, None)])
def test_kaplans_attention_term_is_half_the_courses(shape) -> None:
    """Kaplan et al. 2020, Table 1: per token 2N + 2 n_layer n_ctx d_attn, no embedding and no
    unembedding. The course counts both attention matmuls over the whole T x T square, 4T²d
    per block, twice Kaplan's 2T²d: its count is Kaplan's plus the other half of attention
    plus the unembedding, exactly."""
    n_layers, d_model, _, seq_len, vocab_size, d_ff = shape
    parts = per_component_flops(n_layers, d_model, seq_len, vocab_size, d_ff)
    course_attention = parts["scores"] + parts["weighted_sum"]
    kaplan_attention = seq_len * 2 * n_layers * seq_len * d_model
    assert course_attention == 2 * kaplan_attention
    kaplan = kaplan_forward_flops(n_layers, d_model, seq_len, d_ff)
    non_embedding = transformer_params(n_layers, d_model, 1, d_ff) - 2 * d_model  # V = 1
    assert kaplan == seq_len * 2 * non_embedding + kaplan_attention
    assert transformer_forward_flops(n_layers, d_model, seq_len, vocab_size, d_ff) == (
        kaplan + kaplan_attention + parts["unembedding"])


@pytest.mark.parametrize("seq_len", [1, 7, 128, 2048])
def test_both_attention_matmuls_over_the_causal_half_match_kaplans_term(seq_len: int) -> None:
    """Query i sees keys 1..i: both matmuls over those cost 2 x 2·i·d, summed T(T+1)·2d, which
    is Kaplan's 2T²d per block up to (T + 1) / T."""
    d_model = 64
    causal = sum(2 * 2 * i * d_model for i in range(1, seq_len + 1))
    kaplan = seq_len * 2 * seq_len * d_model
    assert causal * seq_len == kaplan * (seq_len + 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_chinchillas_count_is_flop_counters_plus_softmax_and_embeddings(shape) -> None:
    """Hoffmann et al. 2022, Appendix F: the same matmuls as the course (both attention
    matmuls over the whole square), plus 3 FLOPs per attention score per head for the softmax
    and the embedding lookup counted as a (T, V) @ (V, d) matmul. FlopCounterMode on the tiny
    transformer measures the matmul part."""
    n_layers, d_model, n_heads, seq_len, vocab_size, d_ff = shape
    model = tiny(n_layers, d_model, n_heads, vocab_size, d_ff)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, vocab_size, (1, seq_len)))
    softmax = n_layers * 3 * n_heads * seq_len**2
    embeddings = 2 * seq_len * vocab_size * d_model
    chinchilla = chinchilla_forward_flops(n_layers, d_model, seq_len, vocab_size, n_heads, d_ff)
    assert chinchilla == counter.get_total_flops() + softmax + embeddings


# ---------------------------------------------------------------- the answers to the predictions


def test_step_of_the_two_layer_network_without_an_input_gradient_is_five_sixths_of_6PB() -> None:
    """Section 3's answer, measured: B = 128, D = K = 512, x needing no gradient."""
    x = torch.randn(128, 512)
    w1, w2 = torch.randn(512, 512, requires_grad=True), torch.randn(512, 512, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        (x @ w1 @ w2).pow(2).mean().backward()
    assert counter.get_total_flops() / (6 * (512 * 512 + 512 * 512) * 128) \
        == predicted_step_ratio == 5 / 6


def test_training_step_of_the_first_shape_measures_below_6NT() -> None:
    """Section 9's answer, measured: L = 2, d = 64, T = 128, V = 1000, untied, one sequence.
    The embedding's lookup (6TVd) that 6NT counts outweighs attention (12LT²d) it leaves out."""
    measured = training_step_flops(tiny(2, 64, 4, 1000), torch.randint(0, 1000, (1, 128)))
    six_nt = 6 * transformer_params(2, 64, 1000) * 128
    options = {"a": measured < six_nt, "b": measured == six_nt, "c": measured > six_nt}
    assert options[choice_step_vs_6nt] and [k for k, holds in options.items() if holds] == ["a"]


DAYS = "predicted_days_70b"
DAYS_VARIANTS = range(len(BACKPROP_VARIANTS[DAYS].choices))


def days_variant(index: int) -> tuple[dict, float]:
    """A variant's names, and the answer graded for it (the notebook's cell, run again)."""
    return (BACKPROP_VARIANTS[DAYS].bound(index),
            variant_answer(load_lesson("04_backprop_flops"), DAYS, index))


def run_days(names: dict, peak: float, flops_per_param_token: int = 6,
             mfu: float | None = None) -> float:
    """The days of a variant's run in exact rationals, from its FLOPs per parameter and token,
    the peak and the MFU (the variant's own unless given)."""
    from fractions import Fraction

    flops = (flops_per_param_token * Fraction(names["run_params_billions"]) * 10**9
             * Fraction(names["run_tokens_trillions"]) * 10**12)
    rate = names["run_gpus"] * Fraction(peak) * Fraction(names["run_mfu"] if mfu is None else mfu)
    return float(flops / rate / (24 * 60 * 60))


@pytest.mark.parametrize("index", DAYS_VARIANTS)
def test_predicted_days_of_each_run_use_6nd_and_the_dense_peak(index: int) -> None:
    """Section 10's graded answer, for each student's run: 6ND over what the GPUs sustain at
    the dense bf16 peak of data/hardware.json, about 144 days for the default."""
    names, answer = days_variant(index)
    assert answer == pytest.approx(run_days(names, H100_BF16), rel=1e-12)
    assert answer == pytest.approx(training_days(
        training_flops(names["run_params_billions"] * 1e9, names["run_tokens_trillions"] * 1e12),
        names["run_gpus"], H100_BF16, names["run_mfu"]), rel=1e-12)
    if index == 0:
        assert answer == pytest.approx(predicted_days_70b, rel=1e-12)
        assert round(answer) == 144


@pytest.mark.parametrize("index", DAYS_VARIANTS)
def test_the_slips_the_band_catches_miss_it_and_roundings_do_not(index: int) -> None:
    """The sparse peak (half the answer), leaving out the MFU, or 2ND instead of 6ND miss the
    10% band in every variant; the peak rounded to 1000 TFLOP/s, or the answer to two
    significant figures, stays in it."""
    names, answer = days_variant(index)
    sparse = load_hardware()["H100 SXM"]["peak_flops_with_sparsity"]["bf16"]
    for wrong in (run_days(names, sparse), run_days(names, H100_BF16, mfu=1.0),
                  run_days(names, H100_BF16, flops_per_param_token=2)):
        assert not math.isclose(wrong, answer, rel_tol=0.1), (index, wrong)
    assert math.isclose(run_days(names, 1000e12), answer, rel_tol=0.1)
    assert math.isclose(float(f"{answer:.2g}"), answer, rel_tol=0.1)


def test_each_run_has_its_own_answer() -> None:
    """Every two answers are more than the graded band (10%) apart: no one else's number, nor
    the default's, passes for a student."""
    answers = sorted(days_variant(index)[1] for index in DAYS_VARIANTS)
    assert all(high > 1.1 * low for low, high in itertools.pairwise(answers))


# ---------------------------------------------------------------- each student's drawn inputs


def built_model(call: str) -> tuple[TinyTransformer, dict]:
    """The model a drawn call describes, built on the meta device (no memory, real shapes), and
    the call's arguments by name."""
    node = ast.parse(call, mode="eval").body
    names = ["n_layers", "d_model", "seq_len", "vocab_size"]
    if node.func.id == "transformer_params":
        names.remove("seq_len")
    arguments = dict(zip(names, (ast.literal_eval(a) for a in node.args), strict=True))
    arguments.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    with torch.device("meta"):
        model = TinyTransformer(arguments["vocab_size"], arguments["d_model"],
                                arguments["n_layers"], arguments["d_model"] // 64,
                                arguments.get("d_ff"),
                                tied_embeddings=arguments.get("tied_embeddings", False))
    return model, arguments


@pytest.mark.parametrize("exercise", sorted(BACKPROP_DRAWN))
def test_drawn_inputs_are_valid_and_differ_between_students(exercise: str) -> None:
    """Each drawn call's reference answer is what a real transformer of that shape has:
    its parameters' numel, or what FlopCounterMode counts for its forward pass."""
    import solutions.backprop as reference
    from tests.grading_helpers import drawn_calls

    for calls in drawn_calls(BACKPROP_DRAWN[exercise]):
        for call in map(as_case, calls):
            got = reference_value(call, vars(reference))
            assert type(got) is int and got > 0
            model, arguments = built_model(call.expression)
            if exercise == "transformer_params":
                assert got == sum(p.numel() for p in model.parameters()), call.expression
            else:
                tokens = torch.zeros(1, arguments["seq_len"], dtype=torch.long, device="meta")
                assert got == counted_flops(model, tokens), call.expression


def test_the_embedding_share_of_6nd_lesson_04_states() -> None:
    """6ND with the course's N (embedding included) overcounts by 6Vd per token for an untied
    model: 1.9% of 6ND for Llama 2 7B. GPT-3 175B, which the course counts as tied, has no
    overcount: its one V x d matrix is the unembedding's, a real matmul (FlopCounterMode on a
    tied model below); untied, Vd would be 0.35% of N (issue 44)."""
    models = json.loads((Path(__file__).resolve().parent.parent / "data" / "models.json")
                        .read_text())["models"]

    def share(m: dict, tied: bool) -> float:
        n = transformer_params(m["n_layers"], m["d_model"], m["vocab_size"],
                               gated_mlp_d_ff(m["d_ff"], m["mlp_matrices"]),
                               tied_embeddings=tied)
        return m["vocab_size"] * m["d_model"] / n

    llama, gpt3 = models["Llama 2 7B"], models["GPT-3 175B"]
    assert not llama["tied_embeddings"] and round(share(llama, False), 3) == 0.019
    assert gpt3["tied_embeddings"]
    assert round(share(gpt3, False), 4) == round(share(gpt3, True), 4) == 0.0035
    # a tied model's step is 6NT (+ attention) exactly: nothing of N is a lookup only
    layers, d, seq_len, vocab = 2, 32, 16, 50
    model = TinyTransformer(vocab, d, layers, 2, tied_embeddings=True)
    tokens = torch.randint(0, vocab, (1, seq_len))
    with FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    n = transformer_params(layers, d, vocab, tied_embeddings=True)
    assert counter.get_total_flops() == 6 * n * seq_len + 3 * 4 * layers * seq_len**2 * d
    text = " ".join(c.source for c in nbformat.read(
        load_lesson("04_backprop_flops").notebook, as_version=4).cells
        if c.cell_type == "markdown")
    assert "0.4% for GPT-3" not in " ".join(text.split())
    assert "its overcount is 0; untied, it would be 0.35%" in " ".join(text.split())


def test_palms_mfu_attention_term_is_three_times_the_courses_forward_square() -> None:
    """Lesson 04: PaLM's 12 L H Q T FLOPs per token for a step (H Q = d) is the forward pass's
    4 T^2 d per block, both matmuls over the whole square, times 3, per token."""
    layers, d, seq_len, vocab = 4, 64, 32, 100
    with_attention = transformer_forward_flops(layers, d, seq_len, vocab)
    # Every weight matrix once per token, 2 FLOPs per parameter; the embedding is a lookup.
    weights_only = 2 * seq_len * (transformer_params(layers, d, vocab) - vocab * d)
    attention_forward = with_attention - weights_only
    assert attention_forward == layers * 4 * seq_len**2 * d
    assert 3 * attention_forward / seq_len == 12 * layers * d * seq_len
