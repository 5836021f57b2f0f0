"""Hidden checks of lesson 09 (an MoE's total and active parameters, the FLOPs of an MoE
block, expert parallelism's bytes, dropped tokens, the experts a decode batch touches and the
weight bytes it reads). See grader/content/cases/__init__.py.

Every input stays inside what its exercise states (its text and docstring): sizes at or above
their stated minimum, numbers finite and above 0 where it asks so, and each error case one that
the text names (the lesson asks for ValueError for every bad input)."""

import random
from fractions import Fraction

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# Parameters, FLOPs and dropped tokens are integers: exact. The bytes of expert parallelism are a
# product and one division; the experts touched and the bytes a decode step reads a power, a
# difference and a few products of floats: a correct formula in another order (E - E·x^T,
# exp(T·log1p(-k/E)), a quotient taken first) may differ in the last bits, and the difference
# 1 - x^T amplifies that by at most E / k (256 here), so 1e-12 leaves room.
_REL = 1e-12
# Mixtral 8x7B (data/models.json): its shape, and what a decode step reads outside its routed
# experts (attention, routers, unembedding: tests/test_experts.py counts them) and per expert.
_MIXTRAL = "32, 4096, 32, 8, 14336, 8, 2, 32000"
_MIXTRAL_SPLIT = "1474297856, 176160768, 32, 8, 2"
_DEEPSEEK_SPLIT = "32380551168, 44040192, 61, 256, 8"  # simple count: every block MoE

