"""Lesson 07's given code for the pictures and the fit: ``fit_alpha_beta`` fits the
alpha-beta model to measured all-reduce times and ``draw_allreduce_sweep`` plots them;
``ring_schedule``, ``ring_contributions`` and ``pipeline_schedule`` list who does what when, for
the pictures of the ring (``draw_ring``) and of a pipeline; ``largest_fitting`` finds the
largest integer that a monotone byte count lets fit in a budget.

Nothing here is graded. The measurements' plumbing (``run_demo``) is in
``solutions/parallel_processes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def fit_alpha_beta(tensor_bytes: Sequence[float], seconds: Sequence[float],
                   world_size: int) -> tuple[float, float]:
    """Fit t = 2 (n-1) alpha + 2 (n-1)/n B / beta to measured all-reduce times, robustly.

    The line t = a + c x through the points (x = 2 (n-1)/n B, t) that makes the sum of the
    relative errors |t - a - c x| / t smallest (a least-absolute-deviations fit, found by
    iteratively reweighted least squares): every size counts by its relative error, as the
    times span several decades, and one point far off the line, a size that other work on the
    machine slowed down, moves the fit little, where least squares would follow it. Then
    alpha = a / (2 (n-1)) and beta = 1 / c. A negative intercept is taken as alpha = 0 and the
    slope fitted again through the origin.

    Args:
        tensor_bytes: B of each measurement (at least two distinct sizes).
        seconds: the measured time of each (> 0): the fastest of several repeats is the one
            least disturbed.
        world_size: n (>= 2).

    Returns:
        (alpha in seconds per step, beta in bytes per second).
    """
    if world_size < 2:
        raise ValueError(f"a fit needs at least 2 ranks, got world_size={world_size}")
    if len(tensor_bytes) != len(seconds) or len(set(tensor_bytes)) < 2:
        raise ValueError("give one time per size, for at least two different sizes")
    if min(seconds) <= 0:
        raise ValueError("every time must be positive")
    steps = 2 * (world_size - 1)
    x = np.array([steps / world_size * size for size in tensor_bytes], dtype=float)
    t = np.array(seconds, dtype=float)
    scale = np.ones_like(t)  # IRLS weights on the relative residuals
    intercept, slope = 0.0, 0.0
    for _ in range(100):
        weight = scale / t**2  # least squares of (t - fit) / t, each weighted by `scale`
        design = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(weight)[:, None]
        (intercept, slope), *_ = np.linalg.lstsq(design, t * np.sqrt(weight), rcond=None)
        if intercept < 0:
            intercept, slope = 0.0, float(np.sum(weight * x * t) / np.sum(weight * x * x))
        relative = np.abs(t - intercept - slope * x) / t
        new_scale = 1 / np.maximum(relative, 1e-6)  # |e| = e^2 / |e|: L1 by weighted L2
        if np.allclose(new_scale, scale, rtol=1e-9):
            break
        scale = new_scale
    if slope <= 0:
        raise ValueError("the times do not grow with the size: no bandwidth can be fitted")
    return float(intercept) / steps, 1 / float(slope)


def draw_allreduce_sweep(ax: Axes, results: list[dict], alpha: float, beta: float,
                         world_size: int, label: str) -> None:
    """Plot measured all-reduce times against size, log-log: the fastest of each size's
    repeats (the points the model is fitted to), its median, the middle half of its repeats as
    a bar, and the fitted model with and without its latency. The legend goes below the axes,
    where it can hide no point.

    Args:
        ax: where to draw.
        results: ``distributed_demos.py allreduce``'s results, one per size.
        alpha, beta: the fitted latency (seconds per step) and bandwidth (bytes per second).
        world_size: n.
        label: what was measured, for the legend.
    """
    sizes = np.array([r["bytes"] for r in results], dtype=float)
    fastest = np.array([r["seconds_min"] for r in results])
    median = np.array([r["seconds_median"] for r in results])
    ax.vlines(sizes, [r["seconds_q1"] for r in results], [r["seconds_q3"] for r in results],
              color="#56B4E9", linewidth=6, alpha=0.6, label="middle half of the repeats")
    ax.plot(sizes, median, "o", markersize=8, markerfacecolor="white", color="#0072B2",
            label="median")
    ax.plot(sizes, fastest, "o", markersize=7, color="#0072B2", label=f"{label}: fastest")
    grid = np.geomspace(sizes.min(), sizes.max(), 100)
    steps = 2 * (world_size - 1)
    ax.plot(grid, steps * alpha + steps / world_size * grid / beta, color="#D55E00",
            linewidth=2.5, label=f"fitted: alpha {alpha * 1e6:,.0f} us, beta "
            f"{beta / 1e9:.2f} GB/s")
    ax.plot(grid, steps / world_size * grid / beta, "--", color="#D55E00", linewidth=1.5,
            label="bandwidth alone (alpha = 0)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # the bandwidth-only line runs far below the data at small sizes: show the data's decades
    ax.set_ylim(fastest.min() / 4, 2 * max(r["seconds_q3"] for r in results))
    ax.set_xlabel("tensor bytes B (log scale)")
    ax.set_ylabel("seconds per all-reduce (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=11,
              frameon=False)


def draw_ring(n_ranks: int) -> Figure:
    """The ring all-reduce of ``n_ranks`` ranks, one panel per step: each square is one rank's
    copy of one chunk, coloured and labelled by how many ranks' data it holds. The title stays
    within the panels' width."""
    import matplotlib.pyplot as plt

    counts = ring_contributions(n_ranks)
    fig, axes = plt.subplots(1, len(counts), figsize=(8.4, 2.9), sharey=True)
    for step, (ax, grid) in enumerate(zip(axes, counts, strict=True)):
        ax.imshow(np.array(grid), cmap="viridis", vmin=1, vmax=n_ranks)
        for rank in range(n_ranks):
            for chunk in range(n_ranks):
                ax.text(chunk, rank, grid[rank][chunk], ha="center", va="center", fontsize=11,
                        color="white" if grid[rank][chunk] < 0.75 * n_ranks else "black")
        phase = ("start" if step == 0 else f"RS {step}" if step < n_ranks
                 else f"AG {step - n_ranks + 1}")
        ax.set_title(phase, fontsize=12)
        ax.set_xticks(range(n_ranks))
        ax.set_yticks(range(n_ranks))
        ax.set_xlabel("chunk", fontsize=11)
    axes[0].set_ylabel("rank")
    fig.suptitle(f"Ring all-reduce, {n_ranks} ranks: ranks' data in each chunk\n"
                 "RS: reduce-scatter step, AG: all-gather step", fontsize=12)
    fig.tight_layout()
    return fig


