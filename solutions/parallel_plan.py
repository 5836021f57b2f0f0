"""Lesson 07's plan of a training run split over H100 nodes, counted per GPU.

``parallel_plan`` counts, for one GPU of a run split ``dp`` ways by data (with a ZeRO stage),
``tp`` ways by tensor parallelism and ``pp`` ways by pipeline stages, what it holds in memory,
what it sends per optimizer step and how long a step takes at a chosen MFU. Every number comes
from the lesson's functions (``zero_bytes_per_device``, ``accumulation_comm_bytes``,
``tensor_parallel_bytes``, ``pipeline_bubble_fraction``, ``min_tokens_to_hide_allreduce``),
``block_activation_bytes`` below and lesson 04's ``model_params``.

The run's layout, as Megatron-LM lays it out: GPUs are numbered with the tensor-parallel rank
fastest, then the data-parallel rank, then the pipeline stage; a node holds 8 consecutive GPUs.
A group whose GPUs all sit in one node talks over NVLink; any other group over the NICs, one per
GPU. Assumptions, each stated where it is used: bf16 weights with fp32 master weights and AdamW
moments, and gradients held and reduced in bf16 (2 + 2 + 12 bytes per parameter, the ZeRO
paper's) or in fp32 (2 + 4 + 12); layers split evenly over the stages; activations counted for
the model's own blocks (grouped-query attention, a gated MLP) with FlashAttention, no dropout,
and split over the tensor-parallel ranks (Megatron's sequence parallelism); a 1F1B schedule
flushed every step; ZeRO-1/2's all-gather of the updated weights exposed, or behind the next
step's first forward pass (``overlap_param_gather``). Memory budgets use the label's 80 GB =
80e9 bytes.
"""

from __future__ import annotations

import math

from solutions.backprop import model_params
from solutions.parallel import (
    accumulation_comm_bytes,
    collective_bytes,
    min_tokens_to_hide_allreduce,
    pipeline_bubble_fraction,
    tensor_parallel_bytes,
    zero_bytes_per_device,
)

# Bytes per parameter of each part of the training state, as (weights, gradients, optimizer
# state) for zero_bytes_per_device: bf16 weights, gradients of `bytes_per_grad` bytes, fp32
# master weights + Adam m + v.
OPTIMIZER_BYTES_PER_PARAM = 12


def block_activation_bytes(seq_len: int, batch: int, d_model: int, n_heads: int,
                           n_kv_heads: int, d_ff: int, mlp_matrices: int,
                           bytes_per_element: int = 2, fused_gate: bool = True) -> int:
    """Bytes of activations one pre-norm transformer block keeps for its backward pass, with
    FlashAttention (no s x s scores kept) and without dropout: Korthikanti et al.'s count
    (lesson 05) extended to grouped-query attention and gated MLPs. In units of s b h values:

        attention   normalised input 1, q 1, k and v 2 n_kv / n_heads, attention output 1
        MLP         input 1; two matrices (GELU): up's output f/h and GELU's output f/h;
                    gated (SwiGLU): gate's and up's outputs 2 f/h and their product f/h, and
                    unfused also SiLU's output f/h
        norms       both inputs, 2

    For multi-head attention and a GELU MLP of width 4h this is 16 s b h values, Korthikanti's
    34 s b h bytes less the dropout masks (2 s b h bytes). Per-token statistics (a norm's
    inverse RMS, FlashAttention's log-sum-exp) are left out, as in the paper.

    Args:
        seq_len, batch: s and b (>= 0).
        d_model, n_heads, n_kv_heads: h, query heads and key/value heads (n_kv_heads divides
            n_heads).
        d_ff: f, the MLP's published width (one matrix's columns).
        mlp_matrices: 2 (up, down) or 3 (gate, up, down).
        bytes_per_element: 2 for bf16 activations.
        fused_gate: a gated MLP whose SiLU-and-product runs as one kernel that keeps the gate's
            and up's outputs only (Megatron's fused SwiGLU); False keeps SiLU's output too.

    Returns:
        Bytes, an int.
    """
    s, b, h, f = seq_len, batch, d_model, d_ff
    if min(s, b) < 0 or min(h, n_heads, n_kv_heads, f, bytes_per_element) < 1:
        raise ValueError("seq_len and batch must be >= 0, the widths and heads >= 1")
    if n_heads % n_kv_heads or h % n_heads:
        raise ValueError(f"{n_heads} heads of width {h} / {n_heads} cannot share "
                         f"{n_kv_heads} key/value heads")
    kv_width = h // n_heads * n_kv_heads
    attention = 3 * h + 2 * kv_width
    if mlp_matrices == 2:
        mlp = h + 2 * f
    elif mlp_matrices == 3:
        mlp = h + (3 if fused_gate else 4) * f
    else:
        raise ValueError(f"mlp_matrices must be 2 or 3, got {mlp_matrices}")
    return s * b * (attention + mlp + 2 * h) * bytes_per_element


