"""Lesson 10's measurements: IsoFLOP profiles trained on this CPU, and a CPU AdamW step timed.

``isoflop_profiles`` is Chinchilla's approach 2 in miniature: for each FLOP budget C, models of
several sizes N, each trained on exactly the D = C / (6N) tokens the budget allows (lesson 04's
6ND), and the final loss of each; ``isoflop_minimum`` (the graded function) then fits each
profile's parabola, and ``n_opt_exponent`` the line through the minima in log-log.
``cpu_adamw_params_per_second`` times ``torch.optim.AdamW`` on one flat parameter, the rate that
``offload_seconds`` takes for the CPU's share of a ZeRO-Offload step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from solutions.tiny_transformer import TinyTransformer

# Three budgets 1.75x apart and five widths, with heads of 4 dimensions (3 has one head): with
# these every profile's lowest loss is at the second, third or fourth size and N_opt grows with
# the budget, for seeds 0 to 29 in fp32 and 0 to 9 in fp64, on one thread and on two; 981 steps
# in all. Budgets 1.5x apart cost 803 steps, but N_opt then grew by only 1% for one seed.
ISOFLOP_BUDGETS = (2.4e8, 4.2e8, 7.35e8)
ISOFLOP_SHAPES = ((3, 1, 1), (8, 1, 2), (12, 1, 3), (16, 1, 4), (24, 1, 6))
BYTE_VOCAB_SIZE = 256


def isoflop_profiles(token_ids: np.ndarray, budgets: Sequence[float] = ISOFLOP_BUDGETS,
                     shapes: Sequence[tuple[int, int, int]] = ISOFLOP_SHAPES,
                     batch_size: int = 8, seq_len: int = 32, lr_times_width: float = 1.28,
                     seed: int = 0) -> dict:
    """Train every shape at every budget for the tokens that 6·N·D = C allows; each final loss.

    N counts every parameter, the embedding and the unembedding included, as Hoffmann et al.
    (Chinchilla) and lesson 04's ``transformer_params`` do; ``TinyTransformer`` matches that
    count to the parameter. Kaplan et al. left the embeddings out, and Pearce and Song 2024
    (arXiv:2406.12907) trace most of the gap between the two papers' exponents to that choice
    made at small scale; at 256 byte tokens the embeddings are most of these models (93% of
    the smallest, 64% of the largest).

    Each run is seeded with ``seed`` (weights and windows alike), inside
    ``torch.random.fork_rng`` so that the caller's generator is left as it was, and trained
    with ``torch.optim.AdamW`` (torch's defaults otherwise) at a peak learning rate of
    lr_times_width / d_model, decayed along a cosine to a tenth at the last step: Chinchilla
    matches the schedule to each run's length. The rate falls as 1 / width, μP's rule for Adam
    on hidden matrices, here applied to every matrix: one rate for all sizes favours the sizes
    it suits, and the valley then sits at them whatever the budget. Each step takes
    ``batch_size`` windows of ``seq_len`` tokens, drawn at random from every window of the
    text. The final loss is the mean cross-entropy over all those windows after the last step:
    the loss on the whole training distribution, which sampling adds no noise to. The text is
    312 tokens and every run repeats it, so this measures how well a model memorises it for
    the budget; Chinchilla's runs repeated little of their data.

    Args:
        token_ids: the training text, byte token ids (the course's 312 tokens).
        budgets: C of each profile, FLOPs (each enough for one step of the largest shape).
        shapes: (d_model, n_layers, n_heads) of each ``TinyTransformer``, by growing size.
        batch_size, seq_len: windows a step and tokens a window.
        lr_times_width: the peak learning rate times d_model.
        seed: the seed of every run.

    Returns:
        A dict: ``shapes``; ``n_params`` (one int a shape); ``learning_rates`` (the peak of
        each shape); ``budgets`` (floats); and, one row a budget, one entry a shape, ``steps``,
        ``tokens`` (the targets the run trained on, within half a batch of C / (6N)) and
        ``losses`` (nats per token); ``seconds``, the wall time of the runs alone (counting
        the sizes on the meta device comes before; in a fresh process it imports
        torch._dynamo, once).
    """
    text = torch.from_numpy(np.asarray(token_ids).astype(np.int64))
    if len(text) <= seq_len + 1:
        raise ValueError(f"the text has {len(text)} tokens, too few for windows of {seq_len}")
    starts = torch.arange(len(text) - seq_len)
    windows = text[starts[:, None] + torch.arange(seq_len + 1)]
    tokens_per_step = batch_size * seq_len
    shapes = [tuple(shape) for shape in shapes]
    with torch.device("meta"):  # shapes only: no memory, no draws from the generator
        n_params = [sum(p.numel() for p in TinyTransformer(BYTE_VOCAB_SIZE, *shape).parameters())
                    for shape in shapes]
    learning_rates = [lr_times_width / d_model for d_model, _, _ in shapes]
    result: dict = {"shapes": shapes, "n_params": n_params, "learning_rates": learning_rates,
                    "budgets": [float(c) for c in budgets], "steps": [], "tokens": [],
                    "losses": []}
    began = time.perf_counter()
    for budget in budgets:
        steps = [round(budget / (6 * n * tokens_per_step)) for n in n_params]
        if min(steps) < 1:
            raise ValueError(f"a budget of {budget:g} FLOPs is less than one step of "
                             f"{tokens_per_step} tokens for {max(n_params)} parameters")
        runs = [_train(windows, shape, n_steps, batch_size, lr, seed)
                for shape, n_steps, lr in zip(shapes, steps, learning_rates, strict=True)]
        result["steps"].append(steps)
        result["tokens"].append([tokens for _, tokens in runs])
        result["losses"].append([loss for loss, _ in runs])
    result["seconds"] = time.perf_counter() - began
    return result


def _train(windows: torch.Tensor, shape: tuple[int, int, int], n_steps: int, batch_size: int,
           lr: float, seed: int) -> tuple[float, int]:
    """One run of ``isoflop_profiles`` on ``windows``, int64 of shape (windows, seq_len + 1):
    (the final mean loss over all of them, the number of targets trained on)."""
    rng = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformer(BYTE_VOCAB_SIZE, *shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    tokens = 0
    for step in range(n_steps):
        cosine = 0.5 * (1 + math.cos(math.pi * step / n_steps))
        optimizer.param_groups[0]["lr"] = lr * (0.1 + 0.9 * cosine)
        batch = windows[torch.from_numpy(rng.integers(0, len(windows), size=batch_size))]
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tokens += batch[:, 1:].numel()
    with torch.no_grad():
        logits = model(windows[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item(), tokens


def n_opt_exponent(budgets: Sequence[float], n_opts: Sequence[float]) -> float:
    """The exponent a of N_opt ∝ C^a: the slope of the least-squares line of ln N_opt against
    ln C (``numpy.polyfit``, degree 1)."""
    slope, _ = np.polyfit(np.log(budgets), np.log(n_opts), 1)
    return float(slope)


def adamw_step_seconds(optimizer: torch.optim.Optimizer, steps: int = 5,
                       warmup: int = 1) -> list[float]:
    """Time ``optimizer.step()``: ``warmup`` untimed steps (the first allocates the moments),
    then ``steps`` timed ones, each by ``time.perf_counter``; the gradients stay as they are.

    Returns:
        The seconds of each timed step, in order.
    """
    for _ in range(warmup):
        optimizer.step()
    seconds = []
    for _ in range(steps):
        began = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - began)
    return seconds


def cpu_adamw_params_per_second(n_params: int, steps: int = 5, warmup: int = 1,
                                fused: bool | None = None) -> float:
    """Parameters per second that ``torch.optim.AdamW`` updates on this CPU.

    One flat fp32 parameter of n_params numbers with a gradient set, under torch's default
    AdamW (lr 1e-3, weight decay 1e-2). ``fused=None`` leaves the choice to torch, which on a
    CPU takes neither its foreach nor its fused kernel but the plain loop over tensors (here
    one): a step is eight whole-array operations, each a pass over memory (the decay, one for
    the first moment, two for the second, a square root, a division, adding epsilon, the
    update). ``fused=True`` asks for torch's fused CPU kernel, one pass, vectorised and spread
    over the threads, closer to the CPU Adam that ZeRO-Offload runs. The parameter is ones
    and the gradient 1e-3 everywhere: the values do not change the work.

    Args:
        n_params: numbers in the parameter (> 0); at 1e7 the parameter, its gradient and both
            moments are 160 MB, more than a CPU's caches hold.
        steps, warmup: as in ``adamw_step_seconds``.
        fused: passed to ``torch.optim.AdamW``.

    Returns:
        n_params / the median step's seconds.
    """
    parameter = torch.nn.Parameter(torch.ones(n_params))
    parameter.grad = torch.full((n_params,), 1e-3)
    optimizer = torch.optim.AdamW([parameter], fused=fused)
    return n_params / float(np.median(adamw_step_seconds(optimizer, steps, warmup)))
