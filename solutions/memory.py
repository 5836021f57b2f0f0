"""Lesson 05: AdamW and where the memory of a training run goes.

AdamW keeps two running averages per parameter element: m, of the gradient, and v, of its
square. Each step it decays the parameter by a factor (1 - lr * weight_decay) ("decoupled" weight
decay: the decay never enters m or v) and moves it by lr * m_hat / (sqrt(v_hat) + eps), where
m_hat and v_hat are m and v divided by (1 - beta**t) to undo their pull towards the zeros they
start from. Those two averages are the optimizer's state, two numbers for every weight, which
is one reason why training a model takes several times the memory its weights take.

Training memory, counted per parameter, is the weights, their gradients, the optimizer state and
(in mixed precision) a high-precision master copy of the weights; activations come on top and
grow with batch size and sequence length instead. Blockwise 8-bit quantisation of the optimizer
state (as in 8-bit Adam) stores each moment in one byte per element plus one scale per block.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any

import torch
from jaxtyping import Float, Float32, Int8
from torch import Tensor

# The checks of quantize_blockwise call it on the reference too (its hidden cases).
from solutions.casts import nan_casts  # noqa: F401


class AdamW(torch.optim.Optimizer):
    """AdamW written from its update rule; it follows ``torch.optim.AdamW`` step for step.

    For each parameter p with gradient g, step t = 1, 2, ... does:

        p <- p * (1 - lr * weight_decay)            decoupled weight decay, before the update
        m <- beta1 * m + (1 - beta1) * g            (written as a lerp, as torch does)
        v <- beta2 * v + (1 - beta2) * g * g
        p <- p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    State per parameter: ``exp_avg`` (m) and ``exp_avg_sq`` (v), zero-initialised tensors of
    the parameter's shape and dtype, so they take exactly twice the parameter's bytes; and
    ``step`` (t), a Python int. torch keeps ``step`` as a 0-dim float tensor so that CUDA graphs
    and torch.compile can capture it; a Python int makes the same ``beta**t`` (torch reads its
    tensor back with ``.item()`` on this path) and keeps the state's tensors to the two moments
    whose bytes the lesson counts. Real (not complex) dense parameters only; no amsgrad.

    Args:
        params: parameters to optimise, or dicts of parameter groups (as for any torch optimizer).
        lr: learning rate (>= 0).
        betas: decay rates (beta1, beta2) of the two averages, each in [0, 1).
        eps: added to the denominator to avoid dividing by zero (>= 0).
        weight_decay: decoupled weight decay coefficient (>= 0).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        # `not x >= 0` (rather than `x < 0`) also rejects NaN, as torch does.
        if not lr >= 0.0:
            raise ValueError(f"lr (learning rate) must be >= 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must be a pair (beta1, beta2), each in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient, once.

        Args:
            closure: optional function that recomputes the loss (with its gradients) and
                returns it; called before the update, as by torch's optimizers.

        Returns:
            The closure's loss, or None without a closure.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:  # first step of this parameter: allocate its state
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t, grad = state["step"], p.grad
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                # The same order of operations as torch's, so that both round alike.
                step_size = lr / (1 - beta1**t)
                denom = (exp_avg_sq.sqrt() / (1 - beta2**t) ** 0.5).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)
        return loss


