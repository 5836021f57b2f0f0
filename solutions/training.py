"""Lesson 06: one training step of a small transformer, counted end to end.

A step is ``loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())`` on a
``(batch_size, seq_len)`` batch of lesson 04's ``TinyTransformer``, then ``loss.backward()`` and
``optimizer.step()``. This module predicts, from the model's shape alone, what that step costs:

- FLOPs (``train_step_flops``): the forward pass of lesson 04, twice that for the backward pass,
  and, when every block runs under ``torch.utils.checkpoint``, the part of each block's forward
  that the backward pass runs again;
- activation memory (``saved_activation_bytes``): the bytes of every tensor autograd keeps from
  the forward pass for the backward pass;
- the loss scale of fp16 training (``loss_scale_update``), as ``torch.amp.GradScaler`` moves it;
- the tensor bytes of a checkpoint that resumes training exactly (``checkpoint_bytes``).

Each count is exact for ``TinyTransformer`` on the torch the course pins: the tests compare them
with FlopCounterMode, ``torch.autograd.graph.saved_tensors_hooks``, ``GradScaler`` and
``torch.save``.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
from torch import nn

from solutions.backprop import _positive_ints, transformer_forward_flops, transformer_params
from solutions.memory import training_memory
from solutions.tiny_transformer import TinyTransformer
from solutions.training_loop import MixedPrecisionAdamW, run_recipe

# Names the lesson's checks call besides the graded functions (they build models and optimizers).
__all__ = ["MixedPrecisionAdamW", "TinyTransformer", "checkpoint_bytes", "loss_scale_update",
           "nn", "run_recipe", "saved_activation_bytes", "train_step_flops"]


def train_step_flops(n_layers: int, d_model: int, seq_len: int, vocab_size: int, batch_size: int,
                     d_ff: int | None = None, recompute: bool = False) -> dict[str, int]:
    """Matmul FLOPs of one training step of ``TinyTransformer`` on a batch of sequences.

    The backward pass does two matmuls of the forward one's size for every forward matmul (the
    embedding's output needs a gradient, so none is skipped). With ``recompute=True`` every block
    runs under non-reentrant ``torch.utils.checkpoint``: the backward pass runs each block's
    forward again, but only until every tensor that block's backward needs is back. The last
    matmul of a block, the MLP's down-projection, saves only its inputs, which exist before it
    runs, so it is not run again: per block and sequence 8·T·d² + 2·T·d·d_ff + 4·T²·d.

    Args:
        n_layers: L, number of blocks.
        d_model: d, width of the residual stream.
        seq_len: T, tokens per sequence.
        vocab_size: V, tokens in the vocabulary.
        batch_size: B, sequences in the batch.
        d_ff: width of the MLP; None means 4 * d_model.
        recompute: whether every block runs under activation checkpointing.

    Returns:
        ``{"forward", "backward", "recompute", "total"}`` -> FLOPs (ints): forward is
        B · ``transformer_forward_flops``, backward twice that, recompute 0 without
        checkpointing, and total their sum.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, seq_len=seq_len,
                           vocab_size=vocab_size, batch_size=batch_size,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    if type(recompute) is not bool:
        raise TypeError(f"recompute must be True or False, got {recompute!r}")
    n_layers, d, seq_len, vocab_size, batch_size, d_ff = sizes.values()
    forward = batch_size * transformer_forward_flops(n_layers, d, seq_len, vocab_size, d_ff)
    backward = 2 * forward  # a weight gradient and an input gradient per forward matmul
    recomputed = 0
    if recompute:
        # Projections, attention and the MLP's up-projection: everything up to the last matmul.
        per_block = 8 * seq_len * d * d + 4 * seq_len * seq_len * d + 2 * seq_len * d * d_ff
        recomputed = batch_size * n_layers * per_block
    return {"forward": forward, "backward": backward, "recompute": recomputed,
            "total": forward + backward + recomputed}


