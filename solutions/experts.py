"""Lesson 09: mixtures of experts, counted: sparse compute, dense memory.

A mixture-of-experts (MoE) block replaces a transformer's one MLP by ``n_experts`` MLPs (the
*experts*) and a *router*, a (d_model, n_experts) matrix whose scores pick, for each token, the
``top_k`` experts that process it. Each token pays for top_k experts (the *active* parameters);
the model must store all of them (the *total*). Conventions as in lessons 04 and 08: weight
matrices only (no norms, no biases); a gated expert (SwiGLU) is three (d_model, d_ff) matrices;
head_dim defaults to d_model / n_heads; the key and value projections have n_kv_heads heads.

Under expert parallelism each of ``ep_size`` ranks holds n_experts / ep_size experts, and every
token travels to the ranks of its experts and back (an all-to-all, dispatch and combine). An
expert takes at most its *capacity* of tokens; the rest are dropped (they skip the block,
carried on by the residual stream). A decode step reads the weights of every expert that any
token of its batch chose.

Every function raises ValueError on bad input, saying which argument and why.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction


def _count(name: str, value: object, minimum: int) -> int:
    """``value`` as an int at least ``minimum``; ValueError naming ``name`` when it is not an
    integer (a bool is not a count, though Python lets it pass for one) or is below
    ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _top_k(top_k: object, n_experts: int) -> int:
    """``top_k`` as an int from 1 to ``n_experts`` (a token picks distinct experts)."""
    k = _count("top_k", top_k, 1)
    if k > n_experts:
        raise ValueError(f"top_k must be between 1 and n_experts={n_experts}: a token picks "
                         f"top_k distinct experts, got {top_k!r}")
    return k


