"""Lesson 09's counts (solutions/experts.py) and given code (solutions/moe_layer.py,
solutions/expert_models.py) against oracles from outside the lesson: torch models of the
published shapes on the meta device (``sum(p.numel())``), their makers' stated sizes,
FlopCounterMode around a dispatching MoE layer under any routing, exact expectations over every
routing of small cases, simulated routers, a direct count of refused assignments, and lesson
07's all-to-all count."""

from __future__ import annotations

import decimal
import itertools
import json
import math
import random
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from grader.content.cases.experts import CASES, DRAWN, VARIANTS
from solutions import experts
from solutions.expert_models import (
    decode_split,
    deepseek_v3_params,
    mla_attention_params,
    moe_decode_tokens_per_second,
    simple_params,
)
from solutions.experts import (
    dropped_tokens,
    expected_experts_touched,
    expert_parallel_bytes,
    moe_decode_bytes,
    moe_layer_flops,
    moe_params,
)
from solutions.inference import decode_tokens_per_second
from solutions.moe_layer import (
    GatedMLP,
    MoELayer,
    biased_top_k,
    expert_counts,
    skewed_routing,
    switch_aux_loss,
    uniform_routing,
    update_bias,
)
from solutions.parallel import collective_bytes
from tests.grading_helpers import arguments_of as call_arguments

DATA = Path(__file__).resolve().parent.parent / "data"
MOE = json.loads((DATA / "models.json").read_text())["moe_models"]
ACCELERATORS = json.loads((DATA / "hardware.json").read_text())["accelerators"]
NODE = json.loads((DATA / "interconnects.json").read_text())["H100 SXM node"]


# ---------------------------------------------------------------- a torch model of each shape


class Attention(nn.Module):
    """Grouped-query attention's four projections, as Mixtral's, OLMoE's and Qwen3's release
    names them (q_proj, k_proj, v_proj, o_proj; no biases)."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False)


class Experts(nn.Module):
    """E gated experts stored as grouped weights, as grouped-GEMM implementations keep them:
    gate and up projections stacked, (E, 2·d_ff, d), and the down projection, (E, d, d_ff)."""

    def __init__(self, n: int, d: int, d_ff: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * d_ff, d))
        self.down_proj = nn.Parameter(torch.empty(n, d, d_ff))


class Block(nn.Module):
    def __init__(self, shape: dict, attention: nn.Module, n_experts: int) -> None:
        super().__init__()
        d = shape["d_model"]
        self.self_attn = attention
        self.gate = nn.Linear(d, shape["n_experts"], bias=False)  # the router
        self.experts = Experts(n_experts, d, shape["d_ff_expert"])
        self.shared_experts = Experts(shape["n_shared_experts"], d, shape["d_ff_expert"])


def torch_model(shape: dict, n_experts: int | None = None) -> nn.Module:
    """A model of ``shape`` on the meta device: embeddings, and every block attention, a router
    and ``n_experts`` routed experts (all of them when None; top_k of them for what one token
    uses) beside the shared ones."""
    n_experts = shape["n_experts"] if n_experts is None else n_experts
    with torch.device("meta"):
        model = nn.Module()
        model.embed_tokens = nn.Embedding(shape["vocab_size"], shape["d_model"])
        model.layers = nn.ModuleList(
            Block(shape, Attention(shape["d_model"], shape["n_heads"], shape["n_kv_heads"],
                                   shape["head_dim"]), n_experts)
            for _ in range(shape["n_layers"]))
        if not shape["tied_embeddings"]:
            model.lm_head = nn.Linear(shape["d_model"], shape["vocab_size"], bias=False)
    return model


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix is one parameter


@pytest.mark.parametrize("name", ["Mixtral 8x7B", "OLMoE-1B-7B", "Qwen3-30B-A3B"])
def test_moe_params_is_numel_of_a_torch_model_and_gives_the_published_sizes(name) -> None:
    """Total: every parameter of the model; active: the same model with top_k routed experts
    per block. Both give what the model's makers state (data/models.json's sources) to the
    digits they print: rounded, except Qwen3's active 3.35B, which its card cuts to 3.3B."""
    shape = MOE[name]
    total, active = simple_params(shape)
    assert total == numel(torch_model(shape))
    assert active == numel(torch_model(shape, shape["top_k"]))
    assert round(total / 1e8) * 1e8 == shape["reported_total_params"]  # 46.7B, 6.9B, 30.5B
    cut = math.floor if name == "Qwen3-30B-A3B" else round
    assert cut(active / 1e8) * 1e8 == shape["reported_active_params"]  # 12.9B, 1.3B, 3.3B
    if "reported_non_embedding_params" in shape:  # Qwen3: 29.9B without V·d twice
        without = total - 2 * shape["vocab_size"] * shape["d_model"]
        assert round(without / 1e8) * 1e8 == shape["reported_non_embedding_params"]


def test_mixtrals_count_is_its_checkpoint_less_its_norms() -> None:
    """Mixtral-8x7B-v0.1's safetensors hold 46,702,792,704 parameters (Hugging Face's
    model page): the matrices counted here and 65 RMSNorm gains of 4096."""
    total, active = moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000)
    assert (total, active) == (46_702_526_464, 12_879_659_008)
    assert total + (2 * 32 + 1) * 4096 == 46_702_792_704


class LatentAttention(nn.Module):
    """DeepSeek-V3's MLA projections as its release names them (norms left out)."""

    def __init__(self, d: int, heads: int, mla: dict) -> None:
        super().__init__()
        qk = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
        self.q_a_proj = nn.Linear(d, mla["q_lora_rank"], bias=False)
        self.q_b_proj = nn.Linear(mla["q_lora_rank"], heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, mla["kv_lora_rank"] + mla["qk_rope_head_dim"],
                                            bias=False)
        self.kv_b_proj = nn.Linear(mla["kv_lora_rank"],
                                   heads * (mla["qk_nope_head_dim"] + mla["v_head_dim"]),
                                   bias=False)
        self.o_proj = nn.Linear(heads * mla["v_head_dim"], d, bias=False)


def test_deepseek_v3_counted_with_mla_and_dense_blocks_gives_671b_and_37b() -> None:
    """A meta-device DeepSeek-V3 (MLA in all 61 blocks, dense gated MLPs of 18432 in the first
    3, 256 routed and 1 shared expert in the other 58): 671.0B parameters, 37.6B of them per
    token with both embeddings; less the input embedding (a lookup), 36.6B, which DeepSeek's
    README_WEIGHTS.md states and its report rounds to 37B. The simple count says 721.0B and
    54.8B."""
    shape = MOE["DeepSeek-V3"]
    d, dense = shape["d_model"], shape["n_dense_layers"]

    def model(routed: int) -> nn.Module:
        with torch.device("meta"):
            m = nn.Module()
            m.embed_tokens = nn.Embedding(shape["vocab_size"], d)
            m.lm_head = nn.Linear(d, shape["vocab_size"], bias=False)
            m.attention = nn.ModuleList(LatentAttention(d, shape["n_heads"], shape["mla"])
                                        for _ in range(shape["n_layers"]))
            m.dense = nn.ModuleList(Experts(1, d, shape["d_ff_dense"]) for _ in range(dense))
            m.moe = nn.ModuleList(Block(shape, nn.Identity(), routed)
                                  for _ in range(shape["n_layers"] - dense))
        return m

    total, active = deepseek_v3_params(shape)
    assert (total, active) == (numel(model(256)), numel(model(shape["top_k"])))
    assert round(total / 1e9) * 1e9 == shape["reported_total_params"] == 671e9
    lookup = numel(model(0).embed_tokens)
    assert lookup == shape["vocab_size"] * d and round(lookup / 1e7) == 93
    assert round((active - lookup) / 1e8) * 1e8 == (
        shape["reported_active_params_without_input_embedding"]) == 36.6e9
    assert round((active - lookup) / 1e9) * 1e9 == shape["reported_active_params"] == 37e9
    assert round(active / 1e8) == 376 and round(active / 1e9) == 38  # not the stated 37B
    assert mla_attention_params(shape) == numel(model(0).attention[0]) == 187_105_280
    simple = simple_params(shape)
    assert (round(simple[0] / 1e8), round(simple[1] / 1e8)) == (7210, 548)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3),
       st.integers(1, 8), st.integers(1, 6), st.data(), st.integers(1, 50), st.integers(0, 2),
       st.booleans(), st.booleans())