def saved_activation_bytes(n_layers: int, d_model: int, n_heads: int, seq_len: int,
                           vocab_size: int, batch_size: int, d_ff: int | None = None,
                           dtype: torch.dtype = torch.float32,
                           checkpoint_blocks: bool = False) -> int:
    """Bytes autograd keeps for the backward pass after the forward pass and the loss.

    What ``torch.autograd.graph.saved_tensors_hooks`` sees packed while ``TinyTransformer``
    (untied) and the cross-entropy loss run on separate, contiguous int64 ``tokens`` and
    ``targets`` of shape (B, T), counted once per storage, parameters left out. With e bytes per
    element of ``dtype`` (f = d_ff, h = n_heads), each block keeps

        e · (8·B·T·d + 2·B·T + 2·B·T·f + B·h·T²) + T²

    (block input, normed input, q, k, v, attention output, residual, normed residual: 8·B·T·d;
    two RMSNorm statistics per token; the MLP's hidden layer before and after GELU; the softmax
    output; the causal mask, one bool per score, shared by the batch and the heads). Outside the
    blocks: the token ids and the targets (8 bytes each per token), the final norm's input,
    statistic and output, the log-softmax over the vocabulary and the loss's 0-dim total weight:

        16·B·T + e · (2·B·T·d + B·T + B·T·V + 1).

    With ``checkpoint_blocks`` each block keeps only its input, e·B·T·d bytes, and the backward
    pass computes the rest again.

    Args:
        n_layers, d_model, n_heads, seq_len, vocab_size, batch_size: L, d, h, T, V, B (>= 1);
            n_heads must divide d_model.
        d_ff: width of the MLP; None means 4 * d_model.
        dtype: the floating-point dtype of the model's parameters and activations.
        checkpoint_blocks: whether every block runs under ``torch.utils.checkpoint``.

    Returns:
        The bytes, an int.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, n_heads=n_heads, seq_len=seq_len,
                           vocab_size=vocab_size, batch_size=batch_size,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    n_layers, d, n_heads, seq_len, vocab_size, batch_size, d_ff = sizes.values()
    if d % n_heads:
        raise ValueError(f"d_model={d} does not split into n_heads={n_heads} heads")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if type(checkpoint_blocks) is not bool:
        raise TypeError(f"checkpoint_blocks must be True or False, got {checkpoint_blocks!r}")
    e, tokens = dtype.itemsize, batch_size * seq_len
    if checkpoint_blocks:
        per_block = e * tokens * d  # the block's input, kept by torch.utils.checkpoint
    else:
        per_block = (e * (8 * tokens * d + 2 * tokens + 2 * tokens * d_ff
                          + batch_size * n_heads * seq_len * seq_len)
                     + seq_len * seq_len)  # the causal mask: one bool per (query, key)
    outside = 2 * 8 * tokens + e * (2 * tokens * d + tokens + tokens * vocab_size + 1)
    return n_layers * per_block + outside


def loss_scale_update(scale: float, growth_tracker: int, found_inf: bool,
                      growth_factor: float = 2.0, backoff_factor: float = 0.5,
                      growth_interval: int = 2000) -> tuple[float, int]:
    """The next loss scale and growth tracker of dynamic loss scaling, as GradScaler keeps them.

    A step whose gradients hold an inf or a NaN is skipped: the scale is multiplied by
    ``backoff_factor`` and the tracker restarts at 0. After a clean step the tracker counts one
    more; when it reaches ``growth_interval`` the scale is multiplied by ``growth_factor`` (unless
    that overflows float32, which leaves the scale as it is) and the tracker restarts at 0.
    GradScaler keeps the scale as a float32 tensor: the scale is rounded to float32 first, and
    each product is computed in float64 and rounded to float32, as its kernel does.

    Args:
        scale: the current loss scale (finite, >= 0).
        growth_tracker: clean steps since the scale last changed, in [0, growth_interval).
        found_inf: whether this step's gradients held an inf or a NaN.
        growth_factor: finite, > 1.
        backoff_factor: in (0, 1).
        growth_interval: clean steps between two growths (>= 1).

    Returns:
        ``(scale, growth_tracker)`` after this step: a float (a float32 value) and an int.
    """
    if not (isinstance(scale, numbers.Real) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    if type(found_inf) is not bool:
        raise TypeError(f"found_inf must be True or False, got {found_inf!r}")
    if not (isinstance(growth_factor, numbers.Real) and 1 < growth_factor < math.inf):
        raise ValueError(f"growth_factor must be finite and > 1, got {growth_factor!r}")
    if not (isinstance(backoff_factor, numbers.Real) and 0 < backoff_factor < 1):
        raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
    growth_interval = _positive_ints(growth_interval=growth_interval)["growth_interval"]
    growth_tracker = operator.index(growth_tracker)
    if not 0 <= growth_tracker < growth_interval:
        raise ValueError(f"growth_tracker must be in [0, {growth_interval}), got {growth_tracker}")
    scale = _float32(scale)
    if found_inf:
        return _float32(scale * backoff_factor), 0
    if growth_tracker + 1 < growth_interval:
        return scale, growth_tracker + 1
    grown = _float32(scale * growth_factor)
    return (grown if math.isfinite(grown) else scale), 0


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (to inf beyond its range), as a Python float."""
    return torch.tensor(float(x), dtype=torch.float64).to(torch.float32).item()


