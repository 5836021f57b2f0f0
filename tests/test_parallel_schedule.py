"""Lesson 07's count of the data-parallel traffic that hides (``parallel_plan``'s
``exposed_seconds``, ``hidden`` and ``min_tokens_to_hide``) against an event simulation of
steady training steps on one GPU.

The simulation knows no formula. It runs one GPU's compute layer by layer and one link that
carries the collectives, each cut into one bucket per layer, in the order they become ready, and
it encodes only what waits for what in each framework:

- DDP (ZeRO-0): the last micro-batch's backward pass all-reduces each layer's bucket as soon as
  its gradients exist; the backward pass ends when every bucket is reduced.
- ZeRO-1/2: a micro-batch that reduces (every one under ZeRO-2, the last one otherwise)
  reduce-scatters each layer's bucket as soon as it exists and ends when all are done; the
  optimizer step follows and then all-gathers the updated weights. As DeepSpeed's ZeRO-1/2 run
  it (``stage_1_and_2.py``'s ``step()``, DeepSpeed 0.19.6) the next forward pass waits for the
  whole all-gather; with Megatron-LM's ``overlap_param_gather`` (Megatron Core 0.20) each layer
  of the next step's first forward pass waits for its own bucket only.
- ZeRO-3 as FSDP runs it: every forward pass waits for each layer's gathered weights, gathered
  from the moment the micro-batch may start; every backward pass gathers them again, from the
  end of the forward pass, and reduce-scatters each layer's gradients; keeping weights and
  gradients whole, only the step's first forward pass gathers and only its last backward pass
  reduce-scatters.

A step is measured from one optimizer step to the next, in the steady state; what it takes
beyond its compute is the exposed traffic.
"""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solutions.backprop import model_params
from solutions.parallel_plan import parallel_plan
from tests.test_parallel_explorer import GPU_BYTES, LLAMA, NODE, PEAK


class Timeline:
    """One GPU's compute stream, its operations in program order, and one link whose
    collectives run one at a time in the order they become ready (ties in the order they were
    issued)."""

    def __init__(self) -> None:
        self.compute: list[tuple[float, list[int], list[int]]] = []  # seconds, waits, issues
        self.link: list[float] = []

    def run(self, seconds: float, waits: list[int] = ()) -> int:
        """A compute operation that starts once the collectives ``waits`` are done."""
        self.compute.append((seconds, list(waits), []))
        return len(self.compute) - 1

    def issue(self, after: int, seconds: float) -> int:
        """A collective that becomes ready when compute operation ``after`` ends."""
        self.link.append(seconds)
        self.compute[after][2].append(len(self.link) - 1)
        return len(self.link) - 1

    def play(self) -> list[float]:
        """The end time of every compute operation."""
        ends, finished, ready = [], {}, []
        compute_free = link_free = 0.0
        while len(ends) < len(self.compute) or ready:
            start = math.inf
            if len(ends) < len(self.compute):
                seconds, waits, issues = self.compute[len(ends)]
                if all(w in finished for w in waits):
                    start = max([compute_free] + [finished[w] for w in waits])
            link_start = max(link_free, ready[0][0]) if ready else math.inf
            if link_start <= start and ready:
                _, collective = heapq.heappop(ready)
                finished[collective] = link_free = link_start + self.link[collective]
            else:
                assert start < math.inf, "the schedule waits for a collective never issued"
                compute_free = start + seconds
                ends.append(compute_free)
                for collective in issues:
                    heapq.heappush(ready, (compute_free, collective))
        return ends


