"""Lesson 07: many devices, sharding and the bytes on the wire.

Training on n devices splits the batch (data parallel), the optimizer state, gradients and
weights (ZeRO, FSDP), each matrix (tensor parallel) or the stack of layers (pipeline parallel),
and the devices pay in bytes sent through *collectives*: all-reduce (every rank ends with the
sum of all ranks' tensors), reduce-scatter (with the sum of one n-th of them), all-gather (with
every rank's n-th) and all-to-all (every rank sends a distinct n-th to each other rank).

Conventions: ``B`` is the size in bytes of the whole, unsharded tensor and ``n`` the number of
ranks. The counts are the ring's, the bandwidth-optimal algorithm among those in which the ranks
add the numbers up themselves: a rank can send no less than the (n - 1) n-ths it must receive.
An all-to-all goes directly between every pair of ranks (through a switch such as NVSwitch).
NCCL picks its algorithm per call (ring, tree, and on H100 nodes NVLink SHARP, in which the
switch adds the numbers and each GPU sends less); NCCL-tests print the ring's count per second
as "bus bandwidth". Every function here is pure and runs in one process.
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

    Each chunk is summed once, around the ring, then copied: every rank ends with the same bits,
    which for floats can differ in the last bits from ``sum(shards)`` (another order).

    Args:
        shards: n >= 1 one-dimensional tensors of one dtype (float or integer), one device and
            one length, a multiple of n; a length of 0 gives n empty chunks and sends no byte.
            They are not modified.

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
    # chunks[r][c]: rank r's copy of chunk c, a view into rank r's own buffer (tensor_split
    # gives n views even of an empty tensor, where split would give one)
    buffers = [t.detach().clone() for t in shards]
    chunks = [list(buffer.tensor_split(n)) for buffer in buffers]
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
    K = 12 (fp32 master weights, m and v), 16 bytes per parameter in all (18 with fp32
    gradients, g = 4). FSDP's ``FULL_SHARD`` is stage 3; its ``SHARD_GRAD_OP`` is stage 2 while
    it computes but shards the weights between steps, where ZeRO-2 keeps them whole.
    ``ZeroRedundancyOptimizer`` is stage 1 with whole parameters per rank: shards only roughly
    equal.

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
    """Bytes one rank sends in one training step of one micro-batch under ZeRO (Rajbhandari et
    al. 2020, sec. 7). ``accumulation_comm_bytes`` counts a step of several micro-batches.

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


