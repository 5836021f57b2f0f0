"""Lesson 07's measurements on several CPU processes: gloo all-reduce times, the optimizer state
``ZeroRedundancyOptimizer`` leaves on each rank, a DDP step with and without gradient sync, and
the bytes DDP and FSDP send in a step of several micro-batches (gradient accumulation).

A notebook cannot hand its own functions to new processes, so the lesson runs this file with
``subprocess`` and reads the one JSON object it prints on stdout::

    python distributed_demos.py allreduce --world-size 2 --sizes 4096,1048576 --repeats 10
    python distributed_demos.py zero --world-size 2 --widths 64,128,16,4
    python distributed_demos.py accumulate --world-size 2 --microbatches 4 --hidden 256

A notebook that measures several times runs ``python distributed_demos.py serve`` once instead
(on Linux): it imports torch and the modules the demos need once, then reads one request a line
on stdin, ``{"argv": [...], "folder": "..."}``, forks a child that runs that command line as
above, its stdout and stderr in files of those names in the folder, in a process group of its
own, and answers ``started PID`` then ``exited STATUS``. Each measurement then starts in a
tenth of a second rather than seconds. The server ends with the process that started it.

Each rank is a process running one thread, so the ranks do not fight over the cores. The ranks
meet through a file in a temporary folder rather than a TCP port, so runs side by side never
collide (gloo then connects them over sockets on ports the system picks). When a rank fails, the
others are stopped, the error goes to stderr and the exit status is 1; bad options exit with 2.
Every rank dies with the script, however the script dies (on Linux); SIGTERM or Ctrl-C stops
the ranks and exits. On Linux the script itself gets SIGTERM when the process that started it
dies (a notebook's kernel restarted, say), so that nothing outlives the notebook.

Backend: with ``--backend auto`` (the default) the ranks use NCCL, one GPU each, when the
machine has a CUDA GPU for every rank, and gloo on the CPU otherwise (one GPU is not enough:
NCCL runs one rank per GPU).

On Linux, the all-reduce demo also counts the bytes that cross the loopback interface
(``/proc/net/dev``) while gloo all-reduces: every rank's traffic to the others goes through it,
so the count per rank is what the ring sends, plus TCP/IP headers and gloo's own small
messages, plus whatever else on the machine talks over loopback meanwhile (nothing, in a network
namespace of its own: ``unshare -rn`` or bubblewrap's ``--unshare-net``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import itertools
import json
import math
import os
import select
import signal
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BACKENDS = ("auto", "gloo", "nccl")
# Forking after `import torch` is how DataLoader starts its workers on Linux, and it spares each
# rank a second of importing torch again; elsewhere fork is unsafe, and spawn is the default.
# NCCL's ranks are always spawned: CUDA cannot be used in a process forked from one that has
# asked CUDA anything (as choosing the backend does).
START_METHOD = "fork" if sys.platform == "linux" else "spawn"
MAX_WORLD_SIZE = 8
MAX_TENSOR_BYTES = 256 * 2**20  # each rank holds two float32 buffers of this size
MAX_REPEATS = 1000
MAX_STEPS = 1000
MAX_WIDTH = 4096
WARMUP = 2  # untimed calls before each timing: gloo connects lazily and buffers warm up
SEED = 0
LEARNING_RATE = 1e-2
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a rank left waiting for a dead peer gives up
TRAFFIC_CALLS = 4  # untimed all-reduces of each size whose loopback bytes are counted

Result = dict[str, Any]


def _quartiles(seconds: list[float]) -> tuple[float, float, float]:
    """The first quartile, median and third quartile of some timings (all three equal for one)."""
    if len(seconds) == 1:
        return seconds[0], seconds[0], seconds[0]
    q1, median, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
    return q1, median, q3


def _gather(value: object) -> list[Any] | None:
    """Every rank's ``value`` as a list on rank 0 (None on the other ranks)."""
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def _mlp(widths: list[int]) -> nn.Sequential:
    """A float32 multilayer perceptron ``fc1, relu1, fc2, ...`` through ``widths``, the same
    weights on every rank (seeded)."""
    torch.manual_seed(SEED)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for index, (width_in, width_out) in enumerate(itertools.pairwise(widths), start=1):
        layers[f"fc{index}"] = nn.Linear(width_in, width_out)
        if index < len(widths) - 1:
            layers[f"relu{index}"] = nn.ReLU()
    return nn.Sequential(layers)