def simulated_exposed(stage: int, micro: int, keep: bool, overlap_param_gather: bool,
                      reduce_scatter: float, all_gather: float, forward: float,
                      backward: float, layers: int) -> float:
    """Seconds a steady step lasts beyond its compute: ``micro`` micro-batches whose forward and
    backward passes take ``forward`` and ``backward`` seconds, collectives of the given seconds
    (a whole reduce-scatter of the gradients, a whole all-gather of the weights), everything
    cut into ``layers`` equal layers."""
    t = Timeline()
    f, b = forward / layers, backward / layers
    gathers_after_step: list[int] = []
    marker = t.run(0.0)  # the start; later, each backward pass's end
    step_ends = []
    for _ in range(3):
        for k in range(micro):
            last = k == micro - 1
            if stage == 3 and (not keep or k == 0):  # FSDP gathers for this forward pass
                waits = [[t.issue(marker, all_gather / layers)] for _ in range(layers)]
            elif stage in (1, 2) and k == 0 and gathers_after_step:
                waits = ([[g] for g in gathers_after_step] if overlap_param_gather
                         else [gathers_after_step] + [[]] * (layers - 1))
            else:
                waits = [[]] * layers
            for layer in range(layers):
                end_of_forward = t.run(f, waits[layer])
            again = ([t.issue(end_of_forward, all_gather / layers) for _ in range(layers)]
                     if stage == 3 and not keep else None)
            reduces = last or (stage in (2, 3) and not keep)
            bucket = (2 if stage == 0 else 1) * reduce_scatter / layers
            reductions = []
            for layer in range(layers):
                op = t.run(b, [again[layer]] if again else [])
                if reduces:
                    reductions.append(t.issue(op, bucket))
            marker = t.run(0.0, reductions)  # the backward pass ends when its buckets are sent
        step_ends.append(marker)  # the optimizer step: every gradient reduced
        gathers_after_step = ([t.issue(marker, all_gather / layers) for _ in range(layers)]
                              if stage in (1, 2) else [])
    ends = t.play()
    return ends[step_ends[2]] - ends[step_ends[1]] - micro * (forward + backward)


def one_gpu(dp: int, tp: int, pp: int, micro_tokens: int, mfu: float, checkpointing: bool,
            bytes_per_grad: int) -> tuple[float, float, float, float]:
    """Seconds of the whole reduce-scatter and all-gather of one GPU's flat buffer (the ring:
    (n-1) of n equal shards, at the link's line rate) and of one micro-batch's forward and
    backward pass on its parameters (2 and 4 FLOPs per parameter and token, 6 recomputing)."""
    shard = math.ceil(model_params(LLAMA) / (tp * pp))
    per_rank = math.ceil(shard / dp)
    link = NODE["nvlink_bytes_per_s"] if tp * dp <= 8 else NODE["nic_bytes_per_s"]
    rate = mfu * PEAK
    backward_flops = 6 if checkpointing else 4
    return ((dp - 1) * per_rank * bytes_per_grad / link, (dp - 1) * per_rank * 2 / link,
            2 * shard * micro_tokens / rate, backward_flops * shard * micro_tokens / rate)


def plan(dp=32, tp=8, pp=4, stage=1, micro=64, size=1, seq=8192, mfu=0.4, checkpointing=False,
         **options) -> dict:
    return parallel_plan(LLAMA, dp, tp, pp, stage, micro, size, seq, mfu, checkpointing, PEAK,
                         GPU_BYTES, NODE, **options)


def tolerance(stage: int, micro: int, keep: bool, seconds: tuple, layers: int) -> float:
    """The simulation's error: cut into layers, each overlap of a collective with compute ends
    within one layer's share of either of them of the unbroken count, and a step has at most
    2 m + 1 such overlaps."""
    windows = 2 * micro if stage == 3 and not keep else (micro + 1 if stage == 2 else 2)
    return windows * (2 * seconds[0] + seconds[1] + seconds[2] + seconds[3]) / layers + 1e-12


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3), st.sampled_from([1, 2, 3]), st.booleans(), st.booleans(),
       st.sampled_from([2, 8, 32]), st.sampled_from([1, 8]), st.sampled_from([1, 4]),
       st.sampled_from([1024, 4096, 16384]), st.sampled_from([0.3, 0.6]), st.booleans(),
       st.sampled_from([2, 4]))