def ring_schedule(n_ranks: int) -> list[list[tuple[int, int, int]]]:
    """Who sends which chunk in each step of a ring all-reduce of ``n_ranks`` ranks.

    Steps 0 .. n-2 are the reduce-scatter (rank r sends chunk (r - s) % n, which the next rank
    adds to its own), steps n-1 .. 2n-3 the all-gather (rank r sends chunk (r + 1 - s) % n,
    complete, which the next rank keeps), s counting from 0 in each phase.

    Returns:
        For each step, a list of (sender, receiver, chunk), one per rank.
    """
    n = n_ranks
    reduce_scatter = [[(r, (r + 1) % n, (r - s) % n) for r in range(n)] for s in range(n - 1)]
    all_gather = [[(r, (r + 1) % n, (r + 1 - s) % n) for r in range(n)] for s in range(n - 1)]
    return reduce_scatter + all_gather


def ring_contributions(n_ranks: int) -> list[list[list[int]]]:
    """How many ranks' data each rank's copy of each chunk holds, before the first step and
    after each step of ``ring_schedule``: ``counts[step][rank][chunk]``, from 1 everywhere to
    n everywhere."""
    n = n_ranks
    held = [[{r} for _ in range(n)] for r in range(n)]  # held[rank][chunk]: whose data is in it
    counts = [[[len(c) for c in rank] for rank in held]]
    for step, sends in enumerate(ring_schedule(n)):
        outgoing = [(receiver, chunk, set(held[sender][chunk]))
                    for sender, receiver, chunk in sends]
        for receiver, chunk, data in outgoing:
            if step < n - 1:
                held[receiver][chunk] |= data  # reduce: add it to my copy
            else:
                held[receiver][chunk] = data  # gather: take the complete chunk
        counts.append([[len(c) for c in rank] for rank in held])
    return counts


