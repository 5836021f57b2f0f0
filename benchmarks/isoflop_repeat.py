"""Measure lesson 10's IsoFLOP profiles under several seeds, thread counts and dtypes, and say
whether each run keeps the shape the lesson relies on; then time the CPU AdamW step.

    python benchmarks/isoflop_repeat.py [--seeds 10] [--threads 1 2] [--fp64]

Each line is one call of ``isoflop_profiles`` with the lesson's budgets and shapes: its seconds,
each profile's N_opt (``isoflop_minimum``), the exponent of N_opt against C, the smallest rise
of a profile's nearer end above its lowest loss, and "ok" when every profile's lowest loss is
at an inner size, every N_opt lies inside the sizes and N_opt grows with the budget. A seed, a
thread count or fp64 (``torch.set_default_dtype``) changes the rounding or the draws, as another
CPU, BLAS or torch version would. Last, ``cpu_adamw_params_per_second`` with torch's default
AdamW on a CPU and with ``fused=True``, three times each.

A script for checking the lesson, not a test: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import torch

from solutions.budget import isoflop_minimum
from solutions.budget_demos import (
    cpu_adamw_params_per_second,
    isoflop_profiles,
    n_opt_exponent,
)

TOKENS = np.memmap(Path(__file__).resolve().parent.parent / "data" / "tiny_tokens.bin",
                   dtype=np.uint16, mode="r")


def describe(result: dict) -> tuple[bool, str]:
    """Whether ``result`` keeps the lesson's shape, and one line of its figures."""
    sizes = result["n_params"]
    n_opts, rises, inside = [], [], True
    for losses in result["losses"]:
        lowest = int(np.argmin(losses))
        rises.append(min(losses[0], losses[-1]) - losses[lowest])
        try:
            n_opts.append(isoflop_minimum(sizes, losses))
        except ValueError:  # a profile with no minimum
            n_opts.append(float("nan"))
        inside &= 0 < lowest < len(losses) - 1 and sizes[0] < n_opts[-1] < sizes[-1]
    ok = inside and all(a < b for a, b in itertools.pairwise(n_opts))
    exponent = n_opt_exponent(result["budgets"], n_opts) if ok else float("nan")
    line = (f"{result['seconds']:5.2f} s  N_opt {', '.join(f'{n:7.0f}' for n in n_opts)}  "
            f"a {exponent:5.2f}  rise {min(rises):.3f}  {'ok' if ok else 'NOT OK'}")
    return ok, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 to N-1 (10)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="torch.set_num_threads values to try (1 2)")
    parser.add_argument("--fp64", action="store_true", help="also in float64")
    parser.add_argument("--adamw-params", type=float, default=1e7,
                        help="parameters of the timed AdamW step (1e7)")
    args = parser.parse_args()
    dtypes = [torch.float32, torch.float64] if args.fp64 else [torch.float32]
    kept = total = 0
    for threads, dtype in itertools.product(args.threads, dtypes):
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        for seed in range(args.seeds):
            ok, line = describe(isoflop_profiles(TOKENS, seed=seed))
            kept, total = kept + ok, total + 1
            print(f"threads {threads}  {str(dtype).removeprefix('torch.'):7}  seed {seed}  {line}",
                  flush=True)
    torch.set_default_dtype(torch.float32)
    print(f"{kept} of {total} runs keep the shape")
    n_params = int(args.adamw_params)
    for fused in (None, True):
        rates = [cpu_adamw_params_per_second(n_params, fused=fused) for _ in range(3)]
        print(f"AdamW, {n_params:.0e} parameters, fused={fused}: "
              f"{', '.join(f'{r / 1e6:.0f}' for r in rates)} million parameters/s")


if __name__ == "__main__":
    main()