def test_moe_params_is_numel_for_any_shape(n_layers, heads, groups, head_dim, d_ff, n_experts,
                                           data, vocab, shared, own_head_dim, tied) -> None:
    kv_heads = heads
    heads *= groups  # grouped-query attention: kv heads divide the query heads
    top_k = data.draw(st.integers(1, n_experts))
    d_model = heads * head_dim + (data.draw(st.integers(1, 5)) if own_head_dim else 0)
    shape = {"n_layers": n_layers, "d_model": d_model, "n_heads": heads, "n_kv_heads": kv_heads,
             "head_dim": head_dim, "d_ff_expert": d_ff, "n_experts": n_experts,
             "top_k": top_k, "n_shared_experts": shared, "vocab_size": vocab,
             "tied_embeddings": tied}
    total, active = moe_params(n_layers, d_model, heads, kv_heads, d_ff, n_experts, top_k,
                               vocab, shared, head_dim if own_head_dim else None, tied)
    if not own_head_dim:  # head_dim=None: d_model / n_heads, which is head_dim here
        assert d_model // heads == head_dim
    assert (total, active) == (numel(torch_model(shape)), numel(torch_model(shape, top_k)))
    assert total - active == n_layers * (n_experts - top_k) * 3 * d_model * d_ff


# ---------------------------------------------------------------- FLOPs of a block


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12), st.integers(1, 12), st.integers(1, 6),
       st.integers(0, 2), st.data())
def test_flop_counter_around_the_dispatching_layer_is_moe_layer_flops_under_any_routing(
        n_tokens, d_model, d_ff, n_experts, shared, data) -> None:
    """Any routing: drawn per token (distinct experts), the router's own, or every token to
    the same experts; empty experts run nothing."""
    top_k = data.draw(st.integers(1, n_experts))
    torch.manual_seed(0)
    layer = MoELayer(d_model, d_ff, n_experts, top_k, shared)
    x = torch.randn(n_tokens, d_model)
    drawn = torch.tensor([data.draw(st.permutations(range(n_experts)))[:top_k]
                          for _ in range(n_tokens)], dtype=torch.long).reshape(n_tokens, top_k)
    same = torch.arange(top_k).repeat(n_tokens, 1)
    expected = moe_layer_flops(n_tokens, d_model, d_ff, n_experts, top_k, shared)
    with torch.no_grad():
        for routing in (drawn, None, same):
            assert counted(lambda r=routing: layer(x, r)) == expected
    assert layer.counts.sum() == n_tokens * top_k


def test_the_moe_layer_computes_what_its_experts_compute_token_by_token() -> None:
    """The dispatch gathers and scatters the right rows: the output is, for each token, the
    score-weighted sum of its chosen experts' outputs, computed one token at a time (float64:
    the two ways add in other orders)."""
    torch.manual_seed(3)
    layer = MoELayer(6, 5, 4, 2, n_shared_experts=1).double()
    x = torch.randn(9, 6, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x)
        scores = layer.router(x).softmax(dim=-1)
        for t in range(len(x)):
            chosen = scores[t].topk(2).indices
            weights = scores[t, chosen] / scores[t, chosen].sum()
            expected = layer.shared[0](x[t]) + sum(
                w * layer.experts[int(e)](x[t]) for w, e in zip(weights, chosen, strict=True))
            assert torch.allclose(out[t], expected, rtol=1e-12, atol=1e-12)


def test_an_moe_block_does_the_flops_of_a_dense_mlp_of_its_active_width_plus_the_router():
    x = torch.randn(64, 32)
    dense = GatedMLP(32, 2 * 48)
    with torch.no_grad():
        assert counted(lambda: dense(x)) + 2 * 64 * 32 * 8 == moe_layer_flops(64, 32, 48, 8, 2)


# ---------------------------------------------------------------- expert parallelism


