"""Why 8-bit Adam needs a non-linear code: AdamW with its second moment stored in 8 bits.

Lesson 05's blockwise int8 (absmax, linear) stores a tensor of non-negative values, such as
Adam's second moment v, with 128 evenly spaced levels between 0 and the block's largest value.
v holds squared gradients, so it spans twice as many orders of magnitude as they do, and most
of its values round to 0; Adam's update m / (sqrt(v) + eps) then divides by eps alone. Dettmers
et al. (2022, "8-bit Optimizers via Block-wise Quantization") use a non-linear ("dynamic") code
whose levels crowd near zero. ``log_code`` here is such a code in its simplest form: 0 and 255
levels spaced evenly on a log scale; it is not bitsandbytes' own code, which splits each byte
into a sign, an exponent and a linear fraction.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

LINEAR_CODE = torch.arange(128, dtype=torch.float64) / 127  # int8 absmax, on values >= 0


def log_code(decades: int) -> Tensor:
    """0 and 255 levels spaced evenly on a log scale from 10**-decades to 1: 256 codes, one
    byte."""
    return torch.cat([torch.zeros(1, dtype=torch.float64),
                      torch.logspace(-decades, 0, 255, dtype=torch.float64)])


def through_code(x: Float[Tensor, " n"], code: Tensor, block_size: int = 256,
                 ) -> Float[Tensor, " n"]:
    """``x`` (values >= 0) stored in 8 bits with ``code`` per block of ``block_size`` and read
    back: each value becomes the nearest level times its block's absmax.

    Args:
        x: a 1-D float tensor of non-negative values.
        code: the sorted levels in [0, 1] (at most 256 of them: one byte).
        block_size: values per block, each block with its own absmax (a float32 scale).

    Returns:
        The stored values, float32, shape of ``x``.
    """
    n = x.numel()
    padded = torch.cat([x.double(), x.new_zeros((-n) % block_size, dtype=torch.float64)])
    blocks = padded.view(-1, block_size)
    absmax = blocks.max(dim=1, keepdim=True).values.float().double()  # a float32 scale
    scaled = torch.where(absmax > 0, blocks / absmax.clamp(min=1e-300), 0.0).clamp(0, 1)
    above = torch.searchsorted(code, scaled).clamp(1, len(code) - 1)
    lower, upper = code[above - 1], code[above]
    nearest = torch.where(scaled - lower <= upper - scaled, lower, upper)
    return (nearest * absmax).flatten()[:n].float()


def least_squares_problem(seed: int = 0) -> tuple[Tensor, Tensor]:
    """A least-squares problem whose gradient coordinates span orders of magnitude: the columns
    of ``a`` are scaled from 1 down to 1e-3, as a model's parameters see gradients of very
    different sizes (and some coordinates' gradients pass close to 0)."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(512, 256, generator=generator) * torch.logspace(0, -3, 256)
    y = a @ torch.randn(256, generator=generator)
    return a, y


def adam_losses(code: Tensor | None, n_steps: int = 300, lr: float = 1e-2,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> list[float]:
    """The mean squared error before each step of Adam on ``least_squares_problem``, with the
    second moment v kept in fp32 (``code`` None) or stored after every step in 8 bits with
    ``code`` (``LINEAR_CODE``, ``log_code(...)``), in blocks of 256.

    Returns:
        ``n_steps`` losses (inf or nan once the run has blown up).
    """
    a, y = least_squares_problem()
    w, m, v = torch.zeros(256), torch.zeros(256), torch.zeros(256)
    losses = []
    for t in range(1, n_steps + 1):
        residual = a @ w - y
        losses.append((residual**2).mean().item())
        gradient = 2 * a.T @ residual / len(residual)
        m = betas[0] * m + (1 - betas[0]) * gradient
        v = betas[1] * v + (1 - betas[1]) * gradient**2
        if code is not None:
            v = through_code(v, code)
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        w = w - lr * m_hat / (v_hat.sqrt() + eps)
    return losses