def checkpoint_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Tensor bytes of a checkpoint that resumes training exactly, from shapes and dtypes.

    The checkpoint is ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``:
    the parameters and buffers, and the optimizer's per-parameter state (AdamW: m, v and a 0-dim
    step tensor; no state before its first step). Every tensor found anywhere in the two dicts
    counts numel x element size; a tensor that appears under two names (tied weights) counts
    once, as ``torch.save`` stores it once. Numbers that are not tensors (hyperparameters, a
    Python int step) count 0: they belong to the serialisation overhead. Assumes that every
    tensor fills its storage, as parameters and optimizer state do.

    Args:
        model: any ``torch.nn.Module``.
        optimizer: any ``torch.optim.Optimizer``.

    Returns:
        The bytes, an int.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    seen: set[tuple[int, torch.dtype, tuple[int, ...]]] = set()
    total = 0
    pending: list[object] = [model.state_dict(), optimizer.state_dict()]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            key = (item.data_ptr(), item.dtype, tuple(item.shape))
            if item.numel() and key not in seen:
                seen.add(key)
                total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return total


# ---------------------------------------------------------------- the lesson's predictions

# Answers to the notebook's "predict first" questions, for the model of section 1 (256 tokens,
# width 64, 2 blocks of 4 heads, untied: 131,072 parameters in 14 matrices) on batches of 8
# sequences of 64 tokens. The notebook holds them sealed; tests/test_notebooks.py checks that
# each sealed answer is the constant of the same name here.
_PLAIN = saved_activation_bytes(2, 64, 4, 64, 256, 8)
_CHECKPOINTED = saved_activation_bytes(2, 64, 4, 64, 256, 8, checkpoint_blocks=True)
_SIX_NT = 6 * transformer_params(2, 64, 256) * 8 * 64
_STEP_FLOPS = train_step_flops(2, 64, 64, 256, 8)["total"]


def _clean_scale(n_steps: int) -> float:
    """GradScaler's scale after ``n_steps`` steps without overflow, from 2**10, growth every 5."""
    scale, tracker = 2.0**10, 0
    for _ in range(n_steps):
        scale, tracker = loss_scale_update(scale, tracker, False, growth_interval=5)
    return scale


# Section 5: lesson 04's 6NT against the exact count of a plain step: (a) above, (b) equal,
# (c) below.
choice_six_nt = "a" if _SIX_NT > _STEP_FLOPS else "b" if _SIX_NT == _STEP_FLOPS else "c"
# Section 6: the share of the plain fp32 bytes autograd keeps with every block checkpointed:
# (a) about a half, (b) about a sixth, (c) about a hundredth (the nearest on a log scale).
choice_checkpointed_share = "abc"[min(range(3), key=lambda i: abs(math.log(
    _CHECKPOINTED / _PLAIN * (2, 6, 100)[i])))]
# Section 7: the loss scale after 80 steps without an overflow.
predicted_clean_scale = _clean_scale(80)
# Section 9: the tensor bytes of the fp32 checkpoint after two steps of torch's AdamW (weights,
# m and v, and a 4-byte step per tensor), what checkpoint_bytes counts; the file adds
# torch.save's overhead, which the notebook measures beside it.
predicted_checkpoint_bytes = (sum(training_memory(131_072, "fp32").values())
                                   - training_memory(131_072, "fp32")["grads"] + 4 * 14)
# Section 10 (graded): the bytes one step needs, added up: weights, gradients and AdamW's m and
# v in fp32, and the activations autograd saves for the backward pass. Each student answers for
# a batch of their own (sequences, tokens per sequence: grader/content/cases/training.py) on the
# same model; these are the default's, section 1's batch, which the notebook's text describes.
step_batch_size, step_seq_len = 8, 64
predicted_step_bytes = (sum(training_memory(transformer_params(2, 64, 256), "fp32").values())
                        + saved_activation_bytes(2, 64, 4, step_seq_len, 256, step_batch_size))