def exact_remote_pairs(n_experts: int, top_k: int, ep_size: int) -> Fraction:
    """The expected pairs of one token whose expert is on another rank than rank 0, over every
    set of top_k experts (all equally likely), the experts in blocks of E / ep_size per rank."""
    per_rank = n_experts // ep_size
    sets = list(itertools.combinations(range(n_experts), top_k))
    return Fraction(sum(sum(e // per_rank != 0 for e in s) for s in sets), len(sets))


@pytest.mark.parametrize(("n_experts", "top_k", "ep_size"),
                         [(4, 1, 2), (6, 2, 3), (8, 2, 4), (8, 3, 8), (6, 6, 2), (5, 2, 1)])
def test_expert_parallel_bytes_is_the_exact_expectation_over_every_routing(
        n_experts, top_k, ep_size) -> None:
    """Rank 0 sends its remote pairs in the dispatch, and in the combine the results of the
    pairs the other ranks (each as many tokens, routed alike) sent to its experts."""
    n_tokens, d, element = 7, 3, 2
    dispatched = n_tokens * exact_remote_pairs(n_experts, top_k, ep_size)
    per_rank = n_experts // ep_size
    sets = list(itertools.combinations(range(n_experts), top_k))
    to_rank_0 = Fraction(sum(sum(e < per_rank for e in s) for s in sets), len(sets))
    combined = (ep_size - 1) * n_tokens * to_rank_0  # from each other rank's n_tokens
    assert combined == dispatched
    exact = (dispatched + combined) * d * element
    assert expert_parallel_bytes(n_tokens, d, top_k, ep_size, element) == float(exact)


def test_a_simulated_router_sends_what_expert_parallel_bytes_expects() -> None:
    """4096 tokens, 8 of 64 experts each, 30 batches per size: the mean within 1% (the
    standard error is under 0.1% of it)."""
    generator = torch.Generator().manual_seed(1)
    for ep_size in (2, 8, 64):
        sent = [2 * int((uniform_routing(4096, 64, 8, generator) // (64 // ep_size) != 0).sum())
                * 7168 * 2 for _ in range(30)]
        assert math.isclose(sum(sent) / len(sent), expert_parallel_bytes(4096, 7168, 8, ep_size),
                            rel_tol=0.01)


@given(st.integers(0, 10**6), st.integers(1, 16384), st.integers(1, 16),
       st.sampled_from([1, 2, 4, 8, 16, 64, 256]), st.sampled_from([1, 2, 4]))
def test_expert_parallel_bytes_are_two_of_lesson_07s_all_to_alls(n_tokens, d, top_k, ep_size,
                                                                 element) -> None:
    """Dispatch and combine: each an all-to-all of the rank's T·k vectors (a buffer that
    splits evenly over the ranks when T·k does)."""
    buffer = n_tokens * top_k * ep_size * d * element  # T·ep tokens: splits into ep shards
    assert expert_parallel_bytes(n_tokens * ep_size, d, top_k, ep_size, element) == float(
        2 * collective_bytes("all_to_all", buffer, ep_size))
    assert expert_parallel_bytes(n_tokens, d, top_k, 1, element) == 0.0


# ---------------------------------------------------------------- experts a batch touches


def exact_touched(n_tokens: int, n_experts: int, top_k: int) -> Fraction:
    """The expected distinct experts of a batch, over every routing of every token."""
    sets = list(itertools.combinations(range(n_experts), top_k))
    routings = list(itertools.product(sets, repeat=n_tokens))
    return Fraction(sum(len(set().union(*r)) for r in routings), len(routings))


@pytest.mark.parametrize(("n_tokens", "n_experts", "top_k"),
                         [(0, 4, 2), (1, 5, 2), (2, 4, 1), (3, 4, 2), (2, 6, 3), (4, 3, 3),
                          (3, 5, 4)])
def test_expected_experts_touched_is_the_exact_expectation_over_every_routing(
        n_tokens, n_experts, top_k) -> None:
    # the formula's power and difference round: 1e-14 is a few ulps at these sizes
    assert math.isclose(expected_experts_touched(n_tokens, n_experts, top_k),
                        float(exact_touched(n_tokens, n_experts, top_k)), rel_tol=1e-14)


@given(st.integers(0, 5000), st.integers(1, 512), st.data())
def test_experts_touched_grow_with_the_batch_from_top_k_to_all(n_tokens, n_experts, data):
    top_k = data.draw(st.integers(1, n_experts))
    touched = expected_experts_touched(n_tokens, n_experts, top_k)
    assert type(touched) is float
    assert touched <= min(n_experts, n_tokens * top_k) * (1 + 1e-12)
    assert expected_experts_touched(n_tokens + 1, n_experts, top_k) >= touched
    assert math.isclose(expected_experts_touched(1, n_experts, top_k), top_k, rel_tol=1e-12)


def simulated_touched(n_tokens: int, n_experts: int, top_k: int, batches: int,
                      seed: int) -> float:
    """The mean distinct experts of ``batches`` batches, each token's experts drawn with
    Python's random.sample (not the lesson's router)."""
    rng = random.Random(seed)
    return sum(len({e for _ in range(n_tokens) for e in rng.sample(range(n_experts), top_k)})
               for _ in range(batches)) / batches


PREDICTION = "predicted_experts_touched"
TOUCHED = VARIANTS[PREDICTION]


@pytest.mark.parametrize("index", range(len(TOUCHED.choices)))
def test_each_students_prediction_is_what_a_simulated_router_touches(index) -> None:
    """Every variant's answer (the default: 56.4 of 64) is a simulated router's mean within 1%
    (800 batches: the standard error is under 0.2% of it), and the band of 5% holds what the cases
    module says: "all of them" misses by 13% or more, with min(T·k, E) too; the approximations
    e^(-Tk/E) and picks with repeats land within 4%."""
    from grader.content.lessons import load_lesson
    from grader.grading.plans import variant_answer

    bound = TOUCHED.bound(index)
    tokens, n, k = (bound[name] for name in ("batch_tokens", "layer_experts", "layer_top_k"))
    answer = variant_answer(load_lesson("09_experts"), PREDICTION, index)
    assert type(answer) is float
    assert math.isclose(answer, expected_experts_touched(tokens, n, k), rel_tol=1e-12)
    assert math.isclose(simulated_touched(tokens, n, k, 800, index), answer, rel_tol=0.01)
    assert tokens * k >= n  # the batch picks at least as many experts as there are
    for wrong in (n, min(tokens * k, n)):
        assert wrong / answer - 1 >= 0.13
    for near in (n * (1 - math.exp(-tokens * k / n)), n * (1 - (1 - 1 / n) ** (tokens * k))):
        assert 0 < 1 - near / answer < 0.04
    if index == 0:  # the default, which the notebook's text states and measures
        assert TOUCHED.choices[0] == (16, 64, 8)
        assert round(answer, 1) == 56.4 and answer == experts.predicted_experts_touched
        assert round(64 / answer - 1, 2) == 0.13
        assert round(1 - 64 * (1 - math.exp(-2)) / answer, 2) == 0.02


# ---------------------------------------------------------------- a decode step's bytes


def test_moe_decode_bytes_is_a_simulated_batchs_mean() -> None:
    """Mixtral's split: each of 32 layers routes 4 tokens (2 of 8 experts each); the bytes of
    the experts each layer touched, averaged over 400 steps, within 1% of the formula."""
    split = decode_split(MOE["Mixtral 8x7B"])
    rng = random.Random(0)
    steps = []
    for _ in range(400):
        touched = sum(len({e for _ in range(4) for e in rng.sample(range(8), 2)})
                      for _ in range(32))
        steps.append((split["non_expert"] + touched * split["per_expert"]) * 2)
    assert math.isclose(sum(steps) / len(steps),
                        moe_decode_bytes(4, split["non_expert"], split["per_expert"], 32, 8, 2),
                        rel_tol=0.01)


@pytest.mark.parametrize("name", sorted(MOE))
def test_a_decode_step_reads_the_active_bytes_at_batch_1_and_all_bytes_at_a_large_one(name):
    """At batch 1: every parameter one token multiplies (the active ones less the untied input
    embedding), two bytes each; at a batch of 10,000 every stored one but that lookup."""
    shape = MOE[name]
    split = decode_split(shape)
    args = (split["non_expert"], split["per_expert"], shape["n_layers"], shape["n_experts"],
            shape["top_k"])
    assert math.isclose(moe_decode_bytes(1, *args), 2 * split["multiplied"], rel_tol=1e-12)
    lookup = shape["vocab_size"] * shape["d_model"]
    assert math.isclose(moe_decode_bytes(10_000, *args), 2 * (split["stored"] - lookup),
                        rel_tol=1e-12)


def test_an_moe_decodes_one_sequence_as_a_dense_model_of_its_active_size() -> None:
    shape = MOE["Mixtral 8x7B"]
    split, h100 = decode_split(shape), ACCELERATORS["H100 SXM"]
    peak, bandwidth = h100["peak_flops"]["bf16"], h100["memory_bandwidth"]
    for context in (0, 1024):
        assert math.isclose(
            moe_decode_tokens_per_second(shape, 1, context, 131072, peak, bandwidth),
            decode_tokens_per_second(split["multiplied"], 1, context, 131072, peak, bandwidth),
            rel_tol=1e-12)


# ---------------------------------------------------------------- dropped tokens


def capacity_exactly(counts: list[int], capacity_factor: float) -> int:
    """The smallest whole C with C · n >= factor · total, the factor read as the float it is:
    Decimal(float) is the float's binary value written out in decimal, and the context raises
    if any step would round (100 digits hold every product the tests make)."""
    with decimal.localcontext() as context:
        context.prec, context.traps[decimal.Inexact] = 100, True
        bound = decimal.Decimal(capacity_factor) * sum(counts)
        capacity = int(bound // len(counts))
        return capacity if capacity * len(counts) >= bound else capacity + 1


def refused_one_by_one(counts: list[int], capacity_factor: float) -> int:
    """Assignments arrive in a shuffled order; each expert accepts until it holds its
    capacity."""
    capacity = capacity_exactly(counts, capacity_factor)
    arrivals = [e for e, c in enumerate(counts) for _ in range(c)]
    random.Random(len(arrivals)).shuffle(arrivals)
    held, refused = [0] * len(counts), 0
    for e in arrivals:
        if held[e] < capacity:
            held[e] += 1
        else:
            refused += 1
    return refused


@given(st.lists(st.integers(0, 60), min_size=1, max_size=12),
       st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0]))
def test_dropped_tokens_is_a_direct_count_of_refused_assignments(counts, factor) -> None:
    got = dropped_tokens(counts, factor)
    assert type(got) is int and got == refused_one_by_one(counts, factor)
    assert dropped_tokens(counts, factor * 2) <= got


def test_a_decimal_capacity_factor_is_read_as_the_float_it_is() -> None:
    """1.1 is stored as 1.1000000000000000888...: 100 assignments over 10 experts at 1.1 have
    a capacity of 12 (the ceiling of 11.0000000000000008...), not the 11 of a decimal 1.1, as
    dropped_tokens' comment and the lesson say."""
    counts, factor = [12] + [10] * 8 + [8], 1.1
    assert decimal.Decimal(factor) > decimal.Decimal("1.1")  # the float, written out exactly
    assert capacity_exactly(counts, factor) == 12
    assert math.ceil(Fraction("1.1") * 100 / 10) == 11  # what a decimal factor would give
    assert dropped_tokens(counts, factor) == 0 == refused_one_by_one(counts, factor)
    assert dropped_tokens([13] + [10] * 8 + [7], factor) == 1


def float_capacities(counts, factor) -> set[int]:
    """The capacity as floats compute it in five orders a student may write."""
    total, n = sum(counts), len(counts)
    return {math.ceil(v) for v in (factor * total / n, total * factor / n, factor * (total / n),
                                   total / n * factor, factor / n * total)}


def test_every_capacity_the_checks_use_is_the_same_in_any_float_order() -> None:
    """The fixed hidden checks, the notebook's examples and 30 seeds of drawn ones: floats in
    any order give the exact capacity, so no honest float implementation loses a point."""
    from grader.content.cases import as_case

    calls = [as_case(c).expression for c in CASES["dropped_tokens"] if not as_case(c).raises]
    calls += [c for seed in range(30) for c in DRAWN["dropped_tokens"](random.Random(seed))]
    calls += ["dropped_tokens([3, 1, 0, 4], 1.0)", "dropped_tokens([3, 1, 0, 4], 1.5)"]
    for call in calls:
        counts, factor = eval(call.removeprefix("dropped_tokens"))
        assert float_capacities(counts, factor) == {capacity_exactly(counts, factor)}, call


# ---------------------------------------------------------------- given routers and balancing


def test_the_routers_pick_distinct_experts_uniformly_or_by_popularity() -> None:
    generator = torch.Generator().manual_seed(0)
    chosen = uniform_routing(20000, 8, 3, generator)
    assert all(len(set(row)) == 3 for row in chosen.tolist())
    shares = torch.tensor(expert_counts(chosen, 8)) / chosen.numel()
    assert torch.allclose(shares, torch.full((8,), 1 / 8), atol=0.01)  # 4 standard errors
    popularity = torch.tensor([8.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    first = skewed_routing(20000, popularity, 1, generator)  # one pick: proportional
    assert abs(expert_counts(first, 8)[0] / 20000 - 8 / 15) < 0.015


def test_the_switch_loss_is_one_when_even_and_grows_with_the_skew() -> None:
    even_scores = torch.full((8, 4), 0.25)
    even_choice = torch.tensor([[0], [1], [2], [3]] * 2)
    assert math.isclose(float(switch_aux_loss(even_scores, even_choice)), 1.0, rel_tol=1e-6)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8)
    assert float(switch_aux_loss(skewed, torch.zeros(8, 1, dtype=torch.long))) == pytest.approx(
        4 * 0.7)


def test_the_switch_loss_is_not_smallest_at_even_shares() -> None:
    """The lesson's example: a top-1 router of two experts sends 60% of its tokens to the first,
    barely preferring it, and 40% firmly to the second: shares 0.6 and 0.4, mean probabilities
    0.3 and 0.7, and a loss of 2 (0.6 · 0.3 + 0.4 · 0.7) = 0.92, below the 1 of even shares."""
    tiny = 1e-6
    scores = torch.tensor([[0.5 + tiny, 0.5 - tiny]] * 6 + [[0.0, 1.0]] * 4, dtype=torch.float64)
    chosen = scores.topk(1, dim=-1).indices
    assert expert_counts(chosen, 2) == [6, 4]
    assert float(switch_aux_loss(scores, chosen)) == pytest.approx(0.92, abs=1e-6)


def test_the_switch_losss_gradient_is_e_times_the_shares_and_lowers_the_busiest_expert():
    """d loss / d P_i = E · f_i (autograd against the formula); through a softmax of logits +
    a preference, the preference's gradient is E / T · sum_t p_ti (f_i - sum_j f_j p_tj), and a
    step down it lowers the busiest expert's mean probability."""
    generator = torch.Generator().manual_seed(4)
    n_tokens, n_experts, top_k = 256, 8, 2
    logits = torch.randn(n_tokens, n_experts, generator=generator, dtype=torch.float64)
    logits[:, 0] += 1.5  # expert 0 favoured
    preference = torch.zeros(n_experts, dtype=torch.float64, requires_grad=True)
    scores = (logits + preference).softmax(dim=-1)
    scores.retain_grad()
    chosen = scores.topk(top_k, dim=-1).indices
    share = torch.tensor(expert_counts(chosen, n_experts), dtype=torch.float64) / chosen.numel()
    switch_aux_loss(scores, chosen).backward()
    # each token's probability of expert i enters P_i with weight 1 / T: E · f_i / T each
    assert torch.allclose(scores.grad, (n_experts * share / n_tokens).expand(n_tokens, -1),
                          rtol=1e-12, atol=0)
    p = scores.detach()
    expected = n_experts / n_tokens * (p * (share - (p * share).sum(-1, keepdim=True))).sum(0)
    assert torch.allclose(preference.grad, expected, rtol=1e-10, atol=1e-15)
    busiest = int(share.argmax())
    assert busiest == 0 and preference.grad[0] == preference.grad.max() > 0
    stepped = (logits + preference.detach() - preference.grad).softmax(dim=-1).mean(0)
    assert stepped[0] < p.mean(0)[0]


def test_ten_steps_on_the_switch_loss_balance_the_skewed_router_of_the_lesson() -> None:
    """The notebook's skewed router (its seeds) and ten steps of 10 down the loss's gradient:
    the loss from 1.537 to 1.012, the busiest expert from 5.21 to 1.10 times the even share,
    every step lower than the one before."""
    from solutions.moe_layer import balance_by_aux_loss

    popularity = torch.exp(0.5 * torch.randn(64, generator=torch.Generator().manual_seed(0)))
    logits = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    losses, busiest = balance_by_aux_loss(logits + popularity.log(), 8, 11, 10.0)
    assert len(losses) == len(busiest) == 11
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert [round(losses[0], 3), round(losses[-1], 3)] == [1.537, 1.012]
    assert [round(busiest[0], 2), round(busiest[-1], 2)] == [5.21, 1.10]
    assert (round(busiest[0], 1), round(busiest[-1], 1)) == (5.2, 1.1)  # as the text says
    chosen = (logits + popularity.log()).softmax(dim=-1).topk(8, dim=-1).indices
    assert busiest[0] == max(expert_counts(chosen, 64)) / 512


def test_the_bias_moves_only_the_choice_and_against_the_load() -> None:
    affinity = torch.tensor([[0.9, 0.8, 0.1], [0.7, 0.6, 0.5]])
    assert biased_top_k(affinity, torch.zeros(3), 1).flatten().tolist() == [0, 0]
    assert biased_top_k(affinity, torch.tensor([-0.5, 0.0, 0.0]), 1).flatten().tolist() == [1, 1]
    assert update_bias(torch.zeros(3), [5, 1, 3], 0.01).tolist() == pytest.approx(
        [-0.01, 0.01, 0.0])


def test_the_bias_changes_which_affinities_get_a_gradient_and_adds_no_loss() -> None:
    """The chosen experts' outputs are weighted by their affinities alone: the output's gradient
    reaches the affinities of the chosen experts only, so a bias that changes the choice changes
    which affinities learn; the bias itself gets no gradient (it is no term of any loss)."""
    affinity = torch.tensor([[0.9, 0.8, 0.1]], requires_grad=True)
    bias = torch.tensor([-0.5, 0.0, 0.0], requires_grad=True)
    expert_outputs = torch.tensor([[1.0, 2.0, 3.0]])
    for shift, chosen_expert in ((torch.zeros(3, requires_grad=True), 0), (bias, 1)):
        chosen = biased_top_k(affinity, shift, 1)
        assert chosen.tolist() == [[chosen_expert]]
        out = (affinity.gather(1, chosen) * expert_outputs.gather(1, chosen)).sum()
        to_affinity, to_bias = torch.autograd.grad(out, (affinity, shift), allow_unused=True,
                                                   materialize_grads=True)
        assert to_affinity.nonzero()[:, 1].tolist() == [chosen_expert]
        assert not to_bias.any()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("call", "words"), [
    (lambda: moe_params(32, 4096, 32, 8, 14336, 8, 9, 32000), "top_k must be between 1 and"),
    (lambda: moe_params(32, 4096, 30, 8, 14336, 8, 2, 32000), "does not split into n_heads"),
    (lambda: moe_params(32, 4096.0, 32, 8, 14336, 8, 2, 32000), "d_model must be an integer"),
    (lambda: moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000, tied_embeddings=1), "True or"),
    (lambda: moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000, -1), "n_shared_experts must be"),
    (lambda: moe_layer_flops(True, 64, 128, 8, 2), "n_tokens must be an integer"),
    (lambda: expert_parallel_bytes(1, 1, 1, 0), "ep_size must be >= 1"),
    (lambda: expert_parallel_bytes(1, 1, 1, 1, math.nan), "bytes_per_element must be a finite"),
    (lambda: expected_experts_touched(4, 8, 0), "top_k must be >= 1"),
    (lambda: moe_decode_bytes(1, 10, 0, 1, 8, 2), "params_per_expert must be >= 1"),
    (lambda: dropped_tokens([], 1.0), "non-empty list"),
    (lambda: dropped_tokens([1, -2], 1.0), "every expert count must be >= 0"),
    (lambda: dropped_tokens([1, 2], 0), "capacity_factor must be a finite number > 0"),
])
def test_bad_input_is_named(call, words) -> None:
    with pytest.raises(ValueError, match=words):
        call()


# ---------------------------------------------------------------- hidden checks stay in bounds


def _count(minimum: int) -> tuple:
    """An integer (a bool is not a count) at least ``minimum``."""
    return lambda v: type(v) is int and v >= minimum


_NUMBER = lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0  # noqa: E731
_SIZES = {"n_layers": _count(1), "d_model": _count(1), "n_heads": _count(1),
          "n_kv_heads": _count(1), "d_ff_expert": _count(1), "n_experts": _count(1),
          "top_k": _count(1), "vocab_size": _count(1), "n_shared_experts": _count(0),
          "head_dim": lambda v: v is None or _count(1)(v),
          "tied_embeddings": lambda v: type(v) is bool}
# What each exercise's text accepts, argument by argument (ValueError outside it), and what it
# asks across arguments (top_k at most n_experts; d_model split into heads unless head_dim).
STATED = {
    "moe_params": _SIZES,
    "moe_layer_flops": {"n_tokens": _count(0), "d_model": _count(1), "d_ff_expert": _count(1),
                        "n_experts": _count(1), "top_k": _count(1),
                        "n_shared_experts": _count(0)},
    "expert_parallel_bytes": {"n_tokens": _count(0), "d_model": _count(1), "top_k": _count(1),
                              "ep_size": _count(1), "bytes_per_element": _NUMBER},
    "expected_experts_touched": {"n_tokens": _count(0), "n_experts": _count(1),
                                 "top_k": _count(1)},
    "moe_decode_bytes": {"batch_size": _count(1), "non_expert_params": _count(0),
                         "params_per_expert": _count(1), "n_layers": _count(1),
                         "n_experts": _count(1), "top_k": _count(1),
                         "bytes_per_param": _NUMBER},
    "dropped_tokens": {"expert_counts": lambda v: type(v) in (list, tuple) and len(v) > 0
                       and all(_count(0)(c) for c in v), "capacity_factor": _NUMBER},
}


def joint_faults(bound: dict) -> list[str]:
    """The rules that tie arguments together, broken by ``bound``."""
    faults = []
    if "top_k" in bound and "n_experts" in bound and bound["top_k"] > bound["n_experts"]:
        faults.append("top_k > n_experts")
    if "n_heads" in bound and bound["head_dim"] is None and bound["d_model"] % bound["n_heads"]:
        faults.append("d_model does not split")
    return faults


def arguments_of(name: str, expression: str) -> dict:
    """What ``expression`` passes to exercise ``name``, by parameter, defaults filled in."""
    import inspect

    function = getattr(experts, name)
    assert set(STATED[name]) == set(inspect.signature(function).parameters), name
    return call_arguments(function, expression)


def test_every_hidden_check_stays_inside_what_its_exercise_states() -> None:
    """Each value check calls its exercise with arguments its text accepts; each error check
    breaks exactly one thing the text names."""
    from grader.content.cases import as_case

    assert set(STATED) == set(CASES) - {PREDICTION}
    for name, stated in STATED.items():
        cases = [as_case(c) for c in CASES[name]]
        assert sum(c.raises == "ValueError" for c in cases) >= 4, name
        for case in cases:
            bound = arguments_of(name, case.expression)
            broken = [a for a, ok in stated.items() if not ok(bound[a])]
            if not broken:
                broken = joint_faults(bound)
            assert len(broken) == (case.raises is not None), (case.expression, broken)
            assert case.raises in (None, "ValueError")


def test_every_hidden_check_holds_on_the_reference_and_says_what_its_comment_says() -> None:
    from grader.content.cases import as_case, reference_raises, reference_value

    namespace = {**vars(experts), "math": math}
    value = {}
    for cases in CASES.values():
        for case in map(as_case, cases):
            if case.raises:
                reference_raises(case, namespace)
            else:
                value[case.expression] = reference_value(case, namespace)
    mixtral = value["moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000)"]
    assert mixtral == simple_params(MOE["Mixtral 8x7B"])
    assert value["moe_params(16, 2048, 16, 16, 1024, 64, 8, 50304)"] == simple_params(
        MOE["OLMoE-1B-7B"])
    assert value["moe_params(48, 2048, 32, 4, 768, 128, 8, 151936, head_dim=128)"] == (
        simple_params(MOE["Qwen3-30B-A3B"]))
    assert value["moe_params(61, 7168, 128, 128, 2048, 256, 8, 129280, 1, head_dim=128)"] \
        == simple_params(MOE["DeepSeek-V3"])
    from grader.content.cases import experts as cases

    for split, shape in ((cases._MIXTRAL_SPLIT, "Mixtral 8x7B"),
                         (cases._DEEPSEEK_SPLIT, "DeepSeek-V3")):
        s, m = decode_split(MOE[shape]), MOE[shape]
        assert split == (f"{s['non_expert']}, {s['per_expert']}, {m['n_layers']}, "
                         f"{m['n_experts']}, {m['top_k']}")
    assert value["moe_layer_flops(0, 16, 16, 4, 2, 3)"] == 0
    assert value["expert_parallel_bytes(4096, 7168, 8, 1)"] == 0.0
    assert value["expected_experts_touched(4, 8, 2)"] == 5.46875 == 8 * (1 - 0.75**4)
    assert value["expected_experts_touched(5, 6, 6)"] == 6.0
    assert value["dropped_tokens([9, 9, 9, 9, 9, 9, 9, 9], 1.0)"] == 0
    assert value["dropped_tokens((5, 7, 2), 1.25)"] == 1  # C = ceil(5.83) = 6
    assert value["dropped_tokens([700, 500, 412, 436], 1.1)"] == 700 - 564


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_each_students_drawn_checks_are_valid_exact_and_their_own(name) -> None:
    """grader/content/cases/experts.py's DRAWN: three value checks per seed, inside what the
    exercise states, exact (integers), and equal to an oracle written another way: the
    parameters component by component, the FLOPs pair by pair, the drops one by one."""
    from grader.content.cases import as_case, reference_value
    from tests.grading_helpers import drawn_calls

    draws = drawn_calls(DRAWN[name], range(8))
    for calls in draws:
        for case in map(as_case, calls):
            assert case.raises is None and case.rel_tol == 0
            a = arguments_of(name, case.expression)
            assert all(ok(a[p]) for p, ok in STATED[name].items()) and not joint_faults(a), a
            got = reference_value(case, vars(experts))
            assert got == ORACLES[name](**a), case.expression


def _params_oracle(n_layers, d_model, n_heads, n_kv_heads, d_ff_expert, n_experts, top_k,
                   vocab_size, n_shared_experts, head_dim, tied_embeddings) -> tuple[int, int]:
    """Matrix by matrix, as a release lists them (q, k, v, o, the router, each expert's
    three), summed separately for all experts and for top_k of them."""
    hd = d_model // n_heads if head_dim is None else head_dim
    matrices = [(d_model, n_heads * hd), (d_model, n_kv_heads * hd), (d_model, n_kv_heads * hd),
                (n_heads * hd, d_model), (d_model, n_experts)]
    expert = [(d_model, d_ff_expert)] * 3
    embeddings = [(vocab_size, d_model)] * (1 if tied_embeddings else 2)

    def count(routed: int) -> int:
        layer = matrices + expert * (routed + n_shared_experts)
        return n_layers * sum(a * b for a, b in layer) + sum(a * b for a, b in embeddings)

    return count(n_experts), count(top_k)


def _flops_oracle(n_tokens, d_model, d_ff_expert, n_experts, top_k, n_shared_experts) -> int:
    pairs = n_tokens * (top_k + n_shared_experts)
    return 2 * n_tokens * d_model * n_experts + pairs * 3 * 2 * d_model * d_ff_expert


ORACLES = {"moe_params": _params_oracle, "moe_layer_flops": _flops_oracle,
           "dropped_tokens": lambda expert_counts, capacity_factor: refused_one_by_one(
               list(expert_counts), capacity_factor)}


# ---------------------------------------------------------------- other correct answers
# Implementations a student may write that must score full marks within the hidden checks'
# tolerances (tests/test_portability.py's ALTERNATIVES["09_experts"] names them).


def expert_parallel_bytes_by_share(n_tokens, d_model, top_k, ep_size, bytes_per_element=2):
    """The remote share first, as a float, then the bytes."""
    remote = 1 - 1 / ep_size
    return 2.0 * n_tokens * top_k * remote * d_model * bytes_per_element


def expected_experts_touched_by_logs(n_tokens, n_experts, top_k):
    """E minus the expected experts missed, the power through exp and log1p."""
    if top_k == n_experts:
        return float(n_experts) if n_tokens else 0.0
    return -n_experts * math.expm1(n_tokens * math.log1p(-top_k / n_experts))


def expected_experts_touched_by_missing(n_tokens, n_experts, top_k):
    """E less E times the chance an expert is missed."""
    return n_experts - n_experts * ((n_experts - top_k) / n_experts) ** n_tokens


def moe_decode_bytes_layer_by_layer(batch_size, non_expert_params, params_per_expert,
                                    n_layers, n_experts, top_k, bytes_per_param=2):
    touched = expected_experts_touched_by_logs(batch_size, n_experts, top_k)
    weights = non_expert_params * bytes_per_param
    for _ in range(n_layers):
        weights += touched * params_per_expert * bytes_per_param
    return weights


ALTERNATIVES = {
    "expert_parallel_bytes": [expert_parallel_bytes_by_share],
    "expected_experts_touched": [expected_experts_touched_by_logs,
                                 expected_experts_touched_by_missing],
    "moe_decode_bytes": [moe_decode_bytes_layer_by_layer],
}


@given(st.integers(0, 10**5), st.integers(1, 512), st.data())
def test_the_other_correct_answers_agree_with_the_reference(n_tokens, n_experts, data) -> None:
    top_k = data.draw(st.integers(1, n_experts))
    for variant in ALTERNATIVES["expected_experts_touched"]:
        # the difference 1 - x^T amplifies the last bits by up to E / k (512): 1e-12
        assert math.isclose(variant(n_tokens, n_experts, top_k),
                            expected_experts_touched(n_tokens, n_experts, top_k),
                            rel_tol=1e-12, abs_tol=1e-300)


def test_the_other_correct_answers_pass_every_hidden_check() -> None:
    from tests.grading_helpers import assert_alternatives_pass_hidden_checks

    assert_alternatives_pass_hidden_checks(ALTERNATIVES, experts, CASES)


# ---------------------------------------------------------------- the lesson's figures


def test_the_sealed_answer_is_deepseek_v3s_mfu_from_the_data() -> None:
    """6·37e9·14.8e12 over 2.664M H800 GPU-hours at the dense bf16 peak: 34.6%; lesson 03's
    mfu and the data files give the module's constant."""
    from solutions.flops import mfu

    run, h800 = MOE["DeepSeek-V3"]["training"], ACCELERATORS["H800 SXM"]
    flops = 6 * MOE["DeepSeek-V3"]["reported_active_params"] * run["tokens"]
    got = mfu(flops, run["pretraining_gpu_hours"] * 3600, h800["peak_flops"]["bf16"])
    assert math.isclose(got, experts.predicted_deepseek_v3_mfu, rel_tol=1e-12)
    assert round(got, 3) == 0.346


def test_the_numbers_the_lessons_text_states() -> None:
    """notebooks/09_experts: every number its prose states, from the lesson's functions and the
    data files (the simulations with the notebook's seeds)."""
    mixtral, qwen, v3 = (MOE[n] for n in ("Mixtral 8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"))
    sizes = {n: simple_params(MOE[n]) for n in MOE}
    h100, h800 = ACCELERATORS["H100 SXM"], ACCELERATORS["H800 SXM"]
    # introduction: the published sizes, as models.json records them
    assert [(m["reported_total_params"], m["reported_active_params"]) for m in MOE.values()] == [
        (46.7e9, 12.9e9), (6.9e9, 1.3e9), (30.5e9, 3.3e9), (671e9, 37e9)]
    # a batch of a few dozen tokens routed uniformly at random reads most of a layer's experts
    # (the introduction gives no number: a share of E was one variant's answer, review 5)
    assert all(expected_experts_touched(tokens, 256, 8) > 128 for tokens in (24, 36, 48))
    # section 2: the shares a token uses; Qwen3's heads; 29.9B; MLA's 187M against 470M
    assert [round(100 * a / t) for t, a in list(sizes.values())[:3]] == [28, 19, 11]
    assert qwen["head_dim"] == 128 and qwen["d_model"] // qwen["n_heads"] == 64
    assert round((sizes["Qwen3-30B-A3B"][0] - 2 * 151936 * 2048) / 1e8) == 299
    assert round(sizes["Qwen3-30B-A3B"][1] / 1e7) == 335
    assert round(mla_attention_params(v3) / 1e6) == 187 and round(4 * 7168 * 128**2 / 1e7) == 47
    assert (v3["mla"]["q_lora_rank"], v3["mla"]["kv_lora_rank"], v3["n_dense_layers"],
            v3["d_ff_dense"]) == (1536, 512, 3, 18432)
    total, active = deepseek_v3_params(v3)
    assert (round(total / 1e8), round(active / 1e8)) == (6710, 376)
    lookup = v3["vocab_size"] * v3["d_model"]
    assert round(lookup / 1e7) == 93 and round((active - lookup) / 1e8) == 366
    assert v3["reported_active_params_without_input_embedding"] == 36.6e9
    assert "36.6B (including 0.9B for the output Head)" in v3["reported_source"]
    assert "36.7B" in v3["reported_source"] and round(active / 1e8) == 376
    # section 2: which published active counts hold both embeddings
    for name in ("Mixtral 8x7B", "OLMoE-1B-7B"):
        assert round(sizes[name][1] / 1e8) * 1e8 == MOE[name]["reported_active_params"]
    assert "14B" in v3["reported_source"]
    # section 1: the even share of the layer's pairs; section 3: the example, the layers' FLOPs
    assert 32 * 2 // 8 == 8
    assert moe_layer_flops(32, 64, 128, 8, 2) == 3_178_496
    moe, dense_active, dense_total = (moe_layer_flops(1, 256, 512, 8, 2), 6 * 256 * 1024,
                                      6 * 256 * 4096)
    assert round(moe / dense_total, 2) == 0.25 and round(100 * (moe / dense_active - 1), 1) == 0.3
    # section 4: the run, the H800, the MFU (both peaks, both GPU-hour counts), 18 times, the
    # memory and its GPUs
    run = v3["training"]
    assert (run["pretraining_gpu_hours"], run["total_gpu_hours"], run["tokens"],
            run["n_gpus"]) == (2.664e6, 2.788e6, 14.8e12, 2048)
    assert h800["peak_flops"]["bf16"] == h100["peak_flops"]["bf16"] == 989.4e12
    assert h800["peak_flops"]["fp64"] == 1e12 and "400 GB/s" in h800["source"]
    assert h800["nvlink_bytes_per_s_both_directions"] == 400e9
    assert NODE["nvlink_bytes_per_s_both_directions"] == 900e9  # the H100's: 400 < 900 / 2
    flops = 6 * 37e9 * run["tokens"]
    mfus = [flops / (h * 3600 * h800["peak_flops"][p])
            for h, p in ((run["pretraining_gpu_hours"], "bf16"),
                         (run["pretraining_gpu_hours"], "fp8"), (run["total_gpu_hours"], "bf16"))]
    assert [round(100 * m, 1) for m in mfus] == [34.6, 17.3, 33.1]
    assert round(100 * mfus[0]) == 35 and round(671 / 37) == 18
    # the multi-token prediction module (the report's section 2.2): per token one more MoE
    # block (MLA, the shared expert and 8 routed ones, the router), the projection of two
    # d-vectors to one, and the shared output head
    block = (mla_attention_params(v3) + 9 * 3 * 7168 * v3["d_ff_expert"]
             + 7168 * v3["n_experts"])
    mtp = block + 2 * 7168 * 7168 + v3["vocab_size"] * 7168
    assert round(mtp / 1e8) / 10 == 1.6 and round(100 * mtp / 37e9, 1) == 4.4
    assert round(100 * mfus[0] * (1 + mtp / 37e9), 1) == 36.1
    # attention at the pre-training context, per token, forward: both matmuls of each head
    # (q . k over 128 + 64 numbers, the sum of values of 128) over the keys a causal query sees,
    # summed position by position
    assert run["seq_len"] == 4096
    per_key = v3["n_layers"] * v3["n_heads"] * 2 * (128 + 64 + 128)
    causal = per_key * sum(range(1, 4097)) / 4096
    square = per_key * 4096
    assert round(causal / 1e8) == 102 and round(square / 1e8) == 205
    assert round(100 * causal / 74e9, 1) == 13.8 and round(100 * square / 74e9, 1) == 27.7
    seconds, peak = run["pretraining_gpu_hours"] * 3600, h800["peak_flops"]["bf16"]
    assert round(100 * (flops + 3 * causal * run["tokens"]) / (seconds * peak), 1) == 39.4
    assert round(100 * (flops + 3 * square * run["tokens"]) / (seconds * peak), 1) == 44.2
    state = 16 * total
    assert round(state / 1e11) / 10 == 10.7 and math.ceil(state / 80e9) == 135
    assert round(16 * active / 1e11) / 10 == 0.6
    # section 5: the example, the links, the times against the experts' compute
    assert expert_parallel_bytes(4096, 7168, 8, 8) == 822_083_584.0
    assert NODE["nvlink_bytes_per_s"] / NODE["nic_bytes_per_s"] == 9
    from solutions.expert_models import all_to_all_seconds

    compute = moe_layer_flops(4096, 7168, 2048, 256, 8, 1) / h100["peak_flops"]["bf16"]
    times = {ep: all_to_all_seconds(4096, 7168, 8, ep, 8, NODE["nvlink_bytes_per_s"],
                                    NODE["nic_bytes_per_s"]) / compute for ep in (8, 16, 64, 256)}
    assert round(times[8], 1) == 0.6 and all(times[ep] > 2.5 for ep in (16, 64, 256))
    assert (run["max_nodes_per_token"], run["dispatch_bytes_per_element"],
            run["combine_bytes_per_element"]) == (4, 1, 2)
    assert "64 GPUs of 8 nodes" in run["source"] and "at most 4 nodes" in run["source"]
    # section 6: the routers, with the notebook's seeds
    generator = torch.Generator().manual_seed(0)
    popularity = torch.exp(0.5 * torch.randn(64, generator=generator))
    uniform = expert_counts(uniform_routing(4096, 64, 8, generator), 64)
    skewed = expert_counts(skewed_routing(4096, popularity, 8, generator), 64)
    assert 4096 * 8 == 32_768 and 32_768 // 64 == 512
    assert round(100 * dropped_tokens(uniform, 1.0) / 32_768, 1) == 1.4
    assert all(dropped_tokens(uniform, f) == 0 for f in (1.25, 1.5, 2.0, 2.5, 3.0))
    assert round(max(skewed) / 512) == 4 and 0.02 < dropped_tokens(skewed, 2.0) / 32_768 < 0.05
    assert round(max(skewed) / 512, 1) == 3.8  # the sampling router's busiest expert
    from solutions.moe_layer import balance_by_aux_loss

    logits = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    _, top_k_busiest = balance_by_aux_loss(logits + popularity.log(), 8, 11, 10.0)
    assert [round(b, 1) for b in (top_k_busiest[0], top_k_busiest[-1])] == [5.2, 1.1]
    from solutions.moe_layer import simulate_bias_balancing

    dropped, busiest = simulate_bias_balancing(popularity.log(), 8, 100, 1024, 0.01, 1.25,
                                               torch.Generator().manual_seed(2))
    assert round(100 * dropped[0], 1) == 23.5 and round(busiest[0], 1) == 5.2
    assert next(i for i, d in enumerate(dropped) if d < 0.01) < 20  # "within 20 steps"
    assert round(100 * max(dropped[-50:]), 2) == 0.49
    assert round(sum(busiest[-50:]) / 50, 2) == 1.30 and round(max(busiest[-50:]), 2) == 1.54
    uniform = torch.Generator().manual_seed(3)
    even = [max(expert_counts(uniform_routing(1024, 64, 8, uniform), 64)) / 128
            for _ in range(50)]
    assert round(sum(even) / 50, 2) == 1.20
    # section 7: the default's reasoning, the examples, Mixtral on two H100s
    assert round(64 * (1 - (56 / 64) ** 16), 1) == 56.4 and 16 * 8 == 128
    assert expected_experts_touched(4, 8, 2) == 5.46875
    split = decode_split(mixtral)
    assert (split["non_expert"], split["per_expert"]) == (1_474_297_856, 176_160_768)
    assert moe_decode_bytes(1, 1_474_297_856, 176_160_768, 32, 8, 2) == 25_497_174_016.0
    assert round(2 * sizes["Mixtral 8x7B"][0] / 1e8) / 10 == 93.4
    kv = 2 * 32 * 8 * 128 * 2
    assert kv == 128 * 1024
    peak, bandwidth = 2 * h100["peak_flops"]["bf16"], 2 * h100["memory_bandwidth"]
    lookup = 32000 * 4096

    def rates(b: int) -> tuple[float, float, float]:
        return (moe_decode_tokens_per_second(mixtral, b, 1024, kv, peak, bandwidth),
                decode_tokens_per_second(split["stored"] - lookup, b, 1024, kv, peak, bandwidth),
                decode_tokens_per_second(split["multiplied"], b, 1024, kv, peak, bandwidth))

    assert round(rates(1)[0] / rates(1)[1], 1) == 3.6
    assert math.isclose(rates(1)[0], rates(1)[2], rel_tol=1e-12)
    assert round(expected_experts_touched(4, 8, 2), 1) == 5.5
    assert round(expected_experts_touched(16, 8, 2), 2) == 7.92
    assert all(r[0] / r[1] < 1.01 for r in map(rates, (16, 32, 64, 128, 256)))
    # compute-bound near 514 sequences for the dense model of the same total
    n_total = split["stored"] - lookup
    # a step of b: compute 2·N·b / peak against memory (2·N + b·c·k) / bandwidth; equal at
    b = (2 * n_total / bandwidth) / (2 * n_total / peak - 1024 * kv / bandwidth)
    assert round(b) == 514 and round(b * 1024 * kv / 1e9) == 69
    # 69 GB of cache and 93 GB of weights: past 160 GB, and past lesson 08's 90% of it
    from solutions.serving import MEMORY_RESERVE

    assert b * 1024 * kv + 2 * split["stored"] > 160e9 and MEMORY_RESERVE == 0.10
    assert round(peak / (2 * n_total), -2) == 21_200
    assert round(peak / (2 * split["multiplied"]), -2) == 77_600
    # the MoE never turns compute-bound at this context: a sequence's cache, 128 MiB, takes
    # longer to read than its token's FLOPs take, and caps the rate at bandwidth / cache bytes
    cache = 1024 * kv
    assert cache == 128 * 2**20
    assert round(cache / bandwidth * 1e6, 1) == 20.0
    assert round(2 * split["multiplied"] / peak * 1e6, 1) == 12.9
    ceiling = bandwidth / cache
    assert round(ceiling, -2) == 49_900
    for b in (514, 2048, 10**5):
        assert rates(b)[0] < ceiling
    assert math.isclose(rates(10**7)[0], ceiling, rel_tol=1e-3)
    # section 8: what to try
    from solutions.experts_explorer import moe_plan

    plans = {b: moe_plan(mixtral, 8, 2, b, 2, h100, NODE) for b in (1, 8)}
    assert round(plans[8]["touched"], 1) == 7.2
    assert [round(p["moe_tokens"] / p["dense_total_tokens"], 1) for p in plans.values()] == [
        3.6, 1.1]
    wide = moe_plan(mixtral, 64, 2, 1, 2, h100, NODE)
    assert round(wide["total"] / plans[1]["total"]) == 8 and wide["total"] < 8 * plans[1]["total"]
    assert 0 < wide["active"] / plans[1]["active"] - 1 < 0.001
    deep = {ep: moe_plan(v3, 256, 8, 1, ep, h100, NODE) for ep in (8, 16, 32, 64)}
    assert deep[8]["a2a_seconds"] < deep[8]["expert_seconds"]
    assert all(deep[ep]["a2a_seconds"] > 2.5 * deep[ep]["expert_seconds"] for ep in (16, 32, 64))
    assert round(100 * 8 / 128) == 6 and expected_experts_touched(64, 128, 8) > 125