def _checked_split(shape: dict, tp: int) -> None:
    """ValueError unless Megatron can split ``shape`` over ``tp`` ranks: the heads, the
    key/value heads and the MLP's width must each divide by tp (d_model is checked by
    ``tensor_parallel_bytes``)."""
    for name in ("n_heads", "n_kv_heads", "d_ff"):
        if shape[name] % tp:
            raise ValueError(f"{name}={shape[name]} does not split over {tp} tensor-parallel "
                             "ranks")


def _data_parallel(shard: int, dp: int, stage: int, microbatches: int, keep: bool,
                   bytes_per_grad: int, bandwidth: float, rate: float, tokens: int,
                   backward_flops_per_param: int, overlap_param_gather: bool) -> dict:
    """The data-parallel collectives of one GPU and the compute each one overlaps.

    Each collective can hide only behind the compute that runs while it does: a reduction of a
    micro-batch's gradients behind that micro-batch's backward pass, ZeRO-3's all-gather for a
    forward pass behind that forward pass. A reduction once per step (DDP under ``no_sync``,
    ZeRO-1, or ZeRO-2/3 keeping whole gradients) overlaps the last micro-batch's backward pass
    only. ZeRO-1 and 2 then all-gather the updated weights, which cannot overlap that backward
    pass: the optimizer step waits for the whole reduce-scatter (global-norm clipping needs
    every gradient), and the all-gather waits for the step. Either nothing overlaps it
    (DeepSpeed's ZeRO-1/2, and Megatron-LM's default), or, with ``overlap_param_gather``
    (Megatron-LM's option of that name), the next step's first forward pass does, each layer
    waiting for its own weights. ZeRO-3 keeping whole weights gathers them for the first forward
    pass as it runs, behind that pass, either way.

    Returns:
        ``exposed`` seconds that no compute hides, ``overlapped`` seconds of compute the
        traffic overlaps in all, and ``min_tokens``: the fewest tokens per micro-batch that
        hide it all (N cancels, as in ``min_tokens_to_hide_allreduce``; ``math.inf`` when
        nothing overlaps a collective).
    """
    padded = -(-shard // dp) * dp
    reduce_scatter = collective_bytes("reduce_scatter", padded * bytes_per_grad, dp) / bandwidth
    all_gather = collective_bytes("all_gather", padded * 2, dp) / bandwidth
    forward_flops, backward_flops = 2, backward_flops_per_param
    forward = forward_flops * shard * tokens / rate
    backward = backward_flops * shard * tokens / rate
    # (seconds of traffic, times per step, bytes sent per parameter; seconds of the compute it
    # overlaps, FLOPs of that compute per parameter and token)
    gather_forward = (all_gather, 1, 2, forward, forward_flops)
    if stage == 0:
        windows = [(2 * reduce_scatter, 1, 2 * bytes_per_grad, backward, backward_flops)]
    elif stage == 3 and not keep:
        windows = [(all_gather, microbatches, 2, forward, forward_flops),
                   (all_gather + reduce_scatter, microbatches, bytes_per_grad + 2, backward,
                    backward_flops)]
    else:
        reductions = microbatches if stage == 2 and not keep else 1
        after_step = gather_forward if overlap_param_gather else (all_gather, 1, 2, 0.0, 0)
        windows = [(reduce_scatter, reductions, bytes_per_grad, backward, backward_flops),
                   gather_forward if stage == 3 else after_step]
    exposed = sum(count * max(0.0, sent - compute) for sent, count, _, compute, _ in windows)
    overlapped = sum(count * compute for _, count, _, compute, _ in windows)
    # Traffic of b bytes per parameter meets c FLOPs per parameter and token: it hides from
    # (n-1)/n b rate / (c beta) tokens, min_tokens_to_hide_allreduce's count for g = b, times 2/c.
    least = max((min_tokens_to_hide_allreduce(rate, bandwidth, dp, sent_bytes) * 2 / flops
                 if flops else math.inf
                 for sent, count, sent_bytes, _, flops in windows if count and sent),
                default=0.0)  # one copy sends nothing
    return {"exposed": exposed, "overlapped": overlapped, "min_tokens": least}


def parallel_plan(shape: dict, dp: int, tp: int, pp: int, zero_stage: int, microbatches: int,
                  micro_batch_size: int, seq_len: int, mfu: float, checkpointing: bool,
                  peak_flops: float, gpu_bytes: float, node: dict, *,
                  keep_unsharded: bool = False, bytes_per_grad: int = 2,
                  fused_gate: bool = True, overlap_param_gather: bool = False) -> dict:
    """One GPU's share of an optimizer step of ``microbatches`` micro-batches per data-parallel
    copy, split dp x tp x pp ways.

    Memory: the ``model_params`` of ``shape``, divided over tp x pp (each GPU holds its stage's
    layers, each matrix split tp ways), then held as ZeRO ``zero_stage`` holds it over the dp
    ranks; with ``keep_unsharded`` (and more than one micro-batch) stages 2 and 3 hold what
    stage 1 holds, and stage 3 with one micro-batch what stage 2 holds. Activations: the
    stage's layers (``block_activation_bytes``), divided by tp, for the micro-batches in flight
    at once (1F1B: at most pp of them, so the first stage keeps as many activations as the
    whole model does for one micro-batch); with ``checkpointing`` only each layer's input is
    kept, plus one layer's activations. One layer's gathered weights under ZeRO-3 are left out.

    Traffic per step, per GPU: data parallel ``accumulation_comm_bytes`` of the GPU's
    parameters over dp; tensor parallel ``tensor_parallel_bytes`` per layer and micro-batch (one
    and a half times with checkpointing, which runs the forward's two all-reduces again);
    pipeline: each micro-batch's activation sent on and its gradient sent back at each stage
    boundary, split over tp.

    Time per step: the FLOPs (6 N per token, 8 N with checkpointing; attention's matmuls left
    out, as 6ND does) at ``mfu`` x ``peak_flops``, and tensor parallelism's all-reduces, which
    wait for each layer, both stretched by the pipeline's bubble; plus the data-parallel
    traffic that the compute it overlaps does not hide (``_data_parallel``). ZeRO-1 and 2
    all-gather the updated weights after the optimizer step: with nothing to overlap
    (DeepSpeed's ZeRO-1/2, and Megatron-LM by default), or with ``overlap_param_gather``
    behind the next step's first forward pass (Megatron-LM's option of that name). Pipeline
    sends are small and overlap the next micro-batch's compute: counted in bytes, not in time.

    Returns:
        ``gpus``, ``nodes``, ``n_params``; ``memory`` (bytes per part, ints) and
        ``memory_total``; ``fits`` in ``gpu_bytes``; ``traffic`` and ``seconds`` per kind
        (``"data"``, ``"tensor"``, ``"pipeline"``) with ``links`` (``"NVLink"`` or ``"NIC"``);
        ``bubble``; ``compute_seconds``, ``overlapped_seconds`` (the compute the data-parallel
        traffic overlaps), ``exposed_seconds`` (its part that does not hide),
        ``step_seconds``; ``tokens_per_step``, ``tokens_per_microbatch`` and
        ``min_tokens_to_hide`` (per micro-batch of one copy, at this MFU; ``math.inf`` when
        no number of tokens hides it); ``hidden``; and the settings the readout names.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches),
                        ("micro_batch_size", micro_batch_size), ("seq_len", seq_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if tp > node["gpus_per_node"]:
        raise ValueError(f"tp={tp}: tensor parallelism stays inside one NVLink domain, the "
                         f"{node['gpus_per_node']} GPUs of a node here")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    if bytes_per_grad not in (2, 4):
        raise ValueError(f"bytes_per_grad must be 2 (bf16) or 4 (fp32), got {bytes_per_grad}")
    _checked_split(shape, tp)
    n_params = model_params(shape)
    n_layers, d = shape["n_layers"], shape["d_model"]
    shard = -(-n_params // (tp * pp))  # this GPU's parameters, before ZeRO
    held_as = zero_stage
    if keep_unsharded and zero_stage >= 2:
        held_as = 1 if microbatches > 1 else 2
    widths = {"weights": (2, 0, 0), "gradients": (0, bytes_per_grad, 0),
              "optimizer": (0, 0, OPTIMIZER_BYTES_PER_PARAM)}
    memory = {part: zero_bytes_per_device(shard, dp, held_as, *w) for part, w in widths.items()}
    layers = -(-n_layers // pp)
    in_flight = min(pp, microbatches)
    one_layer = block_activation_bytes(seq_len, micro_batch_size, d, shape["n_heads"],
                                       shape["n_kv_heads"], shape["d_ff"],
                                       shape["mlp_matrices"], 2, fused_gate)
    if checkpointing:
        kept = 2 * seq_len * micro_batch_size * d  # each layer's bf16 input
        activations = (layers * in_flight * kept + one_layer) / tp
    else:
        activations = layers * in_flight * one_layer / tp
    memory["activations"] = math.ceil(activations)

    per_node = node["gpus_per_node"]
    links = {"tensor": "NVLink", "data": "NVLink" if tp * dp <= per_node else "NIC",
             "pipeline": "NVLink" if tp * dp * pp <= per_node else "NIC"}
    bandwidth = {"NVLink": node["nvlink_bytes_per_s"], "NIC": node["nic_bytes_per_s"]}
    activation_bytes = micro_batch_size * seq_len * d * 2
    traffic = {
        "data": accumulation_comm_bytes(shard, dp, zero_stage, microbatches, keep_unsharded,
                                        2, bytes_per_grad),
        "tensor": (tensor_parallel_bytes(micro_batch_size, seq_len, d, tp, 2) * layers
                   * microbatches * (3 if checkpointing else 2) // 2),
        "pipeline": 0 if pp == 1 else 2 * microbatches * activation_bytes // tp,
    }
    seconds = {kind: traffic[kind] / bandwidth[links[kind]] for kind in traffic}

    tokens_per_microbatch = micro_batch_size * seq_len
    tokens_per_replica = microbatches * tokens_per_microbatch
    rate = mfu * peak_flops
    compute = (8 if checkpointing else 6) * n_params * tokens_per_replica / (tp * pp) / rate
    bubble = pipeline_bubble_fraction(pp, microbatches)
    data = _data_parallel(shard, dp, zero_stage, microbatches, keep_unsharded, bytes_per_grad,
                          bandwidth[links["data"]], rate, tokens_per_microbatch,
                          6 if checkpointing else 4, overlap_param_gather)
    step = (compute + seconds["tensor"]) / (1 - bubble) + data["exposed"]
    return {
        "gpus": dp * tp * pp, "nodes": math.ceil(dp * tp * pp / per_node),
        "n_params": n_params, "memory": memory, "memory_total": sum(memory.values()),
        "fits": sum(memory.values()) <= gpu_bytes,
        "traffic": traffic, "seconds": seconds, "links": links, "bubble": bubble,
        "compute_seconds": compute, "overlapped_seconds": data["overlapped"],
        "exposed_seconds": data["exposed"], "step_seconds": step,
        "tokens_per_step": dp * tokens_per_replica, "tokens_per_replica": tokens_per_replica,
        "tokens_per_microbatch": tokens_per_microbatch,
        "min_tokens_to_hide": data["min_tokens"], "hidden": data["exposed"] == 0.0,
        "zero_stage": zero_stage, "microbatches": microbatches,
        "keep_unsharded": keep_unsharded, "bytes_per_grad": bytes_per_grad,
        "overlap_param_gather": overlap_param_gather,
    }