def test_the_plans_exposed_traffic_is_the_simulated_steps(stage, micro, keep, overlap, dp, tp,
                                                          pp, seq, mfu, checkpointing, grad):
    layers = 400
    seconds = one_gpu(dp, tp, pp, seq, mfu, checkpointing, grad)
    simulated = simulated_exposed(stage, micro, keep, overlap, *seconds, layers)
    got = plan(dp, tp, pp, stage, micro, 1, seq, mfu, checkpointing, keep_unsharded=keep,
               bytes_per_grad=grad, overlap_param_gather=overlap)
    error = tolerance(stage, micro, keep, seconds, layers)
    assert got["exposed_seconds"] == pytest.approx(simulated, abs=error)
    if simulated > error:
        assert not got["hidden"]
    if got["hidden"]:
        assert simulated <= error


def test_section_7s_example_under_both_schedules() -> None:
    """Llama 3 70B, 32 copies with ZeRO-1 over the network cards, 16 micro-batches of 2048
    tokens: 171 ms of traffic. DeepSpeed's schedule exposes 125 ms (the reduce-scatter's 85 ms
    less the last backward pass's 46 ms, then the whole all-gather); Megatron-LM's
    overlap_param_gather 102 ms (the all-gather less the first forward pass's 23 ms)."""
    layers = 1000
    seconds = one_gpu(32, 8, 4, 2048, 0.4, False, 2)
    assert [round(s * 1e3) for s in seconds] == [85, 85, 23, 46]
    for overlap, shown in ((False, 125), (True, 102)):
        got = plan(micro=16, seq=2048, overlap_param_gather=overlap)
        simulated = simulated_exposed(1, 2, False, overlap, *seconds, layers)
        assert round(got["exposed_seconds"] * 1e3) == shown
        assert got["exposed_seconds"] == pytest.approx(
            simulated, abs=tolerance(1, 2, False, seconds, layers))
        # more micro-batches change nothing
        assert plan(micro=64, seq=2048, overlap_param_gather=overlap)["exposed_seconds"] \
            == got["exposed_seconds"]


@pytest.mark.parametrize("grad", [2, 4])
def test_zero_1_hides_from_7668_tokens_under_megatrons_schedule_and_never_under_deepspeeds(
        grad) -> None:
    """The explorer's first layout (8192 tokens per micro-batch), bf16 or fp32 gradients: the
    all-gather of the updated weights, 85 ms, needs a first forward pass of 7,668 tokens or
    more to hide behind; the fp32 reduce-scatter, 171 ms, a last backward pass of as many. Under
    DeepSpeed's schedule nothing overlaps the all-gather, and its 85 ms stay in every step."""
    layers = 1000
    threshold = plan(overlap_param_gather=True, bytes_per_grad=grad)["min_tokens_to_hide"]
    assert round(threshold) == 7668
    assert plan(bytes_per_grad=grad)["min_tokens_to_hide"] == math.inf
    for tokens in (round(0.95 * threshold), 8192, round(1.05 * threshold), 4 * 8192):
        seconds = one_gpu(32, 8, 4, tokens, 0.4, False, grad)
        error = tolerance(1, 1, False, seconds, layers)
        megatron = simulated_exposed(1, 1, False, True, *seconds, layers)
        deepspeed = simulated_exposed(1, 1, False, False, *seconds, layers)
        assert (megatron > error) == (tokens < threshold)
        assert plan(seq=tokens, overlap_param_gather=True, bytes_per_grad=grad)["hidden"] \
            == (tokens >= threshold)
        assert deepspeed >= seconds[1] - error
        assert plan(seq=tokens, bytes_per_grad=grad)["exposed_seconds"] == pytest.approx(
            deepspeed, abs=error)
        assert not plan(seq=tokens, bytes_per_grad=grad)["hidden"]
    assert round(one_gpu(32, 8, 4, 8192, 0.4, False, 4)[0] * 1e3) == 171
