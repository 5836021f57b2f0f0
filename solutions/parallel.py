"""Lesson 07: many devices, sharding and the bytes on the wire.

Training on n devices splits something n ways: the batch (data parallel), the optimizer state,
gradients and weights (ZeRO, FSDP), each matrix (tensor parallel) or the stack of layers
(pipeline parallel). Every split saves memory or time on each device and costs bytes that the
devices must send each other, through *collectives*: all-reduce (every rank ends with the sum of
all ranks' tensors), reduce-scatter (every rank ends with the sum of one n-th of them),
all-gather (every rank ends with every rank's n-th) and all-to-all (every rank sends a distinct
n-th to each other rank).

Conventions: ``B`` is the size in bytes of the whole, unsharded tensor and ``n`` the number of
ranks. The counts are of the bandwidth-optimal algorithms NCCL uses for large tensors. A ring
all-reduce is a reduce-scatter followed by an all-gather, and in each of them a rank sends
n - 1 chunks of B / n bytes. No rank can send less: in an all-gather every rank must receive the
(n - 1) n-ths it lacks, and in a ring each byte a rank receives is a byte its neighbour sent, so
the ring is as fast as one link allows. An all-to-all is no ring: each rank sends its distinct
B / n to each other rank directly (point to point, through a switch such as NVSwitch), (n - 1)
of them; forwarded around a ring it would cost each rank (n - 1) B / 2. (NCCL-tests print these
counts as "bus bandwidth": algorithm bandwidth B / t times 2(n-1)/n for all-reduce, (n-1)/n for
the others.)

Every function here is pure and runs in one process; lesson 07's measurements start several
processes with a helper script, and compare them with these counts.
"""

from __future__ import annotations

import math
import numbers

from torch import Tensor

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ZERO_STAGES = (0, 1, 2, 3)


def _integer(name: str, value: object, minimum: int) -> int:
    """``value`` as an int at least ``minimum``: TypeError naming ``name`` for a value that is
    not an integer (a bool is not a count, though Python lets it pass for one), ValueError for
    one below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _positive_number(name: str, value: object, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``): TypeError for a value that
    is not a real number, ValueError for one that is out of range or not finite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


def collective_bytes(op: str, tensor_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a collective over a tensor of B bytes, by the bandwidth-optimal
    algorithm: the ring, and for all-to-all a direct exchange between every pair of ranks.

        op                 bytes one rank sends
        "all_reduce"       2 (n-1)/n B   (a ring reduce-scatter, then a ring all-gather)
        "reduce_scatter"   (n-1)/n B     (n-1 steps, one chunk of B/n each)
        "all_gather"       (n-1)/n B     (B is the gathered tensor, n shards of B/n)
        "all_to_all"       (n-1)/n B     (a distinct B/n sent directly to each other rank)

    Args:
        op: one of ``COLLECTIVES``.
        tensor_bytes: B, the bytes of the whole tensor (>= 0), which must split into n equal
            shards (pad it if it does not, as ZeRO and FSDP pad their flat buffers).
        world_size: n, the ranks taking part (>= 1); one rank sends nothing.

    Returns:
        The bytes, an int.
    """
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(COLLECTIVES)}")
    n_bytes = _integer("tensor_bytes", tensor_bytes, 0)
    n = _integer("world_size", world_size, 1)
    if n_bytes % n:
        raise ValueError(f"tensor_bytes={n_bytes} does not split into {n} equal shards; pad it "
                         f"to a multiple of {n} (to {-(-n_bytes // n) * n})")
    shard = n_bytes // n
    return (2 if op == "all_reduce" else 1) * (n - 1) * shard