def pipeline_schedule(n_stages: int, n_microbatches: int, schedule: str = "1f1b",
                      backward_slots: int = 2) -> list[tuple[int, str, int, int, int]]:
    """A pipeline's timetable: each stage runs its tasks in the schedule's order, each as soon
    as its input exists and the stage is free.

    A forward pass of a micro-batch takes 1 time slot on a stage and a backward pass
    ``backward_slots`` (2: twice the forward's FLOPs). Micro-batch i's forward on stage j needs
    its forward on stage j - 1; its backward on stage j needs its backward on stage j + 1 (and
    on the last stage its own forward). GPipe runs every forward, then every backward; 1F1B
    (Narayanan et al. 2021) runs p - 1 - j forwards ahead on stage j, then alternates one
    forward and one backward, which holds at most p micro-batches' activations at once.

    Returns:
        (stage, "F" or "B", micro-batch, start, end) for every task, in slots.
    """
    p, m = n_stages, n_microbatches
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    orders = []
    for stage in range(p):
        forward, backward = [("F", i) for i in range(m)], [("B", i) for i in range(m)]
        if schedule == "gpipe":
            orders.append(forward + backward)
            continue
        ahead = min(p - 1 - stage, m)
        order = forward[:ahead]
        for i in range(m - ahead):
            order += [forward[ahead + i], backward[i]]
        orders.append(order + backward[m - ahead:])
    finished: dict[tuple[str, int, int], int] = {}
    free, position, tasks = [0] * p, [0] * p, []
    while any(position[stage] < len(orders[stage]) for stage in range(p)):
        for stage in range(p):
            if position[stage] == len(orders[stage]):
                continue
            kind, i = orders[stage][position[stage]]
            if kind == "F":
                needs = ("F", i, stage - 1) if stage else None
            else:
                needs = ("B", i, stage + 1) if stage < p - 1 else ("F", i, stage)
            if needs is not None and needs not in finished:
                continue
            start = max(free[stage], finished[needs] if needs else 0)
            end = start + (1 if kind == "F" else backward_slots)
            free[stage] = finished[(kind, i, stage)] = end
            position[stage] += 1
            tasks.append((stage, kind, i, start, end))
    return tasks


def largest_fitting(bytes_of: Callable[[int], int], budget: float) -> int:
    """The largest integer N >= 0 with ``bytes_of(N) <= budget``, for a ``bytes_of`` that never
    decreases as N grows (0 when even N = 1 does not fit).

    Doubles an upper bound, then bisects: about 2 log2(N) calls.
    """
    if bytes_of(1) > budget:
        return 0
    low, high = 1, 2
    while bytes_of(high) <= budget:
        low, high = high, 2 * high
        if high > 2**62:
            raise ValueError("the byte count does not grow: no largest N")
    while high - low > 1:  # bytes_of(low) fits, bytes_of(high) does not
        middle = (low + high) // 2
        low, high = (middle, high) if bytes_of(middle) <= budget else (low, middle)
    return low


def idle_share(tasks: list[tuple[int, str, int, int, int]], n_stages: int) -> float:
    """The share of stage-slots in which a stage is idle, over the whole timetable."""
    makespan = max(end for *_, end in tasks)
    busy = sum(end - start for *_, start, end in tasks)
    return 1 - busy / (n_stages * makespan)

