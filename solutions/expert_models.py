"""Lesson 09's published mixtures of experts, counted; given to students (not exercises).

Each function reads an entry of ``models.json``'s ``"moe_models"``. ``simple_params`` is the
lesson's count (``moe_params``): every block an MoE block with ordinary (grouped-query)
attention. DeepSeek-V3 is not that model: its attention is multi-head latent attention (MLA),
whose projections go through low-rank bottlenecks, and its first three blocks have one dense MLP
instead of experts. ``deepseek_v3_params`` counts those too, to show what the simple count
leaves out. The decode and wire helpers put the lesson's counts on lesson 08's roofline and
lesson 07's links.
"""

from __future__ import annotations

import math

from solutions.experts import expert_parallel_bytes, moe_decode_bytes, moe_params


def simple_params(shape: dict) -> tuple[int, int]:
    """(total, active) of a ``moe_models`` entry by ``moe_params``."""
    return moe_params(shape["n_layers"], shape["d_model"], shape["n_heads"],
                      shape["n_kv_heads"], shape["d_ff_expert"], shape["n_experts"],
                      shape["top_k"], shape["vocab_size"], shape["n_shared_experts"],
                      shape["head_dim"], shape["tied_embeddings"])


def mla_attention_params(shape: dict) -> int:
    """One layer's MLA projections: queries through a rank-q_lora_rank bottleneck to n_heads
    heads of qk_nope + qk_rope numbers; keys and values through a rank-kv_lora_rank bottleneck
    (plus one shared RoPE key of qk_rope numbers); the output projection from n_heads values of
    v_head_dim numbers. The two bottlenecks' norms are left out, as every norm is."""
    d, h, m = shape["d_model"], shape["n_heads"], shape["mla"]
    queries = d * m["q_lora_rank"] + m["q_lora_rank"] * h * (m["qk_nope_head_dim"]
                                                               + m["qk_rope_head_dim"])
    keys_values = (d * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
                   + m["kv_lora_rank"] * h * (m["qk_nope_head_dim"] + m["v_head_dim"]))
    output = h * m["v_head_dim"] * d
    return queries + keys_values + output


def deepseek_v3_params(shape: dict) -> tuple[int, int]:
    """(total, active) of DeepSeek-V3 with MLA in every layer and dense MLPs (three (d, d_ff_dense)
    matrices) in its first n_dense_layers; the other layers as ``moe_params`` counts them."""
    d, vocab = shape["d_model"], shape["vocab_size"]
    moe_layers = shape["n_layers"] - shape["n_dense_layers"]
    expert = 3 * d * shape["d_ff_expert"]
    router = d * shape["n_experts"]
    shared = shape["n_shared_experts"]
    attention = shape["n_layers"] * mla_attention_params(shape)
    dense = shape["n_dense_layers"] * 3 * d * shape["d_ff_dense"]
    embeddings = (1 if shape["tied_embeddings"] else 2) * vocab * d
    fixed = attention + dense + embeddings + moe_layers * (router + shared * expert)
    return (fixed + moe_layers * shape["n_experts"] * expert,
            fixed + moe_layers * shape["top_k"] * expert)


def decode_split(shape: dict) -> dict[str, int]:
    """What a decode step reads and multiplies, by the simple count. ``non_expert``: the
    parameters every step reads whatever the routing (attention, routers, shared experts, the
    unembedding; an untied input embedding is a lookup of one row per token, as in lesson 08,
    and is left out); ``per_expert``: one routed expert's; ``multiplied``: what one token
    multiplies, 2 FLOPs each (the active parameters less that lookup)."""
    total, active = simple_params(shape)
    lookup = 0 if shape["tied_embeddings"] else shape["vocab_size"] * shape["d_model"]
    per_expert = 3 * shape["d_model"] * shape["d_ff_expert"]
    routed = shape["n_layers"] * shape["n_experts"] * per_expert
    return {"non_expert": total - routed - lookup, "per_expert": per_expert,
            "multiplied": active - lookup, "stored": total}


def moe_decode_tokens_per_second(shape: dict, batch_size: int, context_len: int,
                                 kv_bytes_per_token: float, peak_flops: float,
                                 bandwidth: float, bytes_per_param: float = 2) -> float:
    """The roofline's bound on the tokens per second of an MoE's decode steps: a step of B
    tokens does 2·B FLOPs per parameter a token multiplies, reads the weights its batch touches
    (``moe_decode_bytes``) and each sequence's cache, and takes the longer of the two times."""
    split = decode_split(shape)
    weights = moe_decode_bytes(batch_size, split["non_expert"], split["per_expert"],
                               shape["n_layers"], shape["n_experts"], shape["top_k"],
                               bytes_per_param)
    seconds = max(2 * split["multiplied"] * batch_size / peak_flops,
                  (weights + batch_size * context_len * kv_bytes_per_token) / bandwidth)
    return batch_size / seconds


def all_to_all_seconds(n_tokens: int, d_model: int, top_k: int, ep_size: int,
                       gpus_per_node: int, nvlink_bandwidth: float, nic_bandwidth: float,
                       bytes_per_element: float = 2) -> float:
    """Seconds of one MoE block's dispatch and combine for one rank, on lesson 07's wire: the
    pairs bound for another GPU of the same node go over NVLink, those bound for other nodes
    over the GPU's network card, both at once; the slower of the two sets the time. (Ranks are
    filled node by node; each link runs at its one-direction bandwidth.)"""
    local = min(ep_size, gpus_per_node)
    remote_share = (ep_size - local) / ep_size  # pairs whose expert is on another node
    sent = expert_parallel_bytes(n_tokens, d_model, top_k, ep_size, bytes_per_element)
    inside = sent - 2 * n_tokens * top_k * d_model * bytes_per_element * remote_share
    return max(inside / nvlink_bandwidth,
               2 * n_tokens * top_k * d_model * bytes_per_element * remote_share / nic_bandwidth)


def gpus_for_training_state(n_params: int, gpu_bytes: float, bytes_per_param: int = 16) -> int:
    """The fewest GPUs whose memory holds the weights, gradients and Adam state of n_params
    parameters (lesson 05's 16 bytes each with mixed precision), activations left out."""
    return math.ceil(n_params * bytes_per_param / gpu_bytes)