CASES: dict[str, list[Case | str]] = {
    "moe_params": [
        f"moe_params({_MIXTRAL})",  # 46.7B and 12.9B
        "moe_params(16, 2048, 16, 16, 1024, 64, 8, 50304)",  # OLMoE-1B-7B: 6.9B and 1.3B
        "moe_params(48, 2048, 32, 4, 768, 128, 8, 151936, head_dim=128)",  # Qwen3-30B-A3B
        "moe_params(61, 7168, 128, 128, 2048, 256, 8, 129280, 1, head_dim=128)",  # V3, simply
        "moe_params(1, 8, 2, 1, 16, 4, 1, 10, 1, None, True)",
        "moe_params(3, 12, 3, 1, 7, 5, 5, 11, tied_embeddings=True)",  # top_k = n_experts
        "moe_params(2, 10, 4, 2, 3, 1, 1, 1, head_dim=3)",  # d_model not split: head_dim given
        "moe_params(1, 1, 1, 1, 1, 1, 1, 1, n_shared_experts=0)",
        raises("moe_params(32, 4096, 32, 8, 14336, 8, 9, 32000)", "ValueError"),  # top_k > E
        raises("moe_params(32, 4096, 32, 8, 14336, 8, 0, 32000)", "ValueError"),
        raises("moe_params(0, 4096, 32, 8, 14336, 8, 2, 32000)", "ValueError"),
        raises("moe_params(32, 4096, 32, 0, 14336, 8, 2, 32000)", "ValueError"),
        raises("moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000, n_shared_experts=-1)",
               "ValueError"),
        raises("moe_params(32, 4096, 30, 8, 14336, 8, 2, 32000)", "ValueError"),  # 4096 / 30
        raises("moe_params(32, 4096, 32, 8, 14336, 8, 2, 32000, head_dim=0)", "ValueError"),
        raises("moe_params(32, 4096.0, 32, 8, 14336, 8, 2, 32000)", "ValueError"),
        raises("moe_params(32, 4096, 32, 8, 14336, True, 1, 32000)", "ValueError"),
        raises(f"moe_params({_MIXTRAL}, tied_embeddings=None)", "ValueError"),
    ],
    "moe_layer_flops": [
        "moe_layer_flops(32, 64, 128, 8, 2)",
        "moe_layer_flops(32, 64, 128, 8, 2, 1)",
        "moe_layer_flops(4096, 4096, 14336, 8, 2)",  # a Mixtral block, 4096 tokens
        "moe_layer_flops(4096, 7168, 2048, 256, 8, n_shared_experts=1)",  # a DeepSeek-V3 block
        "moe_layer_flops(1, 1, 1, 1, 1)",
        "moe_layer_flops(0, 16, 16, 4, 2, 3)",  # no tokens, no FLOPs
        "moe_layer_flops(7, 5, 3, 6, 6)",  # every expert for every token
        raises("moe_layer_flops(32, 64, 128, 8, 9)", "ValueError"),
        raises("moe_layer_flops(32, 64, 128, 8, 0)", "ValueError"),
        raises("moe_layer_flops(-1, 64, 128, 8, 2)", "ValueError"),
        raises("moe_layer_flops(32, 0, 128, 8, 2)", "ValueError"),
        raises("moe_layer_flops(32, 64, 128, 8, 2, -1)", "ValueError"),
        raises("moe_layer_flops(32.0, 64, 128, 8, 2)", "ValueError"),
        raises("moe_layer_flops(32, 64, 128, 8, False)", "ValueError"),
    ],
    "expert_parallel_bytes": [
        Case("expert_parallel_bytes(4096, 7168, 8, 8)", rel_tol=_REL),
        Case("expert_parallel_bytes(4096, 7168, 8, 64)", rel_tol=_REL),
        Case("expert_parallel_bytes(4096, 7168, 8, 8, bytes_per_element=1)", rel_tol=_REL),
        Case("expert_parallel_bytes(8192, 4096, 2, 8)", rel_tol=_REL),  # Mixtral's routing
        Case("expert_parallel_bytes(1000, 2048, 8, 3, 2.5)", rel_tol=_REL),
        Case("expert_parallel_bytes(7, 9, 1, 7, bytes_per_element=4)", rel_tol=_REL),
        "expert_parallel_bytes(4096, 7168, 8, 1)",  # one rank holds every expert: 0.0
        "expert_parallel_bytes(0, 7168, 8, 8)",
        raises("expert_parallel_bytes(4096, 7168, 8, 0)", "ValueError"),
        raises("expert_parallel_bytes(-1, 7168, 8, 8)", "ValueError"),
        raises("expert_parallel_bytes(4096, 7168, 0, 8)", "ValueError"),
        raises("expert_parallel_bytes(4096, 0, 8, 8)", "ValueError"),
        raises("expert_parallel_bytes(4096, 7168, 8, 8, bytes_per_element=-2)", "ValueError"),
        raises("expert_parallel_bytes(4096, 7168, 8, 8, math.nan)", "ValueError"),
        raises("expert_parallel_bytes(4096, 7168, 8, 2.0)", "ValueError"),
        raises("expert_parallel_bytes(4096, 7168, 8, 8, '2')", "ValueError"),
    ],
    # every capacity is exact in floats too: factors that are powers of two, or products
    # cf · total / n that are no whole number (tests/test_experts.py checks both)
    "dropped_tokens": [
        "dropped_tokens([3, 1, 0, 4], 1.0)",
        "dropped_tokens([3, 1, 0, 4], 1.5)",
        "dropped_tokens([3, 1, 0, 4], 2.0)",
        "dropped_tokens([9, 9, 9, 9, 9, 9, 9, 9], 1.0)",  # even: nothing dropped
        "dropped_tokens([100, 0, 0, 0], 1.0)",  # one expert takes everything
        "dropped_tokens([100, 0, 0, 0], 0.5)",
        "dropped_tokens([0, 0, 0], 1.25)",  # no assignments at all
        "dropped_tokens((5, 7, 2), 1.25)",  # 1.25 · 14 / 3 = 5.83: C = 6
        "dropped_tokens([700, 500, 412, 436], 1.1)",  # 1.1 · 512 = 563.2: C = 564
        "dropped_tokens([1], 0.25)",
        raises("dropped_tokens([], 1.0)", "ValueError"),
        raises("dropped_tokens([3, -1, 4], 1.0)", "ValueError"),
        raises("dropped_tokens([3, 1.0, 4], 1.0)", "ValueError"),
        raises("dropped_tokens([3, True, 4], 1.0)", "ValueError"),
        raises("dropped_tokens([3, 1, 4], 0)", "ValueError"),
        raises("dropped_tokens([3, 1, 4], -1.25)", "ValueError"),
        raises("dropped_tokens([3, 1, 4], math.inf)", "ValueError"),
        raises("dropped_tokens('314', 1.0)", "ValueError"),
        raises("dropped_tokens(None, 1.0)", "ValueError"),
    ],
    "expected_experts_touched": [
        "expected_experts_touched(4, 8, 2)",  # Mixtral, 4 tokens: 5.46875, exact in floats
        Case("expected_experts_touched(1, 256, 8)", rel_tol=_REL),  # one token: its top_k
        Case("expected_experts_touched(64, 8, 2)", rel_tol=_REL),
        Case("expected_experts_touched(100, 256, 8)", rel_tol=_REL),
        Case("expected_experts_touched(1000, 128, 8)", rel_tol=_REL),
        Case("expected_experts_touched(3, 256, 1)", rel_tol=_REL),
        "expected_experts_touched(0, 64, 8)",  # no tokens: 0.0
        "expected_experts_touched(5, 6, 6)",  # every expert for every token: 6.0
        raises("expected_experts_touched(4, 8, 9)", "ValueError"),
        raises("expected_experts_touched(4, 8, 0)", "ValueError"),
        raises("expected_experts_touched(-1, 8, 2)", "ValueError"),
        raises("expected_experts_touched(4, 0, 1)", "ValueError"),
        raises("expected_experts_touched(4, 8.0, 2)", "ValueError"),
        raises("expected_experts_touched(4.5, 8, 2)", "ValueError"),
    ],
    "moe_decode_bytes": [
        Case(f"moe_decode_bytes(1, {_MIXTRAL_SPLIT})", rel_tol=_REL),  # its active bytes
        Case(f"moe_decode_bytes(4, {_MIXTRAL_SPLIT})", rel_tol=_REL),
        Case(f"moe_decode_bytes(64, {_MIXTRAL_SPLIT})", rel_tol=_REL),  # all experts, almost
        Case(f"moe_decode_bytes(1, {_DEEPSEEK_SPLIT}, bytes_per_param=1)", rel_tol=_REL),
        Case(f"moe_decode_bytes(128, {_DEEPSEEK_SPLIT}, bytes_per_param=1)", rel_tol=_REL),
        Case("moe_decode_bytes(3, 0, 10, 2, 16, 2, 0.5)", rel_tol=_REL),
        "moe_decode_bytes(1, 10, 3, 2, 4, 4, bytes_per_param=1)",  # top_k = E: everything
        raises(f"moe_decode_bytes(0, {_MIXTRAL_SPLIT})", "ValueError"),
        raises("moe_decode_bytes(1, -1, 176160768, 32, 8, 2)", "ValueError"),
        raises("moe_decode_bytes(1, 1474297856, 0, 32, 8, 2)", "ValueError"),
        raises("moe_decode_bytes(1, 1474297856, 176160768, 0, 8, 2)", "ValueError"),
        raises("moe_decode_bytes(1, 1474297856, 176160768, 32, 8, 9)", "ValueError"),
        raises(f"moe_decode_bytes(1, {_MIXTRAL_SPLIT}, bytes_per_param=0)", "ValueError"),
        raises(f"moe_decode_bytes(1, {_MIXTRAL_SPLIT}, math.inf)", "ValueError"),
        raises("moe_decode_bytes(1, 1.5e9, 176160768, 32, 8, 2)", "ValueError"),
        raises(f"moe_decode_bytes(True, {_MIXTRAL_SPLIT})", "ValueError"),
        raises("moe_decode_bytes(1, 1474297856, 176160768, 32, 0, 1)", "ValueError"),
    ],
    # the graded prediction, within 5%: the answer E·(1 - (1 - k/E)^T); "all of them" (E, also
    # min(T·k, E)) is 13% to 52% high in every variant, as far from the band as the others;
    # the approximations e^(-Tk/E) and independent picks with repeats land 0.5% to 3.7% low
    # and pass (VARIANTS below, tests/test_experts.py)
    "predicted_experts_touched": [Case("float(predicted_experts_touched)", rel_tol=0.05)],
}