def _device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", dist.get_rank())
    return torch.device("cpu")


def _synchronize() -> None:
    """Wait for the GPU's queued work (a timing of CUDA work must end with it)."""
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()


def loopback_bytes() -> int | None:
    """Bytes sent over the loopback interface since boot, in this network namespace (Linux's
    ``/proc/net/dev``); None where there is no such file or no ``lo`` line."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()
    except OSError:
        return None
    for line in lines[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])  # receive has 8 columns, then transmit bytes
    return None


def _rank_pattern(rank: int) -> torch.Tensor:
    """The 16 float32 values that rank ``rank``'s tensor repeats: ``rank``, ..., ``rank + 15``,
    small integers, so that any sum of a few of them, in any order, is exact (well below
    2**24)."""
    return torch.arange(16, dtype=torch.float32) + rank


def _repeated(pattern: torch.Tensor, n_elements: int) -> torch.Tensor:
    """``pattern`` over and over, ``n_elements`` values. Copying a pattern is fast where
    arithmetic on every element is not: the exact sums of 12 MiB tensors, computed elementwise,
    took longer than the all-reduces they check."""
    return pattern.repeat(-(-n_elements // len(pattern)))[:n_elements]


def allreduce_rank(rank: int, world_size: int, sizes: list[int], repeats: int,
                   traffic_calls: int = TRAFFIC_CALLS) -> Result | None:
    """Time ``dist.all_reduce`` of a float32 tensor of each size in bytes, and check its sum.

    Every size is first checked and warmed up (``WARMUP`` untimed calls). The timed calls then
    go round the sizes ``repeats`` times, one call of each size per round, so that a burst of
    other work on the machine slows one call of several sizes rather than every call of one.
    Each timing starts after a barrier, so it holds the collective alone and not a rank waiting
    for a late peer's previous work. Under gloo on Linux, ``traffic_calls`` more all-reduces of
    each size run between two barriers while rank 0 reads the loopback interface's byte count
    before and after (none when 0).

    Args:
        rank, world_size: this rank and the number of ranks.
        sizes: tensor sizes in bytes, multiples of 4.
        repeats: timed calls per size.
        traffic_calls: calls per size whose loopback bytes are counted (0: not counted).

    Returns:
        On rank 0: ``correct`` (every rank's every result equals the exact sum) and ``results``,
        per size its bytes, rank 0's fastest, slowest, quartiles and median seconds, the slowest
        rank's median, and ``loopback_bytes_per_rank``: the loopback bytes of one all-reduce
        divided by the ranks (None under NCCL, without ``/proc/net/dev`` or when not counted).
        None on the other ranks.
    """
    device = _device()
    count_traffic = (traffic_calls > 0 and dist.get_backend() == "gloo"
                     and loopback_bytes() is not None)
    correct = True
    values, buffers = [], []
    for size in sizes:
        n_elements = size // 4
        values.append(_repeated(_rank_pattern(rank), n_elements).to(device))
        buffers.append(values[-1].clone())
        # every rank's values summed, 16 of them, then repeated as each rank's are
        expected = _repeated(sum(_rank_pattern(other) for other in range(world_size)),
                             n_elements)
        dist.all_reduce(buffers[-1])
        correct = correct and torch.equal(buffers[-1].cpu(), expected)
        for _ in range(WARMUP):
            dist.all_reduce(buffers[-1])
    seconds_per_size: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats):
        for index, buffer in enumerate(buffers):
            buffer.copy_(values[index])
            dist.barrier()
            _synchronize()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            _synchronize()
            seconds_per_size[index].append(time.perf_counter() - start)
    traffic: list[float | None] = []
    for buffer in buffers:
        if not count_traffic:
            traffic.append(None)
            continue
        dist.barrier()
        before = loopback_bytes() if rank == 0 else 0
        dist.barrier()
        for _ in range(traffic_calls):
            dist.all_reduce(buffer)
        dist.barrier()
        after = loopback_bytes() if rank == 0 else 0
        traffic.append((after - before) / traffic_calls / world_size)
    gathered = _gather({"correct": correct, "seconds": seconds_per_size})
    if gathered is None:
        return None
    results = []
    for index, size in enumerate(sizes):
        mine = gathered[0]["seconds"][index]
        q1, median, q3 = _quartiles(mine)
        slowest = max(_quartiles(ranks["seconds"][index])[1] for ranks in gathered)
        results.append({"bytes": size, "seconds_min": min(mine), "seconds_q1": q1,
                        "seconds_median": median, "seconds_q3": q3, "seconds_max": max(mine),
                        "seconds_median_slowest_rank": slowest,
                        "loopback_bytes_per_rank": traffic[index]})
    return {"repeats": repeats, "correct": all(ranks["correct"] for ranks in gathered),
            "results": results}


def zero_rank(rank: int, world_size: int, widths: list[int]) -> Result | None:
    """One AdamW step under ``ZeroRedundancyOptimizer``: which parameters each rank owns and the
    bytes of optimizer state it holds.

    ``ZeroRedundancyOptimizer`` hands out whole parameter tensors, largest first, each to the
    rank with the fewest elements so far; it never splits a tensor, so the shards are only
    roughly equal. Every rank sees the same batch, so the gradients agree without an all-reduce
    (in training, DDP would average them first).

    Args:
        rank, world_size: this rank and the number of ranks.
        widths: the layer widths of the model (see ``_mlp``).

    Returns:
        On rank 0: the model's parameters (name, shape, elements, owning rank), per rank the
        elements it owns and its state's bytes (``exp_avg`` and ``exp_avg_sq`` apart from the
        scalar ``step`` tensors), ``n_params``, ``even_split_elements`` = ceil(n_params / n),
        and the largest difference between the weights after the step and those after a plain
        ``torch.optim.AdamW`` step in one process. None on the other ranks.
    """
    # Imported here, not at the top: it pulls in FSDP and sympy, a second the other demos skip.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = _mlp(widths)
    reference = _mlp(widths)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                        lr=LEARNING_RATE)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(8, widths[0], generator=generator)
    targets = torch.randn(8, widths[-1], generator=generator)
    for network, step in ((model, optimizer), (reference, reference_optimizer)):
        nn.functional.mse_loss(network(inputs), targets).backward()
        step.step()
    difference = max((ours - theirs).abs().max().item()
                     for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True))
    names = {parameter: name for name, parameter in model.named_parameters()}
    owned = [parameter for group in optimizer.optim.param_groups for parameter in group["params"]]
    moment_bytes = step_bytes = 0
    for parameter in owned:
        for key, state in optimizer.optim.state[parameter].items():
            if key == "step":
                step_bytes += state.nbytes
            else:
                moment_bytes += state.nbytes
    gathered = _gather({"rank": rank, "parameter_names": [names[p] for p in owned],
                        "elements": sum(p.numel() for p in owned), "moment_bytes": moment_bytes,
                        "step_bytes": step_bytes, "state_bytes": moment_bytes + step_bytes,
                        "max_abs_difference_from_adamw": difference})
    if gathered is None:
        return None
    owner = {name: ranks["rank"] for ranks in gathered for name in ranks["parameter_names"]}
    parameters = [{"name": name, "shape": list(parameter.shape), "elements": parameter.numel(),
                   "rank": owner[name]} for name, parameter in model.named_parameters()]
    n_params = sum(parameter.numel() for parameter in model.parameters())
    return {"optimizer": "AdamW", "widths": widths, "n_params": n_params,
            "even_split_elements": math.ceil(n_params / world_size), "parameters": parameters,
            "ranks": [{key: value for key, value in ranks.items()
                       if key != "max_abs_difference_from_adamw"} for ranks in gathered],
            "max_abs_difference_from_adamw": max(ranks["max_abs_difference_from_adamw"]
                                                 for ranks in gathered)}


# The torch.distributed functions through which FSDP2 all-gathers and reduce-scatters (torch
# 2.13 calls the *_single ones; the others are their older names).
_FSDP_COLLECTIVES = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
                     "reduce_scatter_single": "reduce_scatter",
                     "reduce_scatter_tensor": "reduce_scatter"}


class _CollectiveCounter:
    """While active, counts FSDP's all-gathers and reduce-scatters and the bytes of the whole
    (unsharded) tensor of each, by wrapping the torch.distributed functions FSDP calls (one
    call that another wrapped function makes on its behalf is not counted twice)."""

    def __init__(self) -> None:
        self.calls = {"all_gather": 0, "reduce_scatter": 0}
        self.whole_bytes = {"all_gather": 0, "reduce_scatter": 0}
        self._depth = 0
        self._originals: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> _CollectiveCounter:
        for name, op in _FSDP_COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original

            def counted(*args: Any, _original: Callable[..., Any] = original, _op: str = op,
                        **kwargs: Any) -> Any:
                if self._depth == 0:
                    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                    self.calls[_op] += 1
                    self.whole_bytes[_op] += max(t.nbytes for t in tensors[:2])
                self._depth += 1
                try:
                    return _original(*args, **kwargs)
                finally:
                    self._depth -= 1

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)

    def reset(self) -> None:
        for op in self.calls:
            self.calls[op] = self.whole_bytes[op] = 0


ACCUMULATION_MODES = ("ddp_every", "ddp_no_sync", "fsdp_reshard", "fsdp_keep")


def _accumulation_model(mode: str, widths: list[int]) -> nn.Module:
    """The MLP of ``widths`` wrapped as ``mode`` runs it: DDP, or FSDP2 with each linear layer
    a unit of its own (``fully_shard``), resharding after the forward pass (the default) or
    keeping the gathered weights (``reshard_after_forward=False``)."""
    model = _mlp(widths)
    if mode.startswith("ddp"):
        return DistributedDataParallel(model)
    # Imported here, not at the top: FSDP pulls in a second of imports the other demos skip.
    from torch.distributed.fsdp import fully_shard

    keep = mode == "fsdp_keep"
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=not keep)
    return fully_shard(model, reshard_after_forward=not keep)


def _accumulation_step(mode: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                       batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """One optimizer step over the micro-batches ``batches``, as ``mode`` runs it:

    - ``ddp_every``: DDP all-reduces the gradients after every micro-batch's backward pass;
    - ``ddp_no_sync``: every micro-batch but the last runs under ``no_sync``;
    - ``fsdp_reshard``: FSDP's default: gathers the weights for every forward and backward pass,
      reduce-scatters the gradients after every backward pass;
    - ``fsdp_keep``: gathers once and keeps the weights and whole gradients until the last
      micro-batch (``set_requires_gradient_sync``, ``set_reshard_after_backward``).
    """
    m = len(batches)
    for index, (inputs, targets) in enumerate(batches):
        last = index == m - 1
        if mode == "fsdp_keep":
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
        skip_sync = mode == "ddp_no_sync" and not last
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            (nn.functional.mse_loss(model(inputs), targets) / m).backward()
    optimizer.step()
    optimizer.zero_grad()


def _full_weights(model: nn.Module) -> torch.Tensor:
    """The model's weights as one flat tensor on every rank (FSDP's shards gathered)."""
    parameters = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().flatten() for p in parameters])


def accumulate_rank(rank: int, world_size: int, microbatches: int, steps: int, hidden: int,
                    batch_size: int) -> Result | None:
    """Gradient accumulation under DDP and FSDP: the bytes a step of ``microbatches``
    micro-batches sends, and its time, in each of ``ACCUMULATION_MODES``.

    Four copies of one float32 MLP (hidden -> 4 hidden -> hidden, the same weights) train on the
    same micro-batches (each rank its own), one per mode. Each mode first runs one untimed step;
    rank 0 counts the loopback bytes of the next one (under gloo on Linux), and FSDP's
    all-gathers and reduce-scatters in it; then the modes take turns, one timed step each, for
    ``steps`` rounds. At the end the four copies' weights must agree: accumulating one way or
    another changes the bytes, not the sum.

    Returns:
        On rank 0: ``n_params``, ``parameter_bytes`` (float32), and per mode the loopback bytes
        per rank of one step (None where not counted), FSDP's collective calls and the bytes of
        their whole tensors in one step, rank 0's fastest and median seconds per step and the
        slowest rank's median; ``max_abs_difference`` between the modes' weights at the end.
        None on the other ranks.
    """
    widths = [hidden, 4 * hidden, hidden]
    generator = torch.Generator().manual_seed(SEED + 1 + rank)  # each rank its own batches
    batches = [(torch.randn(batch_size, hidden, generator=generator),
                torch.randn(batch_size, hidden, generator=generator))
               for _ in range(microbatches)]
    models = {mode: _accumulation_model(mode, widths) for mode in ACCUMULATION_MODES}
    optimizers = {mode: torch.optim.SGD(models[mode].parameters(), lr=LEARNING_RATE)
                  for mode in ACCUMULATION_MODES}
    count_traffic = loopback_bytes() is not None
    counted: dict[str, Any] = {}
    with _CollectiveCounter() as counter:
        for mode in ACCUMULATION_MODES:
            _accumulation_step(mode, models[mode], optimizers[mode], batches)  # warm up
            counter.reset()
            dist.barrier()
            before = loopback_bytes() if rank == 0 and count_traffic else 0
            dist.barrier()
            _accumulation_step(mode, models[mode], optimizers[mode], batches)
            dist.barrier()
            after = loopback_bytes() if rank == 0 and count_traffic else 0
            counted[mode] = {
                "loopback_bytes_per_rank": (after - before) / world_size if count_traffic
                else None,
                "calls": dict(counter.calls), "whole_bytes": dict(counter.whole_bytes)}
    seconds: dict[str, list[float]] = {mode: [] for mode in ACCUMULATION_MODES}
    for _ in range(steps):
        for mode in ACCUMULATION_MODES:
            dist.barrier()
            start = time.perf_counter()
            _accumulation_step(mode, models[mode], optimizers[mode], batches)
            seconds[mode].append(time.perf_counter() - start)
    weights = {mode: _full_weights(models[mode]) for mode in ACCUMULATION_MODES}
    reference = weights[ACCUMULATION_MODES[0]]
    difference = max((w - reference).abs().max().item() for w in weights.values())
    gathered = _gather(seconds)
    if gathered is None:
        return None
    modes = {}
    for mode in ACCUMULATION_MODES:
        _, median, _ = _quartiles(seconds[mode])
        modes[mode] = {**counted[mode], "seconds_min": min(seconds[mode]),
                       "seconds_median": median,
                       "seconds_median_slowest_rank": max(_quartiles(ranks[mode])[1]
                                                          for ranks in gathered)}
    n_params = sum(p.numel() for p in _mlp(widths).parameters())
    return {"microbatches": microbatches, "steps": steps, "hidden": hidden,
            "batch_size": batch_size, "n_params": n_params, "parameter_bytes": 4 * n_params,
            "modes": modes, "max_abs_difference": difference}


PREIMPORTS = {"zero": ("torch._dynamo", "torch.distributed.optim"),
              "accumulate": ("torch._dynamo", "torch.distributed.fsdp")}
# The server imports these too, once, while it waits for requests (see serve).
SERVER_IMPORTS = tuple(dict.fromkeys(m for modules in PREIMPORTS.values() for m in modules))
DEMOS: dict[str, Callable[..., Result | None]] = {
    "allreduce": allreduce_rank, "zero": zero_rank, "accumulate": accumulate_rank}


def _die_with_parent(parent_pid: int, how: signal.Signals = signal.SIGKILL) -> None:
    """Have Linux send this process ``how`` when its parent dies, however the parent dies.

    A rank gets SIGKILL when the script dies: a script killed outright cannot stop its ranks,
    and a rank left waiting in a collective for a dead peer would hang until
    ``COLLECTIVE_TIMEOUT``. The script gets SIGTERM when the process that started it dies, and
    stops its ranks on the way out. Elsewhere than Linux the script stops its ranks whenever
    it ends by an exception, and nothing more is done.
    """
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1  # from <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, how)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _run_rank(rank: int, command: str, options: dict[str, Any], world_size: int, folder: str,
              parent_pid: int, backend: str) -> None:
    """One rank's process: join the group through the file store, run the demo, and on rank 0
    write the result to ``folder/result.json``."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked rank inherits main's handler
    # Ctrl-C in a terminal reaches every process of the group: the script stops the ranks,
    # which need not each print a traceback of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # held by the script while it forked (_stops_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=rank,
                            world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    try:
        result = DEMOS[command](rank, world_size, **options)
        if result is not None:
            Path(folder, "result.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


# The signals that stop the script: Ctrl-C (KeyboardInterrupt) and SIGTERM (_exit_on_sigterm).
STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """Hold back ``STOPS`` while the ranks are forked, and take them on the way out.

    A KeyboardInterrupt raised while Python runs its after-fork hooks in the parent is printed
    and dropped ("Exception ignored in ... _releaseLock"): a Ctrl-C at that moment would be
    lost and the demo would run on. Held, it comes once the ranks exist, where ``launch``
    stops them. The ranks inherit the mask and release it themselves (``_run_rank``).
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks, and no fork either
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _stop(processes: list[Any]) -> None:
    """Kill the ranks still running and wait for them.

    SIGKILL rather than SIGTERM: a rank keeps nothing to tidy (its folder is the script's), and
    a SIGTERM that reaches a rank just forked, before Python has set itself up again in the
    child, is dropped with Python's pending signals (the rank then waits in its group's
    rendezvous for a peer that never comes).
    """
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join()


def choose_backend(requested: str, world_size: int) -> str:
    """The backend to run: ``requested``, or for "auto" NCCL when there is a CUDA GPU for every
    rank and gloo otherwise. ValueError for "nccl" without enough GPUs."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if requested == "nccl" and gpus < world_size:
        raise ValueError(f"--backend nccl needs a CUDA GPU per rank: {world_size} ranks, "
                         f"{gpus} GPU(s); use gloo")
    return requested


def start_method(backend: str) -> str:
    """How the ranks are started: spawned for NCCL, else ``START_METHOD``."""
    return "spawn" if backend == "nccl" else START_METHOD


def launch(command: str, options: dict[str, Any], world_size: int,
           backend: str = "gloo") -> Result:
    """Run demo ``command`` on ``world_size`` ranks and return rank 0's result.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (the others are stopped).
        torch.multiprocessing.ProcessExitedException: a rank died (the others are stopped).
    """
    others = set(mp.active_children())
    with tempfile.TemporaryDirectory(prefix="distributed_demos_") as folder:
        try:
            with _stops_held():
                context = mp.start_processes(
                    _run_rank, args=(command, options, world_size, folder, os.getpid(), backend),
                    nprocs=world_size, join=False, start_method=start_method(backend))
            while not context.join():
                pass
        finally:
            # Every rank started, read from multiprocessing's own list: a Ctrl-C while the
            # ranks are being started leaves no context, and a rank left running would be
            # waited for at exit (they are not daemons) until it had run its whole demo.
            _stop([process for process in mp.active_children() if process not in others])
        return json.loads(Path(folder, "result.json").read_text())


def _integers(option: str, text: str, minimum: int, maximum: int, at_least: int = 1) -> list[int]:
    """The comma-separated integers of ``text``, each in [minimum, maximum], at least
    ``at_least`` of them; ValueError naming ``option`` otherwise."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if len(items) < at_least:
        raise ValueError(f"{option} needs at least {at_least} comma-separated integer(s), "
                         f"got {text!r}")
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise ValueError(f"{option} must be comma-separated integers, got {text!r}") from None
    for value in values:
        _check_range(option, value, minimum, maximum)
    return values


def _check_range(option: str, value: int, minimum: int, maximum: int) -> int:
    """``value`` if it lies in [minimum, maximum]; ValueError naming ``option`` otherwise."""
    if not minimum <= value <= maximum:
        raise ValueError(f"{option} must be between {minimum} and {maximum}, got {value}")
    return value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The demo's keyword arguments from the parsed command line, checked (ValueError)."""
    if args.command == "allreduce":
        sizes = _integers("--sizes", args.sizes, 4, MAX_TENSOR_BYTES)
        for size in sizes:
            if size % 4:
                raise ValueError(f"--sizes are bytes of float32 tensors, so multiples of 4; "
                                 f"got {size}")
        return {"sizes": sizes,
                "repeats": _check_range("--repeats", args.repeats, 1, MAX_REPEATS),
                "traffic_calls": _check_range("--traffic-calls", args.traffic_calls, 0,
                                              MAX_REPEATS)}
    if args.command == "zero":
        widths = _integers("--widths", args.widths, 1, MAX_WIDTH, at_least=2)
        n_tensors = 2 * (len(widths) - 1)
        if n_tensors < args.world_size:
            raise ValueError(f"--widths {args.widths} gives {n_tensors} parameter tensors, "
                             f"fewer than the {args.world_size} ranks: "
                             "ZeroRedundancyOptimizer needs one on every rank")
        return {"widths": widths}
    return {"microbatches": _check_range("--microbatches", args.microbatches, 1, MAX_STEPS),
            "steps": _check_range("--steps", args.steps, 1, MAX_STEPS),
            "hidden": _check_range("--hidden", args.hidden, 1, MAX_WIDTH),
            "batch_size": _check_range("--batch-size", args.batch_size, 1, MAX_WIDTH)}


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per demo (``parser.commands`` maps each name to its
    own parser, whose usage line an error about its options shows)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    allreduce = commands.add_parser("allreduce", help="time gloo all-reduces of several sizes")
    allreduce.add_argument("--sizes", default="4096,65536,1048576,16777216",
                           help="tensor sizes in bytes, comma-separated (multiples of 4)")
    allreduce.add_argument("--repeats", type=int, default=10, help="timings per size")
    allreduce.add_argument("--traffic-calls", type=int, default=TRAFFIC_CALLS,
                           help="all-reduces per size whose loopback bytes are counted (0: none)")
    zero = commands.add_parser("zero", help="ZeroRedundancyOptimizer's AdamW state per rank")
    zero.add_argument("--widths", default="64,128,16,4",
                      help="the model's layer widths, comma-separated")
    accumulate = commands.add_parser(
        "accumulate", help="DDP and FSDP over several micro-batches per step: bytes and time")
    accumulate.add_argument("--microbatches", type=int, default=4,
                            help="micro-batches per optimizer step")
    accumulate.add_argument("--steps", type=int, default=5, help="timed steps of each mode")
    accumulate.add_argument("--hidden", type=int, default=256, help="model width")
    accumulate.add_argument("--batch-size", type=int, default=16,
                            help="examples per rank per micro-batch")
    for command in (allreduce, zero, accumulate):
        command.add_argument("--world-size", type=int, default=2,
                             help=f"number of processes (1 to {MAX_WORLD_SIZE})")
        command.add_argument("--backend", choices=BACKENDS, default="auto",
                             help="auto: NCCL with a GPU per rank, else gloo on the CPU")
    serve = commands.add_parser(
        "serve", help="import torch once, then fork one measurement per request on stdin "
        "(Linux; see the top of this file)")
    parser.commands = {"allreduce": allreduce, "zero": zero, "accumulate": accumulate,
                       "serve": serve}
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit, so that ``launch`` stops the ranks on the way out."""
    raise SystemExit(128 + signum)


def _measure(request: dict[str, Any]) -> None:
    """In a child that ``serve`` forked: run one command line as ``main`` runs it, in a process
    group of its own (with its ranks), its stdout and stderr in files of those names in the request's folder,
    then exit with ``main``'s status (never returns)."""
    status = 1
    try:
        os.setpgid(0, 0)  # the client stops the measurement and its ranks by this group
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)  # the requests are the server's to read
        os.dup2(null, 0)
        os.close(null)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(Path(request["folder"], name),
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        argv = [str(argument) for argument in request["argv"]]
        if argv[:1] == ["serve"]:
            print(f"{Path(__file__).name}: a measurement cannot be a server", file=sys.stderr)
            status = 2
        else:
            status = main(argv)
    except SystemExit as stop:  # argparse's exit 2, or SIGTERM before launch began
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # reported as an uncaught error is, with exit status 1
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


class _Requests:
    """The request lines on stdin, read unbuffered, so that ``waiting`` can tell whether one
    has come without blocking."""

    def __init__(self) -> None:
        self._buffer = b""

    def waiting(self) -> bool:
        return b"\n" in self._buffer or bool(select.select([0], [], [], 0)[0])

    def next(self) -> dict[str, Any] | None:
        """The next request, None once stdin has closed."""
        while b"\n" not in self._buffer:
            chunk = os.read(0, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def serve() -> int:
    """Run measurements for the process that started this one (a notebook's kernel): for each
    request line on stdin fork a child that runs it (``_measure``), answer ``started PID``,
    wait for it and answer ``exited STATUS`` (negative: killed by that signal). Ends when stdin
    closes, on SIGTERM, or when its parent dies, and stops a measurement still running as it
    goes (the measurement stops its ranks).

    torch is imported at once; the modules only some demos need (``SERVER_IMPORTS``, seconds
    more) while no request waits, and before forking a demo that needs them. Nothing is
    imported while a measurement runs: its timings have the cores to themselves."""
    if START_METHOD != "fork":
        print(f"{Path(__file__).name} serve: needs fork (Linux)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stray Ctrl-C is for the measurement
    _die_with_parent(os.getppid(), signal.SIGTERM)
    requests, later, child = _Requests(), list(SERVER_IMPORTS), 0
    try:
        while True:
            while later and not requests.waiting():
                importlib.import_module(later.pop(0))
            request = requests.next()
            if request is None:
                return 0
            for module in PREIMPORTS.get(str(request["argv"][0]) if request["argv"] else "", ()):
                importlib.import_module(module)
            sys.stdout.flush()
            sys.stderr.flush()
            child = os.fork()
            if child == 0:
                _measure(request)
            # as the child does: whichever runs first, the group exists before it is named
            with contextlib.suppress(OSError):
                os.setpgid(child, child)
            print(f"started {child}", flush=True)
            _, status = os.waitpid(child, 0)
            child = 0
            print(f"exited {os.waitstatus_to_exitcode(status)}", flush=True)
    finally:
        if child:  # it has SIGTERM too when this process dies; say it now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the demo and print its result as one JSON object.

    Returns:
        0 on success, 1 when a rank failed, 130 when interrupted (Ctrl-C); bad options exit
        with 2 through argparse.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve()
    try:
        _check_range("--world-size", args.world_size, 1, MAX_WORLD_SIZE)
        options = _options(args)
        # The zero demo counts CPU tensors' bytes and the accumulate demo loopback bytes: they
        # run on gloo only.
        if args.command in ("zero", "accumulate") and args.backend == "nccl":
            raise ValueError(f"the {args.command} demo counts bytes on the CPU: it runs on "
                             "gloo only (leave out --backend, or give gloo)")
        backend = ("gloo" if args.command in ("zero", "accumulate")
                   else choose_backend(args.backend, args.world_size))
    except ValueError as error:
        parser.commands[args.command].error(str(error))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _die_with_parent(os.getppid(), signal.SIGTERM)
    start = time.perf_counter()
    try:
        if start_method(backend) == "fork":
            # Seconds of imports that every rank of these demos needs, done once here rather
            # than once in every forked rank: ZeroRedundancyOptimizer's module pulls in FSDP, an
            # optimizer's first step torch._dynamo, and so does DDP's constructor.
            for module in PREIMPORTS.get(args.command, ()):
                importlib.import_module(module)
        result = launch(args.command, options, args.world_size, backend)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        print(f"{Path(__file__).name} {args.command}: rank {error.error_index} of "
              f"{args.world_size} failed, the other ranks were stopped: {error}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the ranks (if any had started) were stopped leaving launch
        print(f"{Path(__file__).name} {args.command}: interrupted; no rank is left running",
              file=sys.stderr)
        return 130
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    header = {"command": args.command, "world_size": args.world_size, "backend": backend,
              "cuda_gpus": gpus, "cpu_count": os.cpu_count(),
              "torch_version": torch.__version__, "start_method": start_method(backend),
              "threads_per_rank": 1, "seconds_total": time.perf_counter() - start}
    print(json.dumps({**header, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
