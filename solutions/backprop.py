"""Lesson 04: backprop FLOPs, transformer accounting and the 6ND rule.

Backward through a matmul. For y = x @ w with x: (B, D) and w: (D, K), the forward pass costs
2·B·D·K FLOPs. Given the loss gradient g = dL/dy, the backward pass computes two more matmuls of
the same size: dL/dw = xᵀ @ g (for the weight's update) and dL/dx = g @ wᵀ (to pass on to the
layer below). So backward ≈ 2 x forward and one training step ≈ 3 x forward. When nothing below
the first layer needs a gradient (token ids, a batch of data), autograd skips that layer's dL/dx,
and the step costs less than 3 x forward: for x: (B, D) @ w1: (D, D) the skipped matmul is
2·B·D² FLOPs, which puts the step that far below 6 x params x tokens.

Where 6ND comes from. A weight matrix of P parameters used once per token costs 2·P FLOPs per
token forward, so a model of N parameters costs about 2·N per token forward and 6·N per token
for a training step; D tokens cost 6·N·D. The count leaves out everything that is not a matmul
with a weight (attention's two matmuls, elementwise work) and counts weights that do no matmul
(an embedding lookup). ``torch.utils.flop_counter.FlopCounterMode`` counts matmuls only (mm, bmm,
addmm without the bias add, convolutions, the fused attention kernels on a GPU), so it is the
oracle for the matmul count, never for the elementwise work.

Transformer accounting (no biases, no norm parameters, no position embeddings). Per layer:
q, k, v, o projections 4·d², MLP 2·d·d_ff (8·d² at d_ff = 4·d), so 12·L·d² + 2·V·d parameters
with untied embeddings, 12·L·d² + V·d tied. Forward FLOPs for one sequence of T tokens:
L·(8·T·d² + 4·T·d·d_ff + 4·T²·d) + 2·T·d·V, the 4·T²·d being attention's scores (q @ kᵀ) and
weighted sum (weights @ v), which grow with the square of the context. What the formula leaves
out is small: GPT-2's biases and LayerNorm gains and shifts add 13·d per layer (9·d biases, 4·d
LayerNorm) and 2·d for the final LayerNorm, its learned position embeddings context·d: 908K
parameters, 0.73% of GPT-2 small's 124.4M.
"""

from __future__ import annotations

import math
import numbers
import operator

from torch import Tensor


def _positive_ints(**sizes: int) -> dict[str, int]:
    """The sizes as ints: TypeError for a size that is not an integer (from operator.index),
    ValueError naming every size that is not positive."""
    values = {name: operator.index(size) for name, size in sizes.items()}
    bad = [f"{name}={size}" for name, size in values.items() if size <= 0]
    if bad:
        raise ValueError(f"sizes must be positive integers, got {', '.join(bad)}")
    return values