# Each student's decode step for the graded prediction: tokens in the batch, experts in the
# layer, experts per token. In every one the batch's picks (T·k) are at least the experts, so
# "all of them" is the tempting answer, and it misses; tests/test_experts.py simulates each
# variant's router and holds the band's reasoning to it. Each asks its own share of the layer
# (T·k/E from 1 to 2, no two alike: 66% to 88% of the experts; three once shared T·k/E = 2, and
# so one answer, 87% of E: review 5): the default is OLMoE's routing; the others OLMoE's at half
# the batch, Phi-3.5-MoE's (16 experts, 2), Qwen3's at two batches, and DeepSeek-V3's.
VARIANTS = {
    "predicted_experts_touched": Variants(
        ("batch_tokens", "layer_experts", "layer_top_k"),
        ((16, 64, 8), (30, 128, 8), (56, 256, 8), (8, 64, 8), (10, 16, 2), (18, 128, 8)),
        "a decode step of {batch_tokens} tokens through one layer of {layer_experts} "
        "experts, {layer_top_k} per token"),
}


# Hidden inputs of each student's own (grader/content/variants.py): these exercises give
# integers, exact for any input, so shapes drawn anywhere in what the exercise accepts
# (tests/test_experts.py holds them to STATED) need no tolerance, and no answers copied from
# another student's checks, or written out for the fixed ones, pass them.
def _drawn_moe_params(rng: random.Random) -> list[str]:
    """Three models of today's sizes: one grouped-query, one with shared experts and its own
    head width, one with tied embeddings."""
    calls = []
    for extra in ("", ", n_shared_experts={s}, head_dim={hd}", ", tied_embeddings=True"):
        heads = rng.choice((8, 16, 32, 64, 128))
        experts = rng.choice((8, 16, 32, 60, 64, 128, 256))
        calls.append(
            f"moe_params({rng.randint(1, 96)}, {heads * rng.choice((64, 128))}, {heads}, "
            f"{rng.choice([h for h in (1, 2, 4, 8, 16) if heads % h == 0])}, "
            f"{128 * rng.randint(1, 160)}, {experts}, {rng.randint(1, min(experts, 16))}, "
            f"{rng.randint(1000, 262144)}"
            + extra.format(s=rng.randint(0, 2), hd=rng.choice((64, 96, 128, 192))) + ")")
    return calls


