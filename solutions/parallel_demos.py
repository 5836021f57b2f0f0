"""Lesson 07's given code: the measurements' plumbing and the pictures' schedules.

Nothing here is graded. ``run_demo`` starts the lesson's helper script, ``distributed_demos.py``,
on several processes and reads its result; ``fit_alpha_beta`` fits the alpha-beta model to
measured all-reduce times; ``ring_schedule`` and ``pipeline_schedule`` list who does what when,
for the pictures of the ring and of a pipeline; ``largest_fitting`` finds the largest integer
that a monotone byte count lets fit in a budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def run_demo(command: str, world_size: int, options: dict[str, object] | None = None,
             script: Path = Path("distributed_demos.py"), timeout: float = 120.0) -> dict:
    """Run ``python distributed_demos.py COMMAND --world-size N --OPTION VALUE ...`` and return
    the JSON object it prints.

    The script starts the ranks, each a process of its own, and every rank dies with it; on a
    timeout ``subprocess.run`` kills the script, and so the ranks. Options are written as
    ``--name value``, underscores as dashes; a list is joined with commas.

    Raises:
        RuntimeError: the script failed or ran past ``timeout``, with its last lines of stderr.
    """
    arguments = [sys.executable, str(script), command, "--world-size", str(world_size)]
    for name, value in (options or {}).items():
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        arguments += [f"--{name.replace('_', '-')}", text]
    try:
        done = subprocess.run(arguments, capture_output=True, text=True, timeout=timeout,
                              cwd=script.parent if script.parent != Path() else None)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{script.name} {command} ran past {timeout:g} s and was "
                           "stopped") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{script.name} {command} failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout)


def fit_alpha_beta(tensor_bytes: Sequence[float], seconds: Sequence[float],
                   world_size: int) -> tuple[float, float]:
    """Fit t = 2 (n-1) alpha + 2 (n-1)/n B / beta to measured all-reduce times.

    A weighted least-squares line t = a + c x through the points (x = 2 (n-1)/n B, t), each
    weighted by 1/t so that every size counts by its relative error (the times span several
    decades); then alpha = a / (2 (n-1)) and beta = 1 / c. A negative intercept (noise at the
    small sizes) is taken as alpha = 0 and the slope fitted again through the origin.

    Args:
        tensor_bytes: B of each measurement (at least two distinct sizes).
        seconds: the measured time of each (> 0).
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
    xs = [steps / world_size * size for size in tensor_bytes]
    weights = [1 / t**2 for t in seconds]  # squared weights of the residuals (t - fit) / t
    sw = sum(weights)
    swx = sum(w * x for w, x in zip(weights, xs, strict=True))
    swy = sum(w * t for w, t in zip(weights, seconds, strict=True))
    swxx = sum(w * x * x for w, x in zip(weights, xs, strict=True))
    swxy = sum(w * x * t for w, x, t in zip(weights, xs, seconds, strict=True))
    slope = (sw * swxy - swx * swy) / (sw * swxx - swx**2)
    intercept = (swy - slope * swx) / sw
    if intercept < 0:
        intercept, slope = 0.0, swxy / swxx
    if slope <= 0:
        raise ValueError("the times do not grow with the size: no bandwidth can be fitted")
    return intercept / steps, 1 / slope


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