def _positive(name: str, value: object) -> float | int:
    """``value`` as a finite number > 0 (an int stays an int, so that byte counts stay exact);
    ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def moe_params(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff_expert: int,
               n_experts: int, top_k: int, vocab_size: int, n_shared_experts: int = 0,
               head_dim: int | None = None,
               tied_embeddings: bool = False) -> tuple[int, int]:
    """Parameters of an MoE transformer: all of them, and those one token uses.

    Per layer: attention, whose q and o projections are d·h·hd each and k and v d·kv·hd each;
    the router, d·E; E routed experts and n_shared_experts shared ones, each a gated MLP of
    3·d·d_ff. Plus the embedding and the unembedding, V·d each (one matrix when tied). A token
    uses the attention, the router, its top_k routed experts, every shared expert and the
    embeddings: the "active" parameters that published figures give.

    Args:
        n_layers: L, blocks (>= 1), every one an MoE block.
        d_model: d, width of the residual stream (>= 1).
        n_heads: query heads h (>= 1); n_kv_heads: key and value heads kv (>= 1).
        d_ff_expert: width of each expert's MLP (>= 1).
        n_experts: E, routed experts per layer (>= 1); top_k: experts per token (1 to E).
        vocab_size: V (>= 1).
        n_shared_experts: experts every token goes through, as wide as the routed ones (>= 0).
        head_dim: hd, numbers per head (>= 1); None means d_model / n_heads, which must then
            be a whole number.
        tied_embeddings: whether the unembedding is the embedding matrix (True or False).

    Returns:
        (total, active), ints.
    """
    layers = _count("n_layers", n_layers, 1)
    d = _count("d_model", d_model, 1)
    heads = _count("n_heads", n_heads, 1)
    kv_heads = _count("n_kv_heads", n_kv_heads, 1)
    d_ff = _count("d_ff_expert", d_ff_expert, 1)
    experts = _count("n_experts", n_experts, 1)
    k = _top_k(top_k, experts)
    vocab = _count("vocab_size", vocab_size, 1)
    shared = _count("n_shared_experts", n_shared_experts, 0)
    if head_dim is None:
        if d % heads:
            raise ValueError(f"d_model={d} does not split into n_heads={heads} heads: give "
                             "head_dim")
        head_dim = d // heads
    hd = _count("head_dim", head_dim, 1)
    if type(tied_embeddings) is not bool:
        raise ValueError(f"tied_embeddings must be True or False, got {tied_embeddings!r}")
    attention = 2 * d * heads * hd + 2 * d * kv_heads * hd  # q and o; k and v
    router = d * experts
    expert = 3 * d * d_ff  # gate, up and down
    embeddings = (1 if tied_embeddings else 2) * vocab * d
    total = layers * (attention + router + (experts + shared) * expert) + embeddings
    active = layers * (attention + router + (k + shared) * expert) + embeddings
    return total, active


def moe_layer_flops(n_tokens: int, d_model: int, d_ff_expert: int, n_experts: int, top_k: int,
                    n_shared_experts: int = 0) -> int:
    """Forward matmul FLOPs of one MoE block's MLP part over ``n_tokens`` tokens.

    The router multiplies every token by a (d, E) matrix: 2·T·d·E. Each (token, expert) pair,
    T·top_k of them, runs one gated expert: three matmuls with (d, d_ff) matrices, 2·3·d·d_ff;
    shared experts run on every token. However the router spreads the tokens, the pairs are
    the same in number, so the count does not depend on the routing.

    Args:
        n_tokens: T (>= 0).
        d_model, d_ff_expert, n_experts: d, the experts' width, E (>= 1 each).
        top_k: experts per token (1 to E).
        n_shared_experts: experts every token goes through (>= 0).

    Returns:
        2·T·d·E + 6·T·(top_k + n_shared_experts)·d·d_ff, an int.
    """
    tokens = _count("n_tokens", n_tokens, 0)
    d = _count("d_model", d_model, 1)
    d_ff = _count("d_ff_expert", d_ff_expert, 1)
    experts = _count("n_experts", n_experts, 1)
    k = _top_k(top_k, experts)
    shared = _count("n_shared_experts", n_shared_experts, 0)
    router = 2 * tokens * d * experts
    return router + 2 * 3 * d * d_ff * tokens * (k + shared)


def expert_parallel_bytes(n_tokens: int, d_model: int, top_k: int, ep_size: int,
                          bytes_per_element: float = 2) -> float:
    """Expected bytes one rank sends in one MoE block's forward under expert parallelism.

    The rank holds ``n_tokens`` tokens; each goes to top_k experts, spread evenly over the
    ``ep_size`` ranks and chosen uniformly, and each (token, expert) pair is sent on its own. In
    the dispatch the rank sends, for each of its pairs whose expert is on another rank, a vector
    of d numbers there; an expert on its own GPU costs no transfer, which is the case for
    1 / ep_size of the pairs on average. In the combine it sends back the results of the pairs
    that other ranks dispatched to its experts: with every rank holding as many tokens and
    routing alike, as many pairs on average as it dispatched, so the combine sends what the
    dispatch sent.

    Args:
        n_tokens: T, tokens on the rank (>= 0).
        d_model: d (>= 1); top_k: experts per token (>= 1).
        ep_size: ranks the experts are spread over (>= 1).
        bytes_per_element: bytes of one number sent (> 0; 2 for bf16).

    Returns:
        2·T·top_k·d·bytes_per_element·(ep_size - 1) / ep_size, a float.
    """
    tokens = _count("n_tokens", n_tokens, 0)
    d = _count("d_model", d_model, 1)
    k = _count("top_k", top_k, 1)
    ep = _count("ep_size", ep_size, 1)
    element = _positive("bytes_per_element", bytes_per_element)
    # Exact, then rounded once: every way of writing the product gives the same float.
    return float(2 * tokens * k * d * Fraction(element) * (ep - 1) / ep)


def expected_experts_touched(n_tokens: int, n_experts: int, top_k: int) -> float:
    """Expected number of distinct experts a batch of tokens uses in one layer.

    Each token picks top_k distinct experts uniformly at random, independently of the others:
    a given expert is missed by one token with probability 1 - top_k / E, by all T tokens with
    probability (1 - top_k / E)^T, and the expected count of experts used is E times the
    chance that one is used.

    Args:
        n_tokens: T (>= 0).
        n_experts: E (>= 1); top_k: experts per token (1 to E).

    Returns:
        E·(1 - (1 - top_k / E)^T), a float.
    """
    tokens = _count("n_tokens", n_tokens, 0)
    experts = _count("n_experts", n_experts, 1)
    k = _top_k(top_k, experts)
    return experts * (1 - (1 - k / experts) ** tokens)


def moe_decode_bytes(batch_size: int, non_expert_params: int, params_per_expert: int,
                     n_layers: int, n_experts: int, top_k: int,
                     bytes_per_param: float = 2) -> float:
    """Expected weight bytes one decode step of a batch reads.

    Every parameter outside the routed experts (attention, routers, shared experts, the
    unembedding) is read once for the whole batch; in each layer, so is every routed expert
    that at least one token of the batch chose: ``expected_experts_touched(B, E, top_k)`` of
    them, uniform routing assumed.

    Args:
        batch_size: B, tokens in the step, one per sequence (>= 1).
        non_expert_params: parameters read whatever the routing (>= 0).
        params_per_expert: parameters of one routed expert (>= 1).
        n_layers: MoE layers (>= 1).
        n_experts: routed experts per layer (>= 1); top_k: experts per token (1 to E).
        bytes_per_param: bytes of one weight (> 0; 2 for bf16).

    Returns:
        (non_expert_params + n_layers·touched·params_per_expert)·bytes_per_param, a float.
    """
    batch = _count("batch_size", batch_size, 1)
    fixed = _count("non_expert_params", non_expert_params, 0)
    per_expert = _count("params_per_expert", params_per_expert, 1)
    layers = _count("n_layers", n_layers, 1)
    experts = _count("n_experts", n_experts, 1)
    k = _top_k(top_k, experts)
    per_param = _positive("bytes_per_param", bytes_per_param)
    touched = expected_experts_touched(batch, experts, k)
    return (fixed + layers * touched * per_expert) * per_param


def dropped_tokens(expert_counts: list[int], capacity_factor: float) -> int:
    """(token, expert) assignments refused because an expert is over its capacity.

    Each expert takes at most C = ceil(capacity_factor · sum(counts) / len(counts)) of the
    assignments routed to it (Megatron-Core's and DeepSpeed's capacity: the even share,
    times the factor); an expert routed more than C drops the rest.

    Args:
        expert_counts: assignments routed to each expert, integers >= 0 (at least one expert).
        capacity_factor: a finite number > 0 (1.0: exactly the even share).

    Returns:
        sum over experts of max(0, count - C), an int.
    """
    if not isinstance(expert_counts, (list, tuple)) or not expert_counts:
        raise ValueError("expert_counts must be a non-empty list of counts, one per expert, "
                         f"got {expert_counts!r:.80}")
    counts = [_count("every expert count", c, 0) for c in expert_counts]
    factor = _positive("capacity_factor", capacity_factor)
    # The factor exactly as given (a float's own binary value, read exactly by Fraction), times
    # the even share, rounded up once: the same capacity whatever the order of the product. A
    # decimal factor is not exact in binary: 1.1 is stored as 1.100000000000000088..., so 100
    # assignments over 10 experts at 1.1 have a capacity of 12, not 11.
    capacity = math.ceil(Fraction(factor) * sum(counts) / len(counts))
    return sum(max(0, c - capacity) for c in counts)


# ------------------------------------------------------------------ predictions
# The answer to the lesson's graded "predict first" question, which grading compares with each
# student's number (for their own numbers); tests/test_experts.py checks it against its oracle.

# Graded: a decode step of batch_tokens tokens (one per sequence) through one MoE layer of
# layer_experts experts, each token routed to layer_top_k of them uniformly at random: how many
# distinct experts does the step read, on average? Each student answers for numbers of their
# own (grader/content/cases/experts.py); these are the default's, which the notebook's text
# describes and measures: 16 tokens, 64 experts, 8 per token (OLMoE's routing). Written out, not
# as expected_experts_touched(...): the notebook asks before the exercise that defines it.
batch_tokens, layer_experts, layer_top_k = 16, 64, 8
predicted_experts_touched = layer_experts * (1 - (1 - layer_top_k / layer_experts) ** batch_tokens)

# Not graded (the notebook holds it sealed): the MFU of DeepSeek-V3's pre-training, 6·N·D with
# the 37B active parameters it states, over its 2.664M H800 GPU-hours for 14.8T tokens at the
# H800's dense bf16 peak of 989.4 TFLOP/s (data/models.json, data/hardware.json).
predicted_deepseek_v3_mfu = 6 * 37e9 * 14.8e12 / (2.664e6 * 3600 * 989.4e12)