def _drawn_moe_layer_flops(rng: random.Random) -> list[str]:
    """Three blocks: without shared experts, with one or two, and a tiny one."""
    def block(experts: int) -> str:
        return (f"{rng.randint(0, 65536)}, {256 * rng.randint(1, 32)}, {128 * rng.randint(1, 128)}"
                f", {experts}, {rng.randint(1, min(experts, 16))}")

    return [f"moe_layer_flops({block(rng.choice((8, 16, 64, 128, 256)))})",
            f"moe_layer_flops({block(rng.choice((32, 64, 256)))}, {rng.randint(1, 2)})",
            f"moe_layer_flops({rng.randint(0, 50)}, {rng.randint(1, 9)}, {rng.randint(1, 9)}, "
            f"5, {rng.randint(1, 5)}, {rng.randint(0, 3)})"]


def _drawn_dropped_tokens(rng: random.Random) -> list[str]:
    """Three loads of a router over 8 to 64 experts: even-ish, skewed, and one expert that
    takes most of them; capacity factors whose capacity floats compute exactly (a power of two,
    or a product that is no whole number)."""
    calls = []
    for skew in (0.1, 1.0, 3.0):
        n = rng.choice((8, 16, 32, 64))
        counts = [max(0, round(rng.lognormvariate(5, skew))) for _ in range(n)]
        factor = rng.choice((0.5, 1.0, 1.25, 1.5, 2.0))
        if factor not in (0.5, 1.0, 2.0) and (Fraction(factor) * sum(counts) / n).denominator == 1:
            counts[0] += 1  # 1.25 · 16 / 4 = 5 could round either way in another order
        calls.append(f"dropped_tokens({counts}, {factor})")
    return calls


DRAWN = {"moe_params": _drawn_moe_params, "moe_layer_flops": _drawn_moe_layer_flops,
         "dropped_tokens": _drawn_dropped_tokens}