def training_memory(n_params: int, recipe: str) -> dict[str, int]:
    """Bytes of model and optimizer state that training with Adam(W) keeps, per component.

    Bytes per parameter (N = n_params; the values of the dict sum to the total):

        recipe        params   grads    master_params  adam_m   adam_v   total
        "fp32"        4 fp32   4 fp32   -              4 fp32   4 fp32   16
        "mixed_bf16"  2 bf16   2 bf16   4 fp32         4 fp32   4 fp32   16
        "adam8bit"    2 bf16   2 bf16   4 fp32         1 int8   1 int8   10, plus scales

    "adam8bit" adds ``quantization_scales``: one fp32 absmax per 256-element block of each
    moment, 2 * 4 * ceil(N / 256) bytes (1/32 byte per parameter), as ``quantize_blockwise``
    makes them. It counts the model as one flat buffer; per-tensor blocks add at most one
    partial block per tensor. (bitsandbytes' Adam8bit now also uses blocks of 256, 2048 in its
    paper, with a non-linear 8-bit code that takes the same bytes, and keeps tensors under 4096
    elements in fp32.) In the mixed recipes the forward and backward passes use the bf16
    weights, autograd makes their gradients in bf16, and the optimizer updates the fp32 master
    copy, from which the bf16 weights are cast again.

    Not counted anywhere: activations, temporary buffers, the CUDA context and allocator slack;
    every parameter is trainable and held whole on one device (ZeRO/FSDP shard these bytes).

    Other counts in circulation, and what they assume:

        12  part of the state only: the optimizer's fp32 master 4 + m 4 + v 4 (the "K = 12" of
            the ZeRO paper, total 2 + 2 + 12 = 16), or weights and gradients without Adam's
            moments, bf16 2 + 2 and fp32 4 + 4 (the Ultra-Scale Playbook)
        18  bf16 weights 2 + fp32 gradients 4 + master 4 + m 4 + v 4 (Megatron Core's "float16
            param, fp32 grads"; Hugging Face's "6 weights + 4 gradients + 8 optimizer")
        20  16-bit weights 2 + 16-bit gradients 2 + fp32 gradients 4 + master 4 + m 4 + v 4
            (Megatron Core's "float16 param, float16 grads"; the Ultra-Scale Playbook's 12 + 8)

    Args:
        n_params: number of trainable parameters (>= 0).
        recipe: ``"fp32"``, ``"mixed_bf16"`` or ``"adam8bit"``.

    Returns:
        Bytes per component as ints, keys in this order: ``params``, ``grads``,
        ``master_params`` (mixed recipes), ``adam_m``, ``adam_v``, ``quantization_scales``
        ("adam8bit").
    """
    n = operator.index(n_params)
    if n < 0:
        raise ValueError(f"n_params must be >= 0, got {n}")
    if recipe == "fp32":
        return {"params": 4 * n, "grads": 4 * n, "adam_m": 4 * n, "adam_v": 4 * n}
    if recipe == "mixed_bf16":
        return {"params": 2 * n, "grads": 2 * n, "master_params": 4 * n,
                "adam_m": 4 * n, "adam_v": 4 * n}
    if recipe == "adam8bit":
        n_blocks = -(-n // 256)  # ceil(n / 256) in exact integer arithmetic
        return {"params": 2 * n, "grads": 2 * n, "master_params": 4 * n,
                "adam_m": n, "adam_v": n, "quantization_scales": 2 * 4 * n_blocks}
    raise ValueError(f"unknown recipe {recipe!r}; the recipes are 'fp32', 'mixed_bf16' and "
                     "'adam8bit'")


def quantize_blockwise(
    x: Float[Tensor, "*shape"], block_size: int = 256
) -> tuple[Int8[Tensor, " n"], Float32[Tensor, " n_blocks"]]:
    """Quantise a tensor to int8 in blocks, each with its own absmax scale.

    The flattened tensor is cut into blocks of ``block_size`` elements (the last one may be
    shorter). In a block with absmax a = max |x|, each element becomes
    q = round(x / a * 127) (ties to even), an integer in [-127, 127]; -128 is never used, so the
    code is symmetric. Dequantised, q * a / 127 is within a / 254 of x. A block of zeros has
    a = 0 and q = 0. Blocks are independent: a large value harms only its own block's precision.

    Args:
        x: a floating-point tensor of any shape, with finite values; computed in float32
            (float64 input is rounded to float32 first, and must stay finite there).
        block_size: elements per block (>= 1).

    Returns:
        (q, scales): q, int8, shape (x.numel(),), not padded, so it takes one byte per element;
        scales, float32, shape (ceil(x.numel() / block_size),), each block's absmax. A tensor
        with no elements gives two empty tensors.
    """
    block_size = operator.index(block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    flat = x.detach().reshape(-1).to(torch.float32)
    if not bool(torch.isfinite(flat).all()):  # after the cast: 1e39 in float64 is inf here
        raise ValueError("x must hold finite values only (no inf or NaN, and none beyond "
                         "float32's range, about 3.4e38)")
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, -n % block_size))  # zeros leave absmax alone
    scales = padded.view(-1, block_size).abs().amax(dim=1)
    # One divisor per element; 1 where a block is all zeros, to avoid 0 / 0 (its q is 0 anyway).
    divisor = torch.where(scales > 0, scales, 1.0).repeat_interleave(block_size)[:n]
    q = torch.round(flat / divisor * 127).to(torch.int8)  # |flat / divisor| <= 1: no overflow
    return q, scales