def two_layer_forward_backward(x: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Loss mean((x @ w1 @ w2)²) and its gradients for w1 and w2, by hand with matmuls.

    Args:
        x: inputs, shape (B, D), floating point, every size at least 1.
        w1: first layer's weights, shape (D, H), same dtype as x; the hidden width H may
            differ from D (the lesson's network has H = D).
        w2: second layer's weights, shape (H, K), same dtype as x.

    Returns:
        ``(loss, grad_w1, grad_w2)``: the loss as a 0-dim tensor, dL/dw1 of shape (D, H) and
        dL/dw2 of shape (H, K), all in x's dtype.
    """
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if not isinstance(t, Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got {t!r:.80}")
        if t.numel() == 0:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: every size must be positive")
        if t.dtype != x.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but x has {x.dtype}")
    if x.shape[1] != w1.shape[0] or w1.shape[1] != w2.shape[0]:
        raise ValueError(f"shapes x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)} "
                         "do not chain: need x (B, D), w1 (D, D'), w2 (D', K)")
    h = x @ w1  # (B, D)
    y = h @ w2  # (B, K)
    loss = y.pow(2).mean()
    grad_y = 2 * y / y.numel()  # d mean(y²) / dy: elementwise, no matmul
    grad_w2 = h.T @ grad_y  # (D, B) @ (B, K)
    grad_h = grad_y @ w2.T  # (B, K) @ (K, D): passed down to the first layer
    grad_w1 = x.T @ grad_h  # (D, B) @ (B, D); dL/dx = grad_h @ w1.T is not needed here
    return loss, grad_w1, grad_w2


def two_layer_flops(B: int, D: int, K: int, input_requires_grad: bool = False) -> dict[str, int]:
    """Matmul FLOPs of the forward and backward pass of loss = mean((x @ w1 @ w2)²).

    What FlopCounterMode counts for x: (B, D), w1: (D, D), w2: (D, K) when both weights need a
    gradient: the square, the mean and their gradients are elementwise and count 0.

    Args:
        B: batch size (rows of x).
        D: input and hidden width.
        K: output width.
        input_requires_grad: whether x needs a gradient; only then is dL/dx = dL/dh @ w1ᵀ
            computed, one more (B, D) @ (D, D) matmul.

    Returns:
        ``{"forward": 2BD² + 2BDK, "backward": 2BDK + 2BKD + 2BD² (+ 2BD² when x needs a
        gradient)}``, ints.
    """
    sizes = _positive_ints(B=B, D=D, K=K)
    if type(input_requires_grad) is not bool:
        raise TypeError(f"input_requires_grad must be True or False, got {input_requires_grad!r}")
    B, D, K = sizes["B"], sizes["D"], sizes["K"]
    forward = 2 * B * D * D + 2 * B * D * K  # h = x @ w1, y = h @ w2
    backward = (2 * D * B * K  # dL/dw2 = hᵀ @ g
                + 2 * B * K * D  # dL/dh = g @ w2ᵀ
                + 2 * D * B * D)  # dL/dw1 = xᵀ @ dL/dh
    if input_requires_grad:
        backward += 2 * B * D * D  # dL/dx = dL/dh @ w1ᵀ
    return {"forward": forward, "backward": backward}


def transformer_params(n_layers: int, d_model: int, vocab_size: int, d_ff: int | None = None,
                       tied_embeddings: bool = False) -> int:
    """Parameters of a decoder-only transformer's weight matrices.

    Biases, norm parameters and position embeddings are left out: with d_ff = 4·d_model this is
    12·L·d² + 2·V·d (untied) or 12·L·d² + V·d (tied).

    Args:
        n_layers: L, number of blocks.
        d_model: d, width of the residual stream.
        vocab_size: V, tokens in the vocabulary.
        d_ff: width of the two-matrix MLP; None means 4 * d_model.
        tied_embeddings: whether the unembedding shares the embedding's (V, d) matrix.

    Returns:
        L·(4·d² + 2·d·d_ff) + (1 if tied else 2)·V·d, an int.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, vocab_size=vocab_size,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    if type(tied_embeddings) is not bool:
        raise TypeError(f"tied_embeddings must be True or False, got {tied_embeddings!r}")
    n_layers, d, vocab_size, d_ff = sizes.values()
    per_layer = 4 * d * d + 2 * d * d_ff  # q, k, v, o; MLP up and down
    embeddings = (1 if tied_embeddings else 2) * vocab_size * d
    return n_layers * per_layer + embeddings


def transformer_forward_flops(n_layers: int, d_model: int, seq_len: int, vocab_size: int,
                              d_ff: int | None = None) -> int:
    """Matmul FLOPs of one forward pass over one sequence of seq_len tokens.

    Args:
        n_layers: L, number of blocks.
        d_model: d, width of the residual stream.
        seq_len: T, tokens in the sequence (every query attends to all T keys; the causal
            mask hides half the scores but they are computed all the same).
        vocab_size: V, tokens in the vocabulary (the unembedding is a (T, d) @ (d, V) matmul;
            the embedding is a lookup and costs nothing).
        d_ff: width of the MLP; None means 4 * d_model.

    Returns:
        L·(8·T·d² + 4·T·d·d_ff + 4·T²·d) + 2·T·d·V, an int.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, seq_len=seq_len,
                           vocab_size=vocab_size,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    n_layers, d, seq_len, vocab_size, d_ff = sizes.values()
    projections = 8 * seq_len * d * d  # q, k, v, o: four (T, d) @ (d, d)
    mlp = 4 * seq_len * d * d_ff  # up (T, d) @ (d, d_ff) and down (T, d_ff) @ (d_ff, d)
    attention = 4 * seq_len * seq_len * d  # q @ kᵀ and weights @ v, all heads together
    return n_layers * (projections + mlp + attention) + 2 * seq_len * d * vocab_size


def per_component_flops(n_layers: int, d_model: int, seq_len: int, vocab_size: int,
                        d_ff: int | None = None) -> dict[str, int]:
    """``transformer_forward_flops`` split by where the FLOPs are spent, all layers together.

    Args:
        n_layers, d_model, seq_len, vocab_size, d_ff: as in ``transformer_forward_flops``.

    Returns:
        ``{"qkv", "scores", "weighted_sum", "output_projection", "mlp_up", "mlp_down",
        "unembedding"}`` -> FLOPs (ints), summing to ``transformer_forward_flops``.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, seq_len=seq_len,
                           vocab_size=vocab_size,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    n_layers, d, seq_len, vocab_size, d_ff = sizes.values()
    return {
        "qkv": n_layers * 3 * 2 * seq_len * d * d,
        "scores": n_layers * 2 * seq_len * seq_len * d,
        "weighted_sum": n_layers * 2 * seq_len * seq_len * d,
        "output_projection": n_layers * 2 * seq_len * d * d,
        "mlp_up": n_layers * 2 * seq_len * d * d_ff,
        "mlp_down": n_layers * 2 * seq_len * d_ff * d,
        "unembedding": 2 * seq_len * d * vocab_size,
    }


def training_flops(n_params: float, n_tokens: float) -> float:
    """The 6ND estimate of a training run's FLOPs: 2·N per token forward, 4·N backward.

    Args:
        n_params: N, the model's parameters (>= 0).
        n_tokens: D, tokens seen in training (>= 0).

    Returns:
        6 * n_params * n_tokens, a float.
    """
    for name, value in (("n_params", n_params), ("n_tokens", n_tokens)):
        if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(6 * n_params * n_tokens)


def training_days(total_flops: float, n_gpus: int, peak_flops: float, mfu: float) -> float:
    """Wall-clock days to do total_flops on n_gpus, each sustaining mfu x its peak.

    Args:
        total_flops: FLOPs of the run, e.g. from ``training_flops`` (>= 0).
        n_gpus: accelerators working together (>= 1).
        peak_flops: one accelerator's dense peak, FLOP/s (> 0).
        mfu: model FLOPs utilisation, the fraction of the peak achieved, in (0, 1].

    Returns:
        total_flops / (n_gpus * peak_flops * mfu) / 86400, a float.
    """
    n_gpus = _positive_ints(n_gpus=n_gpus)["n_gpus"]
    for name, value in (("total_flops", total_flops), ("peak_flops", peak_flops), ("mfu", mfu)):
        if not (isinstance(value, numbers.Real) and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if total_flops < 0:
        raise ValueError(f"total_flops must be >= 0, got {total_flops!r}")
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu is a fraction of the peak, in (0, 1]; got {mfu!r}")
    seconds = total_flops / (n_gpus * peak_flops * mfu)
    return float(seconds / 86_400)  # seconds in a day


def gated_mlp_d_ff(d_ff: int, mlp_matrices: int) -> int:
    """The width of a two-matrix MLP with as many parameters (and matmul FLOPs) as an MLP of
    ``mlp_matrices`` (d, d_ff) matrices: a SwiGLU MLP (gate, up, down) counts as 1.5 x d_ff.

    Args:
        d_ff: the published MLP width.
        mlp_matrices: 2 for up/down, 3 for gated MLPs such as Llama's SwiGLU.

    Returns:
        mlp_matrices * d_ff / 2, an int (ValueError when it is not whole).
    """
    sizes = _positive_ints(d_ff=d_ff, mlp_matrices=mlp_matrices)
    if sizes["d_ff"] * sizes["mlp_matrices"] % 2:
        raise ValueError(f"{mlp_matrices} matrices of width {d_ff} are not a whole two-matrix MLP")
    return sizes["d_ff"] * sizes["mlp_matrices"] // 2


def model_params(shape: dict) -> int:
    """The weight matrices of a ``models.json`` entry, each at its real width.

    ``transformer_params`` with a gated MLP counted by ``gated_mlp_d_ff``, less what grouped-
    query attention saves: its k and v projections are (d, n_kv_heads * d / n_heads) matrices,
    not (d, d), so each block holds 2 d (d - n_kv_heads * d / n_heads) fewer parameters.
    Biases, norms and position embeddings are left out, as in ``transformer_params``.

    Args:
        shape: an entry with n_layers, d_model, n_heads, n_kv_heads, d_ff, mlp_matrices,
            vocab_size and tied_embeddings.

    Returns:
        Parameters, an int.
    """
    n_layers, d = shape["n_layers"], shape["d_model"]
    d_ff = gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"])
    count = transformer_params(n_layers, d, shape["vocab_size"], d_ff, shape["tied_embeddings"])
    kv_width = shape["n_kv_heads"] * d // shape["n_heads"]
    return count - n_layers * 2 * d * (d - kv_width)


# ------------------------------------------------------------------ the published counts


def kaplan_forward_flops(n_layers: int, d_model: int, seq_len: int,
                         d_ff: int | None = None) -> int:
    """Forward FLOPs of one sequence by Kaplan et al. 2020 (arXiv:2001.08361), eq. 2.2 and
    Table 1: per token 2N + 2·n_layer·n_ctx·d_attn, with N = 2·d_model·n_layer·(2·d_attn + d_ff)
    the non-embedding parameters and d_attn = d_model. Like the paper's total, it leaves out
    the embedding and the unembedding (its "De-embed", 2·d_model·n_vocab per token).

    Args:
        n_layers, d_model, seq_len, d_ff: as in ``transformer_forward_flops``.

    Returns:
        seq_len x (2N + 2·n_layers·seq_len·d_model), an int.
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, seq_len=seq_len,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    n_layers, d, seq_len, d_ff = sizes.values()
    non_embedding = 2 * d * n_layers * (2 * d + d_ff)
    attention = 2 * n_layers * seq_len * d  # the paper's "Attention: Mask" row, per token
    return seq_len * (2 * non_embedding + attention)


def chinchilla_forward_flops(n_layers: int, d_model: int, seq_len: int, vocab_size: int,
                             n_heads: int, d_ff: int | None = None) -> int:
    """Forward FLOPs of one sequence by Hoffmann et al. 2022 (arXiv:2203.15556), Appendix F:
    the embeddings (2·T·V·d, as a matmul), per layer the q, k, v projections, the key @ query
    logits, the softmax (3 FLOPs per score), the softmax @ value reductions, the final linear
    and the dense block, and the final logits; key_size x num_heads = d_model.

    Args:
        n_layers, d_model, seq_len, vocab_size, d_ff: as in ``transformer_forward_flops``.
        n_heads: attention heads (the softmax is counted per head).

    Returns:
        The total, an int: ``transformer_forward_flops`` + L·3·h·T² (softmax) + 2·T·V·d
        (embeddings).
    """
    sizes = _positive_ints(n_layers=n_layers, d_model=d_model, seq_len=seq_len,
                           vocab_size=vocab_size, n_heads=n_heads,
                           d_ff=4 * operator.index(d_model) if d_ff is None else d_ff)
    n_layers, d, seq_len, vocab_size, n_heads, d_ff = sizes.values()
    attention = (2 * 3 * seq_len * d * d  # key, query and value projections
                 + 2 * seq_len * seq_len * d  # key @ query logits
                 + 3 * n_heads * seq_len * seq_len  # softmax
                 + 2 * seq_len * seq_len * d  # softmax @ value reductions
                 + 2 * seq_len * d * d)  # final linear
    dense = 2 * seq_len * (d * d_ff + d * d_ff)
    embeddings = logits = 2 * seq_len * vocab_size * d
    return embeddings + n_layers * (attention + dense) + logits


# ------------------------------------------------------------------ predictions
# The answers to the lesson's "predict first" questions. The notebook holds each one sealed
# (grader.content.notebook_checks.seal); tests/test_backprop.py checks each against its oracle.

# Section 3: a training step of section 2's network with B = 128, D = K = 512 and no gradient
# for x, as a fraction of 6 x parameters x B: (4BD² + 6BDK) / (6BD² + 6BDK) = 10/12 at D = K
# (oracle: FlopCounterMode).
predicted_step_ratio = (sum(two_layer_flops(128, 512, 512).values())
                        / (6 * (512 * 512 + 512 * 512) * 128))

# Section 9: a training step of the first shape (L = 2, d = 64, T = 128, V = 1000, untied), one
# sequence: (a) below 6NT, (b) exactly 6NT, (c) above 6NT. It is 3 x the forward pass, against
# which 6NT counts the embedding's lookup (6TVd) and leaves out attention (3 x 4LT²d).
_step_flops = 3 * transformer_forward_flops(2, 64, 128, 1000)
_six_nt = 6 * transformer_params(2, 64, 1000) * 128
choice_step_vs_6nt = "a" if _step_flops < _six_nt else "b" if _step_flops == _six_nt else "c"

# Section 10, graded: days to train N parameters on D tokens on a number of H100 SXM at an MFU,
# with the dense bf16 peak (989.4 TFLOP/s in data/hardware.json): 6ND over the cluster's
# sustained FLOP/s. Each student answers for a run of their own (grader/content/cases/backprop.py);
# these are the default's, which the notebook's text describes: 70B parameters on 15T tokens on
# 1024 GPUs at 50% MFU, about 144 days.
run_params_billions = 70  # N, in billions
run_tokens_trillions = 15  # D, in trillions
run_gpus = 1024
run_mfu = 0.5
predicted_days_70b = (6 * run_params_billions * 1e9 * run_tokens_trillions * 1e12
                      / (run_gpus * 989.4e12 * run_mfu) / 86_400)