def ring_all_reduce(shards: list[Tensor]) -> tuple[list[Tensor], int]:
    """All-reduce by the ring algorithm, simulated: n "ranks" in one process, step by step.

    Rank r holds ``shards[r]``, cut into n chunks, and sends only to rank (r + 1) % n. In step
    s = 0 .. n-2 of the reduce-scatter, every rank sends at once its chunk (r - s) % n and the
    receiver adds it to its own copy of that chunk; after n - 1 steps rank r holds chunk
    (r + 1) % n summed over all ranks. In step s of the all-gather, rank r sends its chunk
    (r + 1 - s) % n, complete, and the receiver overwrites its copy. After 2(n - 1) steps every
    rank holds the whole sum.

    Each chunk is summed once, around the ring, and then copied: every rank ends with the same
    bits. Those bits are a sum in the ring's order, which for floats can differ in the last
    bits from ``sum(shards)`` (addition of floats is not associative).

    Args:
        shards: n >= 1 one-dimensional tensors of one dtype and one device, each of the same
            length, a multiple of n (one equal chunk per rank). They are not modified.

    Returns:
        (every rank's result, new tensors; the bytes each rank sent, which is
        ``collective_bytes("all_reduce", shards[0].nbytes, n)``).
    """
    if not isinstance(shards, (list, tuple)):
        raise TypeError(f"shards must be a list of tensors, one per rank, got {type(shards)}")
    if not shards:
        raise ValueError("shards must be a non-empty list of tensors, one per rank")
    if not all(isinstance(t, Tensor) for t in shards):
        kinds = sorted({type(t).__name__ for t in shards if not isinstance(t, Tensor)})
        raise TypeError(f"every shard must be a torch.Tensor, got {', '.join(kinds)}")
    first, n = shards[0], len(shards)
    for rank, t in enumerate(shards):
        if t.dim() != 1:
            raise ValueError(f"rank {rank}'s tensor has shape {tuple(t.shape)}: each must be 1-D")
        if (t.dtype, t.device, t.numel()) != (first.dtype, first.device, first.numel()):
            raise ValueError(f"rank {rank}'s tensor is {t.numel()} x {t.dtype} on {t.device}, "
                             f"rank 0's {first.numel()} x {first.dtype} on {first.device}: all "
                             "ranks must hold the same length, dtype and device")
    if first.numel() % n:
        raise ValueError(f"length {first.numel()} does not split into {n} equal chunks: pad "
                         f"every tensor to a multiple of {n}")
    chunk = first.numel() // n
    # chunks[r][c]: rank r's copy of chunk c (views into rank r's own buffer)
    buffers = [t.detach().clone() for t in shards]
    chunks = [list(buffer.split(chunk)) if chunk else [buffer] * n for buffer in buffers]
    sent = 0
    for step in range(n - 1):  # reduce-scatter
        outgoing = [chunks[r][(r - step) % n].clone() for r in range(n)]  # all send at once
        for r in range(n):
            chunks[(r + 1) % n][(r - step) % n] += outgoing[r]
        sent += outgoing[0].nbytes
    for step in range(n - 1):  # all-gather
        outgoing = [chunks[r][(r + 1 - step) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[(r + 1) % n][(r + 1 - step) % n].copy_(outgoing[r])
        sent += outgoing[0].nbytes
    return buffers, sent


def _sharded(n_params: int, world_size: int) -> int:
    """Elements of one rank's shard: ceil(N / n), the last shard padded."""
    return -(-n_params // world_size)


def zero_bytes_per_device(n_params: int, world_size: int, stage: int, bytes_per_param: int = 2,
                          bytes_per_grad: int = 2, optimizer_bytes_per_param: int = 12) -> int:
    """Bytes of weights, gradients and optimizer state one rank holds under ZeRO (Rajbhandari et
    al. 2020), without activations.

        stage   sharded n ways                        bytes per rank (S = ceil(N / n))
        0       nothing (plain data parallel)         N (p + g + k)
        1       optimizer state                       N (p + g) + S k
        2       optimizer state, gradients            N p + S (g + k)
        3       optimizer state, gradients, weights   S (p + g + k)

    with p, g, k the bytes per parameter of weights, gradients and optimizer state. The
    defaults are the paper's mixed precision with Adam: fp16 weights and gradients (2 + 2) and
    K = 12 (fp32 master weights, m and v), 16 bytes per parameter in all. PyTorch's FSDP is
    stage 3 (``FULL_SHARD``) or 2 (``SHARD_GRAD_OP``); ``ZeroRedundancyOptimizer`` is stage 1,
    but it gives each rank whole parameters, so its shards are only roughly equal.

    Args:
        n_params: N, the model's parameters (>= 0).
        world_size: n, the data-parallel ranks sharing the state (>= 1).
        stage: 0, 1, 2 or 3.
        bytes_per_param, bytes_per_grad, optimizer_bytes_per_param: p, g, k (each >= 0).

    Returns:
        The bytes, an int.
    """
    n_elements = _integer("n_params", n_params, 0)
    n = _integer("world_size", world_size, 1)
    stage = _integer("stage", stage, 0)
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    p = _integer("bytes_per_param", bytes_per_param, 0)
    g = _integer("bytes_per_grad", bytes_per_grad, 0)
    k = _integer("optimizer_bytes_per_param", optimizer_bytes_per_param, 0)
    whole, shard = n_elements, _sharded(n_elements, n)
    held = {0: (p + g + k, 0), 1: (p + g, k), 2: (p, g + k), 3: (0, p + g + k)}[stage]
    return whole * held[0] + shard * held[1]


def zero_comm_bytes(n_params: int, world_size: int, stage: int, bytes_per_param: int = 2) -> int:
    """Bytes one rank sends in one training step under ZeRO (Rajbhandari et al. 2020, sec. 7).

    Stages 0 to 2 send 2 (n-1) S p: an all-reduce of the gradients (stage 0), or its two halves
    apart, a reduce-scatter of the gradients and, after each rank has updated its shard, an
    all-gather of the weights (stages 1 and 2). Stage 3 keeps no whole weights, so it
    all-gathers them for the forward pass and again for the backward pass, and reduce-scatters
    the gradients: 3 (n-1) S p, 1.5 times as much. S = ceil(N / n): the flat buffer is padded
    to n equal shards. Gradients are taken to be ``bytes_per_param`` wide, as the weights.

    Args:
        n_params: N (>= 0).
        world_size: n (>= 1); one rank sends nothing.
        stage: 0, 1, 2 or 3.
        bytes_per_param: bytes of one weight and of one gradient as sent (>= 0; 2 for bf16).

    Returns:
        The bytes, an int.
    """
    n_elements = _integer("n_params", n_params, 0)
    n = _integer("world_size", world_size, 1)
    stage = _integer("stage", stage, 0)
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    p = _integer("bytes_per_param", bytes_per_param, 0)
    padded = _sharded(n_elements, n) * n * p  # the whole buffer, padded
    gathers = 2 if stage == 3 else 1  # all-gathers of the weights per step
    return (collective_bytes("reduce_scatter", padded, n)
            + gathers * collective_bytes("all_gather", padded, n))


def allreduce_seconds(tensor_bytes: float, world_size: int, bandwidth: float,
                      latency: float = 0.0) -> float:
    """The alpha-beta model of a ring all-reduce: 2 (n-1) alpha + 2 (n-1)/n B / beta.

    Each of the 2 (n-1) steps pays a fixed latency alpha (starting a message, a kernel, a
    synchronisation) and moves B / n bytes at the link's bandwidth beta.

    Args:
        tensor_bytes: B, bytes of the whole tensor (>= 0; need not split evenly: the model is
            a rate, not a schedule).
        world_size: n (>= 1); one rank takes no time.
        bandwidth: beta, bytes per second one rank sends over its link (> 0).
        latency: alpha, seconds per step (>= 0).

    Returns:
        Seconds, a float.
    """
    size = _positive_number("tensor_bytes", tensor_bytes, allow_zero=True)
    n = _integer("world_size", world_size, 1)
    beta = _positive_number("bandwidth", bandwidth)
    alpha = _positive_number("latency", latency, allow_zero=True)
    steps = 2 * (n - 1)
    return steps * alpha + steps * size / n / beta


def min_tokens_to_hide_allreduce(peak_flops: float, bandwidth: float, world_size: int,
                                 bytes_per_grad: int = 2) -> float:
    """The fewest tokens per rank per step for which the backward pass lasts as long as the
    all-reduce of the gradients, so that the all-reduce can hide behind it.

    The backward pass does 4 N FLOPs per token (lesson 04), 4 N T / peak seconds for T tokens
    at the peak; the all-reduce of N gradients of g bytes takes 2 (n-1)/n N g / beta seconds
    (latency left out). N cancels:

        T = 2 (n-1)/n g peak / (4 beta) = (n-1) g peak / (2 n beta)

    At an MFU below 1 the backward pass is slower, and fewer tokens suffice; a bucket's
    all-reduce can only start once its gradients exist, so real overlap needs some margin.

    Args:
        peak_flops: one rank's FLOP/s (> 0).
        bandwidth: bytes per second one rank sends (> 0).
        world_size: n (>= 1); one rank has nothing to hide (0.0).
        bytes_per_grad: g, bytes per gradient as sent (>= 1; 2 for bf16).

    Returns:
        Tokens, a float.
    """
    peak = _positive_number("peak_flops", peak_flops)
    beta = _positive_number("bandwidth", bandwidth)
    n = _integer("world_size", world_size, 1)
    g = _integer("bytes_per_grad", bytes_per_grad, 1)
    return (n - 1) * g * peak / (2 * n * beta)


def pipeline_bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """The share of a pipeline step that each stage is idle: (p-1) / (m+p-1).

    With p stages and m micro-batches, a GPipe or 1F1B schedule takes m + p - 1 slots of one
    micro-batch's forward and backward on a stage; each stage works in m of them and waits in
    the other p - 1, while the pipeline fills and drains (Narayanan et al. 2021, sec. 2.2: the
    bubble is (p-1)/m of the ideal time, which is (p-1)/(m+p-1) of the whole).

    Args:
        n_stages: p (>= 1); one stage has no bubble.
        n_microbatches: m (>= 1).

    Returns:
        A fraction in [0, 1).
    """
    p = _integer("n_stages", n_stages, 1)
    m = _integer("n_microbatches", n_microbatches, 1)
    return (p - 1) / (m + p - 1)


def tensor_parallel_bytes(batch_size: int, seq_len: int, d_model: int, world_size: int,
                          bytes_per_element: int = 2) -> int:
    """Bytes one rank sends per transformer block per training step under Megatron tensor
    parallelism (Shoeybi et al. 2019).

    The attention block and the MLP each split their first matmul by columns and their last by
    rows, so each ends with partial sums of the (b, s, d) output that one all-reduce adds up:
    two all-reduces in the forward pass, and two of the input's gradient in the backward pass
    (the ``f`` and ``g`` operators of the paper's figure 3). Four all-reduces of b s d e bytes:

        4 * 2 (t-1)/t * b s d e

    Sequence parallelism replaces each all-reduce by a reduce-scatter and an all-gather, the
    same bytes. Recomputing activations adds the forward pass's two all-reduces again.

    Args:
        batch_size, seq_len: b and s (>= 1).
        d_model: d (>= 1), a multiple of t (Megatron splits heads and columns evenly).
        world_size: t, the tensor-parallel ranks (>= 1).
        bytes_per_element: e (>= 1; 2 for bf16 activations).

    Returns:
        The bytes, an int.
    """
    b = _integer("batch_size", batch_size, 1)
    s = _integer("seq_len", seq_len, 1)
    d = _integer("d_model", d_model, 1)
    t = _integer("world_size", world_size, 1)
    e = _integer("bytes_per_element", bytes_per_element, 1)
    if d % t:
        raise ValueError(f"d_model={d} does not split over {t} tensor-parallel ranks: Megatron "
                         f"needs a multiple of {t}")
    return 4 * collective_bytes("all_reduce", b * s * d * e, t)


# ------------------------------------------------------------------ the lesson's predictions

# Section 3: the bytes one of 4 ranks sends to all-reduce a float32 tensor of 3 * 2**20
# elements (12 MiB), the sealed answer of the graded prediction.
predicted_ring_bytes_per_rank = collective_bytes("all_reduce", 4 * 3 * 2**20, 4)
# Section 6: under ZeroRedundancyOptimizer on 2 ranks, the MLP 64 -> 128 -> 16 -> 4 puts its
# 8192-element first weight, 78% of the 10,452 parameters, on one rank: more than three quarters.
choice_zero_largest_rank = "c"