def accumulation_comm_bytes(n_params: int, world_size: int, stage: int, microbatches: int,
                            keep_unsharded: bool = False, bytes_per_param: int = 2,
                            bytes_per_grad: int = 2) -> int:
    """Bytes one rank sends in one optimizer step of ``microbatches`` micro-batches (gradient
    accumulation) under ZeRO ``stage``.

    With S = ceil(N / n) (the flat buffer padded to n S values), a reduce-scatter of the
    gradients sends (n-1) S g bytes and an all-gather of the weights (n-1) S p; one micro-batch
    sends ``zero_comm_bytes``'s count. Per step:

        stage   resharding every micro-batch (default)     keep_unsharded=True
        0       one all-reduce of the gradients, 2 (n-1) S g (DDP's no_sync until the last)
        1       one reduce-scatter + one all-gather         the same
        2       m reduce-scatters + one all-gather          one + one, as stage 1
        3       m reduce-scatters + 2 m all-gathers         one + one, as stage 1

    Stages 0 and 1 keep whole gradients, so they reduce once, after the last micro-batch;
    stage 2 keeps only its shard of them, so each backward pass must reduce-scatter at once;
    stage 3 also all-gathers its sharded weights for every forward and every backward pass.
    ``keep_unsharded`` holds whole gradients (and the gathered weights) across micro-batches:
    stage 1's traffic and stage 1's memory (FSDP's ``set_requires_gradient_sync(False)``, with
    ``reshard_after_forward=False`` and ``set_reshard_after_backward(False)`` for stage 3).

    Args:
        n_params: N (>= 0).
        world_size: n (>= 1); one rank sends nothing.
        stage: 0, 1, 2 or 3.
        microbatches: m, micro-batches per optimizer step (>= 1).
        keep_unsharded: True or False (it changes nothing for stages 0 and 1).
        bytes_per_param, bytes_per_grad: p and g, bytes of a weight as all-gathered and of a
            gradient as reduced (>= 0; 2 for bf16, 4 for fp32).

    Returns:
        The bytes, an int.
    """
    n_elements = _integer("n_params", n_params, 0)
    n = _integer("world_size", world_size, 1)
    stage = _integer("stage", stage, 0)
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    m = _integer("microbatches", microbatches, 1)
    if type(keep_unsharded) is not bool:
        raise TypeError(f"keep_unsharded must be True or False, got {keep_unsharded!r}")
    p = _integer("bytes_per_param", bytes_per_param, 0)
    g = _integer("bytes_per_grad", bytes_per_grad, 0)
    padded = _sharded(n_elements, n) * n  # values in the flat buffer
    reduce_scatter = collective_bytes("reduce_scatter", padded * g, n)
    all_gather = collective_bytes("all_gather", padded * p, n)
    if stage == 0:  # an all-reduce of the gradients: a reduce-scatter and an all-gather of them
        return 2 * reduce_scatter
    if stage == 1 or keep_unsharded:
        return reduce_scatter + all_gather
    return m * reduce_scatter + (all_gather if stage == 2 else 2 * m * all_gather)


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
    """The fewest tokens in the backward pass that the gradients' all-reduce overlaps for that
    pass to last as long as the all-reduce, which can then hide behind it: a rank's tokens per
    step, or with gradient accumulation one micro-batch's (the all-reduce after the last one
    overlaps that micro-batch's backward pass only).

    The backward pass does 4 N FLOPs per token (lesson 04), 4 N T / peak seconds for T tokens
    at the peak; the all-reduce of N gradients of g bytes takes 2 (n-1)/n N g / beta seconds
    (latency left out). N cancels:

        T = 2 (n-1)/n g peak / (4 beta) = (n-1) g peak / (2 n beta)

    At an MFU below 1 the backward pass is slower, and fewer tokens suffice; a bucket's
    all-reduce can only start once its gradients exist, so real overlap needs some margin.
    Gradients reduced in fp32 (autocast, Megatron's ``grad_reduce_in_fp32``) have g = 4.

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

    With p stages and m micro-batches, GPipe or 1F1B flushed every step (PipeDream-Flush; 1F1B
    is PipeDream's) takes m + p - 1 slots of one micro-batch's forward and backward on a stage;
    each stage works in m of them and waits in p - 1 while the pipeline fills and drains
    (Narayanan et al. 2021, sec. 2.2: (p-1)/m of the ideal time, (p-1)/(m+p-1) of the whole).

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

    Megatron also needs the heads, the key/value heads and d_ff to divide by t (Llama 3 70B's
    8 key/value heads allow t = 8 at most); only d_model is known, and checked, here.

    Args:
        batch_size, seq_len: b and s (>= 1).
        d_model: d (>= 1), a multiple of t (Megatron splits columns evenly).
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

# Section 3 (graded): the bytes one of n_ranks ranks sends to all-reduce a float32 tensor of
# n_elements numbers. Each student answers for numbers of their own (grader/content/cases/
# parallel.py); these are the default's, which the notebook's text describes: 4 ranks, 12 MiB.
n_ranks, n_elements = 4, 3 * 2**20
predicted_ring_bytes_per_rank = collective_bytes("all_reduce", 4 * n_elements, n_ranks)
# Section 6: ZeroRedundancyOptimizer puts the 8192-element first weight of the MLP 64 -> 128 ->
# 16 -> 4, 78% of its 10,452 parameters, on one rank: more than three quarters.
choice_zero_largest_rank = "c"
# Section 7: FSDP with 4 micro-batches, resharding against keeping: 4 x (2 all-gathers + 1
# reduce-scatter) against 1 + 1, whatever N and n.
predicted_reshard_traffic_ratio = (accumulation_comm_bytes(1024, 2, 3, 4, False, 4, 4)
                                   / accumulation_comm_bytes(1024, 2, 3, 4, True, 4, 4))