def dequantize_blockwise(
    q: Int8[Tensor, " n"], scales: Float32[Tensor, " n_blocks"], shape: Sequence[int],
    block_size: int = 256,
) -> Float32[Tensor, "*shape"]:
    """Undo ``quantize_blockwise``: element i becomes q[i] * scales[i // block_size] / 127.

    Args:
        q: int8 codes, shape (n,), as ``quantize_blockwise`` returns them.
        scales: float32 absmax of each block, shape (ceil(n / block_size),).
        shape: the original tensor's shape (its sizes multiply to n).
        block_size: the block size used to quantise (>= 1).

    Returns:
        A float32 tensor of ``shape``.
    """
    block_size = operator.index(block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if q.dtype != torch.int8 or q.dim() != 1:
        raise TypeError(f"q must be a 1-d int8 tensor, got {q.dtype} of shape {tuple(q.shape)}")
    shape = tuple(operator.index(size) for size in shape)
    n = q.numel()
    if math.prod(shape) != n:
        raise ValueError(f"shape {shape} holds {math.prod(shape)} elements but q has {n}")
    if scales.shape != (-(-n // block_size),):
        raise ValueError(f"{n} codes in blocks of {block_size} need {-(-n // block_size)} "
                         f"scales, got shape {tuple(scales.shape)}: is block_size the one "
                         "used to quantise?")
    # In float64, q * absmax is exact and cannot overflow, and the one rounding of / 127 keeps
    # |result| <= absmax, so the cast back to float32 is finite. In float32, either order can
    # overflow near float32's maximum: q * absmax directly, or 127 * (absmax / 127) rounded up.
    absmax = scales.to(torch.float64).repeat_interleave(block_size)[:n]
    return (q.to(torch.float64) * absmax / 127).to(torch.float32).reshape(shape)


def largest_trainable_params(n_gpus: int, gpu_bytes: float, bytes_per_param: float) -> int:
    """The most parameters whose training state fits in the GPUs' memory, activations left out:
    floor(n_gpus * gpu_bytes / bytes_per_param).

    Example: 8 H100s of 80e9 bytes at 16 bytes per parameter (AdamW, ``training_memory``)
    hold 40e9 parameters.

    Args:
        n_gpus: number of GPUs (>= 0).
        gpu_bytes: memory of one GPU in bytes (>= 0), e.g. 80e9.
        bytes_per_param: bytes of training state per parameter (> 0), e.g. 16.

    Returns:
        The parameter count as an int, computed exactly (no float rounding before the floor).
    """
    n_gpus = operator.index(n_gpus)
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    if not (math.isfinite(gpu_bytes) and gpu_bytes >= 0):
        raise ValueError(f"gpu_bytes must be finite and >= 0, got {gpu_bytes!r}")
    if not (math.isfinite(bytes_per_param) and bytes_per_param > 0):
        raise ValueError(f"bytes_per_param must be finite and > 0, got {bytes_per_param!r}")
    # Fractions hold ints and floats exactly, so the floor is that of the true quotient.
    return math.floor(n_gpus * Fraction(gpu_bytes) / Fraction(bytes_per_param))


def activation_bytes_per_layer(
    seq_len: int, batch: int, d_model: int, n_heads: int, bytes_per_element: int = 2,
    recompute_attention: bool = False, dropout: bool = True,
) -> int:
    """Bytes of activations one transformer layer keeps for its backward pass.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    eq. 1: s*b*h*(34 + 5*a*s/h) bytes for s = seq_len, b = batch, h = d_model, a = n_heads,
    without tensor or sequence parallelism. The 34 and the 5 are already bytes: they count
    16-bit activations at 2 bytes each plus dropout masks at 1 byte each. Per layer:
    attention 11*s*b*h + 5*a*s*s*b (QKV input 2, Q and K 4, V 2, output-projection input 2,
    dropout mask 1; softmax output 2, attention dropout mask 1 and output 2 per score), MLP
    19*s*b*h (inputs of both linears 2 + 8, GeLU input 8, dropout mask 1) and both layer norms'
    inputs 4*s*b*h. In elements: 16 s*b*h and 2 a*s*s*b values plus 2 s*b*h and a*s*s*b mask
    bytes, which is how ``bytes_per_element`` scales it. Per-token layer-norm statistics
    (O(s*b)) are left out, as in the paper.

    Two assumptions of the paper can be switched off:

    - ``recompute_attention=True``: the a*s*s*b terms are not stored. That is Korthikanti's
      selective recomputation (the softmax, its dropout and the attention over values are
      recomputed in the backward pass), and it is also what FlashAttention keeps: it never
      stores the s x s scores (it keeps one fp32 statistic per query and head instead, 4*a*s*b
      bytes, left out here). 34*s*b*h bytes with dropout.
    - ``dropout=False``: no dropout anywhere (most large models today): no masks (2*s*b*h and
      a*s*s*b bytes) and no dropped copy of the softmax output (2*a*s*s*b bytes in 16 bits).
      32*s*b*h + 2*a*s*s*b bytes in 16 bits.

    Args:
        seq_len, batch: s and b above (>= 0).
        d_model, n_heads: h and a above (>= 1).
        bytes_per_element: bytes of one stored activation value: 2 for bf16/fp16, 4 for fp32.
        recompute_attention: True when the attention scores are not stored (selective
            recomputation, or FlashAttention).
        dropout: False for a model without dropout.

    Returns:
        Bytes as an int.
    """
    s, b, h, a = (operator.index(v) for v in (seq_len, batch, d_model, n_heads))
    e = operator.index(bytes_per_element)
    if min(s, b) < 0 or min(h, a, e) < 1:
        raise ValueError("seq_len and batch must be >= 0; d_model, n_heads and "
                         "bytes_per_element >= 1")
    masks = 1 if dropout else 0  # one byte per dropped element
    per_token = s * b * h * (16 * e + 2 * masks)
    # Per score: the softmax output, and with dropout its mask and the dropped copy.
    per_score = e + masks * (1 + e)
    scores = 0 if recompute_attention else a * s * s * b * per_score
    return per_token + scores


# ---------------------------------------------------------------- figures and predictions


def _zeroed_share() -> float:
    """The share of v that the linear code stores as 0 after Adam's first step from w = 0."""
    from solutions.eight_bit import LINEAR_CODE, least_squares_problem, through_code

    a, y = least_squares_problem()
    first_v = 0.001 * (2 * a.T @ (-y) / len(y)) ** 2
    return (through_code(first_v, LINEAR_CODE) == 0).float().mean().item()

# Answers to the notebook's "predict first" questions. The notebook holds them sealed, and
# tests/test_notebooks.py checks that each sealed answer is the constant of the same name here.

# Section 4: the share of Adam's v that the linear int8 code stores as 0 after the first step
# of solutions/eight_bit.py's run: (a) about a tenth, (b) about half, (c) about nine in ten.
choice_zeroed_share = "abc"[min(range(3), key=lambda i: abs(_zeroed_share() - (0.1, 0.5, 0.9)[i]))]
# Section 6: the 70B model's weights, gradients and AdamW state in mixed bf16, in 80 GB GPUs.
predicted_gpus_70b = sum(training_memory(70 * 10**9, "mixed_bf16").values()) / 80e9
# Section 6: which part of an 8-bit Adam bar is smallest, scales aside: (a) the weights, (b) the
# gradients, (c) the fp32 master weights, (d) each of Adam's moments.
_OPTIONS_8BIT = ("params", "grads", "master_params", "adam_m")
choice_smallest_8bit = "abcd"[min(range(4), key=lambda i: training_memory(256, "adam8bit")[
    _OPTIONS_8BIT[i]])]
# Section 9 (graded): the bytes of the MLP's weights, gradients and AdamW state, all fp32. Each
# student answers for an MLP of their own (its widths, grader/content/cases/memory.py); these are
# the default's, which the notebook's text describes.
mlp_widths = (32, 40, 40, 8)
predicted_mlp_training_bytes = sum(training_memory(
    (mlp_widths[0] + 1) * mlp_widths[1]  # a Linear's weights and biases: (n_in + 1) * n_out
    + (mlp_widths[1] + 1) * mlp_widths[2] + (mlp_widths[2] + 1) * mlp_widths[3],
    "fp32").values())
