"""Lesson 07's counts (solutions/parallel.py) against independent oracles: NCCL-tests' bus
bandwidth factors, a real sum for the simulated ring, the ZeRO paper's figure 1 and section 7,
a step of micro-batches simulated collective by collective (and schedules worked by hand), a
simulated pipeline schedule for the bubble (Narayanan et al. 2021), and a tensor-parallel block
simulated rank by rank, whose all-reduces are counted (Shoeybi et al. 2019). What FSDP and DDP
really send over micro-batches is checked on real processes in tests/test_parallel_demos.py."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from grader.content.cases.parallel import VARIANTS
from solutions.parallel import (
    COLLECTIVES,
    accumulation_comm_bytes,
    allreduce_seconds,
    collective_bytes,
    min_tokens_to_hide_allreduce,
    pipeline_bubble_fraction,
    ring_all_reduce,
    tensor_parallel_bytes,
    zero_bytes_per_device,
    zero_comm_bytes,
)
from solutions.parallel_demos import pipeline_schedule
from tests.grading_helpers import arguments_of, judged_with, with_edits

DATA = Path(__file__).resolve().parent.parent / "data"
H100 = json.loads((DATA / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((DATA / "interconnects.json").read_text())["H100 SXM node"]

# NCCL-tests (doc/PERFORMANCE.md): bus bandwidth = algorithm bandwidth (B / t) times these
# factors, which make a collective's bus bandwidth the bandwidth each rank's link carries.
NCCL_TESTS_BUS_FACTOR = {"all_reduce": lambda n: Fraction(2 * (n - 1), n),
                         "reduce_scatter": lambda n: Fraction(n - 1, n),
                         "all_gather": lambda n: Fraction(n - 1, n),
                         "all_to_all": lambda n: Fraction(n - 1, n)}


@given(st.sampled_from(COLLECTIVES), st.integers(1, 64), st.integers(0, 10**12))
def test_bytes_per_rank_are_nccl_tests_bus_factor_times_the_tensor(op, n, shard) -> None:
    tensor_bytes = shard * n
    sent = collective_bytes(op, tensor_bytes, n)
    assert isinstance(sent, int) and sent == NCCL_TESTS_BUS_FACTOR[op](n) * tensor_bytes
    assert collective_bytes(op, tensor_bytes, 1) == 0


@pytest.mark.parametrize(("args", "words"), [
    (("all_reduce", 10, 3), "does not split into 3 equal shards"),
    (("broadcast", 12, 3), "unknown collective 'broadcast'"),
    (("all_gather", -4, 2), "tensor_bytes must be >= 0"),
    (("all_gather", 4, 0), "world_size must be >= 1"),
    (("all_gather", 4.0, 2), "tensor_bytes must be an integer"),
    (("all_gather", 4, True), "world_size must be an integer"),
])
def test_collective_bytes_names_what_is_wrong(args, words) -> None:
    with pytest.raises(TypeError if "integer" in words else ValueError, match=words):
        collective_bytes(*args)


@given(st.integers(1, 8), st.integers(0, 5), st.integers(0, 2**31))
def test_the_ring_gives_every_rank_the_exact_sum_and_sends_what_collective_bytes_says(
        n, chunk, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    # Integers below 2**20 in float32: every partial sum is exact, in any order.
    shards = [torch.randint(-2**20, 2**20, (n * chunk,), generator=generator).float()
              for _ in range(n)]
    before = [t.clone() for t in shards]
    results, sent = ring_all_reduce(shards)
    expected = torch.stack(shards).sum(0) if n * chunk else torch.zeros(0)
    assert len(results) == n and all(torch.equal(r, expected) for r in results)
    assert all(torch.equal(a, b) for a, b in zip(shards, before, strict=True))  # inputs intact
    if chunk:  # new tensors, not the inputs
        assert all(r.data_ptr() != t.data_ptr() for r, t in zip(results, shards, strict=True))
    assert sent == collective_bytes("all_reduce", shards[0].nbytes, n)


@given(st.integers(2, 8), st.integers(1, 64), st.integers(0, 2**31))
def test_the_ring_sum_of_floats_is_one_set_of_bits_close_to_sum(n, chunk, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    shards = [torch.randn(n * chunk, generator=generator) for _ in range(n)]
    results, _ = ring_all_reduce(shards)
    assert all(torch.equal(r, results[0]) for r in results)  # summed once, then copied
    exact = torch.stack(shards).double().sum(0)
    # n - 1 float32 additions in some order: each rounds by at most 2**-24 of the running sum,
    # whose magnitude is at most the sum of the magnitudes.
    bound = (n - 1) * 2**-24 * torch.stack(shards).double().abs().sum(0)
    assert bool(((results[0].double() - exact).abs() <= bound).all())


@pytest.mark.parametrize(("shards", "words"), [
    ([], "non-empty list"),
    ([torch.zeros(4), torch.zeros(6)], "same length"),
    ([torch.zeros(4), torch.zeros(4, dtype=torch.float64)], "same length, dtype"),
    ([torch.zeros(2), torch.zeros(2, device="meta")], "same length, dtype and device"),
    ([torch.zeros(2, 2), torch.zeros(2, 2)], "must be 1-D"),
    ([torch.zeros(5), torch.zeros(5)], "does not split into 2 equal chunks"),
    ([torch.zeros(4), [0, 0, 0, 0]], "must be a torch.Tensor"),
    (torch.zeros(4), "must be a list of tensors"),
])
def test_the_ring_names_bad_shards(shards, words) -> None:
    with pytest.raises(TypeError if "must be a" in words else ValueError, match=words):
        ring_all_reduce(shards)


@given(st.integers(1, 8), st.integers(0, 5), st.sampled_from([torch.float32, torch.float16,
                                                                torch.int64]),
       st.integers(0, 2**31))
def test_the_ring_without_outgoing_copies_gives_the_same_bits_under_the_printed_schedule(
        n, chunk, dtype, seed) -> None:
    """Hint 2 says so: in each step no rank sends the chunk it receives, so updating the
    receivers one after another, each reading its sender's chunk directly, changes nothing
    (and so no check could tell; the hint does not call it a bug)."""
    no_copies = with_edits(ring_all_reduce, (
        "outgoing = [chunks[r][(r - step) % n].clone() for r in range(n)]",
        "outgoing = [chunks[r][(r - step) % n] for r in range(n)]"), (
        "outgoing = [chunks[r][(r + 1 - step) % n].clone() for r in range(n)]",
        "outgoing = [chunks[r][(r + 1 - step) % n] for r in range(n)]"))
    generator = torch.Generator().manual_seed(seed)
    shards = [(torch.randn(n * chunk, generator=generator) * 100).to(dtype) for _ in range(n)]
    (want, sent), (got, also_sent) = ring_all_reduce(shards), no_copies(shards)
    assert sent == also_sent and all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_float_ceiling_of_the_shard_fails_a_visible_check() -> None:
    """Hint 1 of zero_bytes_per_device, "no float is needed": past 2**53 a float division
    rounds N / n, and its ceiling is no longer the shard's size."""
    in_floats = with_edits(zero_bytes_per_device, (
        "shard = n_elements, _sharded(n_elements, n)",
        "shard = n_elements, math.ceil(n_elements / n)"))
    verdict = judged_with("07_many_devices", "zero_bytes_per_device",
                          zero_bytes_per_device=in_floats)
    assert [f.split(":")[0] for f in verdict.visible_failures] == [
        "zero_bytes_per_device(2**53 + 1, 2, 3)"]
    assert verdict.hidden_failures


def test_zero_paper_figure_1() -> None:
    """Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, K = 12: 120 GB for plain
    data parallelism, 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p)."""
    printed = [120, 31.4, 16.6, 1.9]
    per_gpu = [zero_bytes_per_device(7_500_000_000, 64, stage) / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in per_gpu] == printed
    # the paper's formulas, (2 + 2 + K) psi, 2 psi + 2 psi + K psi / Nd, ...
    psi, nd, k = Fraction(7_500_000_000), 64, 12
    formulas = [(4 + k) * psi, 4 * psi + k * psi / nd, 2 * psi + (2 + k) * psi / nd,
                (4 + k) * psi / nd]
    assert per_gpu == [float(f / 10**9) for f in formulas]


@given(st.integers(0, 10**12), st.integers(1, 4096), st.integers(0, 4), st.integers(0, 4),
       st.integers(0, 16))
def test_each_zero_stage_shards_more_and_the_shards_cover_every_parameter(n, ranks, p, g, k):
    held = [zero_bytes_per_device(n, ranks, stage, p, g, k) for stage in range(4)]
    assert held == sorted(held, reverse=True)  # each stage holds no more than the one before
    assert held[0] == n * (p + g + k)
    assert zero_bytes_per_device(n, 1, 3, p, g, k) == held[0]  # one rank: nothing to shard
    # the shards of stage 3 cover the model, padding at most one element per rank
    assert n * (p + g + k) <= ranks * held[3] < (n + ranks) * (p + g + k) or p + g + k == 0


@given(st.integers(0, 10**12), st.integers(1, 4096))
def test_zero_stage_3_sends_one_and_a_half_times_stage_2(n, ranks) -> None:
    """ZeRO paper, section 7: stages 1 and 2 send as much as data parallelism's all-reduce;
    stage 3 all-gathers the weights once more, 1.5 times the bytes."""
    sent = [zero_comm_bytes(n, ranks, stage) for stage in range(4)]
    assert sent[0] == sent[1] == sent[2] and 2 * sent[3] == 3 * sent[2]
    if n % ranks == 0:
        assert sent[0] == collective_bytes("all_reduce", 2 * n, ranks)


def simulated_step(stage: int, microbatches: int, keep_unsharded: bool) -> list[tuple[str, str]]:
    """The collectives one rank runs in an optimizer step of ``microbatches`` micro-batches, in
    order, as (operation, what), from what each ZeRO stage keeps whole: a rank gathers weights
    it lacks just before a forward or backward pass needs them, ZeRO-3 lets them go after each
    pass unless it keeps them, a stage that shards gradients reduces them as the backward pass
    makes them unless it keeps them whole, and whole gradients are reduced once, at the end."""
    weights_whole = stage < 3
    reduce_each_backward = stage >= 2 and not keep_unsharded
    release_after_each_pass = stage == 3 and not keep_unsharded
    events, pending = [], False
    for _ in range(microbatches):
        for _pass in ("forward", "backward"):
            if not weights_whole:
                events.append(("all_gather", "weights"))
                weights_whole = True
            if _pass == "backward":
                if reduce_each_backward:
                    events.append(("reduce_scatter", "gradients"))
                else:
                    pending = True
            if release_after_each_pass:
                weights_whole = False
    if pending:
        events.append(("all_reduce" if stage == 0 else "reduce_scatter", "gradients"))
    if stage in (1, 2):  # each rank updated its shard: everyone needs every shard back
        events.append(("all_gather", "weights"))
    return events


def bytes_of(events: list[tuple[str, str]], n_params: int, world_size: int, p: int,
             g: int) -> int:
    """The bytes one rank sends for ``events``, each collective over the flat buffer padded to
    ``world_size`` equal shards."""
    padded = -(-n_params // world_size) * world_size
    return sum(collective_bytes(op, padded * (p if what == "weights" else g), world_size)
               for op, what in events)


AG, RS = ("all_gather", "weights"), ("reduce_scatter", "gradients")


@pytest.mark.parametrize(("stage", "m", "keep", "worked_by_hand"), [
    (0, 3, False, [("all_reduce", "gradients")]),  # DDP under no_sync: one all-reduce
    (1, 3, False, [RS, AG]),
    (2, 3, False, [RS, RS, RS, AG]),  # a reduce-scatter after every backward pass
    (2, 3, True, [RS, AG]),
    (3, 2, False, [AG, AG, RS, AG, AG, RS]),  # forward, backward and gradients, twice
    (3, 2, True, [AG, RS]),  # gathered once for the first forward pass, reduced once
    (3, 1, False, [AG, AG, RS]),  # the ZeRO paper's section 7: 1.5 all-reduces
])
def test_the_simulated_step_is_the_schedule_worked_by_hand(stage, m, keep, worked_by_hand):
    assert simulated_step(stage, m, keep) == worked_by_hand
    for n_params, n, p, g in [(1000, 4, 2, 2), (10, 3, 2, 4), (7_500_000_000, 64, 2, 2)]:
        assert accumulation_comm_bytes(n_params, n, stage, m, keep, p, g) == bytes_of(
            worked_by_hand, n_params, n, p, g)


@given(st.integers(0, 10**12), st.integers(1, 1024), st.integers(0, 3), st.integers(1, 64),
       st.booleans(), st.integers(0, 4), st.integers(0, 4))
def test_accumulation_bytes_are_those_of_the_simulated_step(n_params, n, stage, m, keep, p, g):
    expected = bytes_of(simulated_step(stage, m, keep), n_params, n, p, g)
    assert accumulation_comm_bytes(n_params, n, stage, m, keep, p, g) == expected
    if m == 1 and p == g:  # one micro-batch: section 6's count
        assert expected == zero_comm_bytes(n_params, n, stage, p)
    # keeping whole sends what stage 1 sends; resharding never sends less
    kept = accumulation_comm_bytes(n_params, n, stage, m, True, p, g)
    assert kept <= accumulation_comm_bytes(n_params, n, stage, m, False, p, g)
    if stage >= 1:
        assert kept == accumulation_comm_bytes(n_params, n, 1, m, False, p, g)


def test_sixteen_microbatches_of_the_zero_papers_model() -> None:
    """7.5B parameters, 64 GPUs, 16 micro-batches (lesson 07, section 7): ZeRO-2 sends 8.5
    times ZeRO-1's bytes, ZeRO-3 24 times, unless they keep whole gradients (and weights)."""
    sent = [accumulation_comm_bytes(7_500_000_000, 64, stage, 16) for stage in range(4)]
    assert [round(x / 1e9, 1) for x in sent] == [29.5, 29.5, 251.0, 708.8]
    assert sent[2] / sent[1] == 8.5 and sent[3] / sent[1] == 24
    assert all(accumulation_comm_bytes(7_500_000_000, 64, s, 16, True) == sent[1]
               for s in range(4))


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: accumulation_comm_bytes(10, 2, 3, 0), ValueError, "microbatches must be >= 1"),
    (lambda: accumulation_comm_bytes(10, 2, 4, 2), ValueError, "stage must be 0, 1, 2 or 3"),
    (lambda: accumulation_comm_bytes(10, 2, 2, 2, bytes_per_grad=-1), ValueError,
     "bytes_per_grad must be >= 0"),
    (lambda: accumulation_comm_bytes(10, 2, 3, 2, keep_unsharded=1), TypeError,
     "keep_unsharded must be True or False"),
    (lambda: accumulation_comm_bytes(10, 2, 3, 2.0), TypeError, "microbatches must be an int"),
])
def test_accumulation_names_bad_input(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


@given(st.integers(0, 10**12), st.integers(1, 64), st.floats(1e6, 1e13), st.floats(0, 1e-3))
def test_allreduce_seconds_is_bytes_over_bandwidth_plus_a_latency_per_step(size, n, bw, alpha):
    seconds = allreduce_seconds(size, n, bw, alpha)
    expected = 2 * (n - 1) * alpha + float(NCCL_TESTS_BUS_FACTOR["all_reduce"](n) * size) / bw
    assert math.isclose(seconds, expected, rel_tol=1e-12, abs_tol=1e-300)
    assert allreduce_seconds(size, 1, bw, alpha) == 0.0


@given(st.floats(1e9, 1e16), st.floats(1e6, 1e13), st.integers(1, 1024), st.integers(1, 4),
       st.integers(1, 10**12))
def test_at_the_minimum_tokens_the_backward_pass_lasts_as_long_as_the_allreduce(
        peak, bw, n, g, n_params) -> None:
    tokens = min_tokens_to_hide_allreduce(peak, bw, n, g)
    backward = 4 * n_params * tokens / peak  # lesson 04: the backward pass is 4N FLOPs a token
    assert math.isclose(backward, allreduce_seconds(n_params * g, n, bw), rel_tol=1e-9)


def test_the_interconnect_figures_and_what_they_hide() -> None:
    """8 H100s on NVLink hide their bf16 gradient all-reduce behind about 1,900 tokens per GPU
    per step at the peak; over one 400 Gb/s NIC per GPU it takes nine times as many."""
    assert NODE["nvlink_bytes_per_s"] * 2 == NODE["nvlink_bytes_per_s_both_directions"] == 900e9
    assert NODE["nic_bytes_per_s"] * 8 == NODE["nic_bits_per_s"] == 400e9
    peak = H100["peak_flops"]["bf16"]
    nvlink = min_tokens_to_hide_allreduce(peak, NODE["nvlink_bytes_per_s"], 8)
    nic = min_tokens_to_hide_allreduce(peak, NODE["nic_bytes_per_s"], 8)
    # (n-1) g peak / (2 n beta) = 7 * 2 * 989.4e12 / (16 * 450e9): 1923.8 tokens, and 17314.5
    assert math.isclose(nvlink, 1923.8333, rel_tol=1e-6) and math.isclose(nic, 17314.5)
    assert math.isclose(nic / nvlink, 9)


@given(st.integers(1, 8), st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]),
       st.integers(1, 3))
def test_the_bubble_is_that_of_a_simulated_schedule(p, m, schedule, backward_slots) -> None:
    """Narayanan et al. 2021: GPipe and 1F1B idle (p-1)/(m+p-1) of the time, whatever a
    backward pass costs. The schedule is simulated task by task (solutions/parallel_demos.py,
    whose timetable tests/test_parallel_demos.py checks), the idle share counted exactly."""
    tasks = pipeline_schedule(p, m, schedule, backward_slots)
    makespan = max(end for *_, end in tasks)
    idle = 1 - Fraction(sum(end - start for *_, start, end in tasks), p * makespan)
    assert idle == Fraction(p - 1, m + p - 1)
    assert math.isclose(pipeline_bubble_fraction(p, m), float(idle), rel_tol=1e-12)


class _Counted:
    """The all-reduces of a tensor-parallel block simulated in one process, with their bytes."""

    def __init__(self, ranks: int) -> None:
        self.ranks, self.bytes, self.count = ranks, 0, 0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.count += 1
        self.bytes += collective_bytes("all_reduce", tensor.nbytes, self.ranks)


def _copy_to_ranks(x, wire: _Counted):
    """Megatron's f: the same input on every rank; backward, the ranks' gradients all-reduced."""

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return tuple(x.clone() for _ in range(wire.ranks))

        @staticmethod
        def backward(ctx, *grads):
            total = torch.stack(grads).sum(0)
            wire.all_reduce(total)
            return total

    return Copy.apply(x)


def _sum_of_ranks(partials, wire: _Counted):
    """Megatron's g: the ranks' partial outputs all-reduced; backward, nothing to send."""

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *partials):
            total = torch.stack(partials).sum(0)
            wire.all_reduce(total)
            return total

        @staticmethod
        def backward(ctx, grad):
            return tuple(grad for _ in range(wire.ranks))

    return Reduce.apply(*partials)


def test_a_tensor_parallel_block_sends_four_all_reduces_per_step() -> None:
    """A pre-norm transformer block, split over t simulated ranks as Shoeybi et al. 2019 split
    it (attention by heads, the MLP's first matmul by columns and its second by rows), gives the
    unsplit block's output and gradients and needs four all-reduces of (b, s, d) per step."""
    torch.manual_seed(0)
    b, s, d, heads, t = 2, 5, 8, 4, 2
    qkv, out = nn.Linear(d, 3 * d, bias=False).double(), nn.Linear(d, d, bias=False).double()
    up, down = nn.Linear(d, 4 * d, bias=False).double(), nn.Linear(4 * d, d, bias=False).double()
    x = torch.randn(b, s, d, dtype=torch.float64)

    def attention(q, k, v):  # (b, s, h, dh) each
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / q.shape[-1] ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("bhqk,bkhe->bqhe", weights, v).reshape(b, s, -1)

    def whole(x):
        q, k, v = qkv(nn.functional.layer_norm(x, (d,))).view(b, s, 3, heads, -1).unbind(2)
        x = x + out(attention(q, k, v))
        return x + down(nn.functional.gelu(up(nn.functional.layer_norm(x, (d,)))))

    def split(x, wire):
        per, dh = heads // t, d // heads
        w_qkv = qkv.weight.view(3, heads, dh, d)
        partials = []
        for rank, h in enumerate(_copy_to_ranks(nn.functional.layer_norm(x, (d,)), wire)):
            mine = slice(rank * per, (rank + 1) * per)
            q, k, v = (h @ w_qkv[i, mine].reshape(-1, d).T for i in range(3))
            heads_out = attention(*(z.view(b, s, per, dh) for z in (q, k, v)))
            partials.append(heads_out @ out.weight[:, rank * per * dh:(rank + 1) * per * dh].T)
        x = x + _sum_of_ranks(partials, wire)
        partials = []
        cols = 4 * d // t
        for rank, h in enumerate(_copy_to_ranks(nn.functional.layer_norm(x, (d,)), wire)):
            hidden = nn.functional.gelu(h @ up.weight[rank * cols:(rank + 1) * cols].T)
            partials.append(hidden @ down.weight[:, rank * cols:(rank + 1) * cols].T)
        return x + _sum_of_ranks(partials, wire)

    wire = _Counted(t)
    x_whole, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = whole(x_whole)
    expected.square().sum().backward()
    grads_whole = [p.grad.clone() for p in (qkv.weight, out.weight, up.weight, down.weight)]
    for p in (qkv.weight, out.weight, up.weight, down.weight):
        p.grad = None
    got = split(x_split, wire)
    assert wire.count == 2  # forward: one all-reduce after attention, one after the MLP
    got.square().sum().backward()
    assert wire.count == 4  # backward: one for each copy of the normalised input
    # float64, a handful of operations in another order: agreement to 1e-12 is loose enough
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(x_split.grad, x_whole.grad, rtol=1e-12, atol=1e-12)
    for p, g in zip((qkv.weight, out.weight, up.weight, down.weight), grads_whole, strict=True):
        assert torch.allclose(p.grad, g, rtol=1e-12, atol=1e-12)
    assert wire.bytes == tensor_parallel_bytes(b, s, d, t, bytes_per_element=8)


@given(st.integers(1, 64), st.integers(1, 8192), st.integers(1, 64), st.integers(1, 16),
       st.integers(1, 4))
def test_tensor_parallel_bytes_are_four_all_reduces_of_the_activation(b, s, per_rank, t, e):
    d = per_rank * t
    assert tensor_parallel_bytes(b, s, d, t, e) == 4 * 2 * (t - 1) * b * s * per_rank * e
    assert tensor_parallel_bytes(b, s, d, 1, e) == 0


@pytest.mark.parametrize(("call", "words"), [
    (lambda: zero_bytes_per_device(10, 2, 4), "stage must be 0, 1, 2 or 3"),
    (lambda: zero_comm_bytes(-1, 2, 1), "n_params must be >= 0"),
    (lambda: allreduce_seconds(10, 2, 0), "bandwidth must be positive"),
    (lambda: allreduce_seconds(10, 2, 1e9, -1e-6), "latency must be >= 0"),
    (lambda: allreduce_seconds(float("nan"), 2, 1e9), "tensor_bytes must be a finite number"),
    (lambda: min_tokens_to_hide_allreduce(1e15, 5e10, 0), "world_size must be >= 1"),
    (lambda: pipeline_bubble_fraction(4, 0), "n_microbatches must be >= 1"),
    (lambda: tensor_parallel_bytes(1, 16, 10, 4), "d_model=10 does not split over 4"),
])
def test_bad_input_is_named(call, words) -> None:
    with pytest.raises(ValueError, match=words):
        call()


def test_every_hidden_check_holds_on_the_reference() -> None:
    """grader/content/cases/parallel.py: each expression runs on solutions/parallel.py, and each one
    that should refuse its input raises what it names (sync writes their expected values)."""
    import solutions.parallel
    from grader.content.cases import as_case, reference_raises, reference_value
    from grader.content.cases.parallel import CASES

    namespace = {"torch": torch, **vars(solutions.parallel)}
    graded = {"collective_bytes", "ring_all_reduce", "zero_bytes_per_device", "zero_comm_bytes",
              "accumulation_comm_bytes", "allreduce_seconds", "min_tokens_to_hide_allreduce",
              "pipeline_bubble_fraction",
              "tensor_parallel_bytes", "predicted_ring_bytes_per_rank"}
    assert set(CASES) == graded
    for name, cases in CASES.items():
        cases = [as_case(c) for c in cases]
        if not name.startswith("predicted_"):  # a prediction is a number, not a function
            assert sum(c.raises is not None for c in cases) >= 1, name  # bad input is checked
        for case in cases:
            if case.raises:
                reference_raises(case, namespace)
            else:
                reference_value(case, namespace)
    ring = reference_value(as_case(CASES["ring_all_reduce"][0]), namespace)
    assert ring[1] == 2 * 3 * 8 and all(torch.equal(r, 3 * torch.arange(8.) - 2) for r in ring[0])


RING_VARIANTS = VARIANTS["predicted_ring_bytes_per_rank"]


@pytest.mark.parametrize("index", range(len(RING_VARIANTS.choices)))
def test_each_students_ring_prediction_is_the_rings_bytes(index) -> None:
    """The graded prediction of section 3, for every student's all-reduce (the default: 4 ranks,
    12 MiB, 18,874,368 bytes): the bytes one rank sends in the simulated ring, NCCL-tests' bus
    factor times the tensor's bytes, and the band of 5% holds what the cases module says: the
    usual wrong answers miss it by far more than its width. (What gloo really sends for each
    one: tests/test_parallel_demos.py.)"""
    from grader.content.lessons import load_lesson
    from grader.grading.plans import variant_answer

    n, elements = (RING_VARIANTS.bound(index)[name] for name in ("n_ranks", "n_elements"))
    answer = variant_answer(load_lesson("07_many_devices"), "predicted_ring_bytes_per_rank",
                            index)
    assert n in (3, 4) and elements % n == 0 and 6 * 2**20 <= 4 * elements <= 12 * 2**20
    results, sent = ring_all_reduce([torch.full((elements,), float(r)) for r in range(n)])
    assert all(torch.equal(r, torch.full((elements,), float(n * (n - 1) // 2))) for r in results)
    tensor = 4 * elements  # float32
    assert type(answer) is int and answer == sent == NCCL_TESTS_BUS_FACTOR["all_reduce"](n) * tensor
    if index == 0:
        assert (n, tensor, answer) == (4, 12 * 2**20, 18_874_368)
    wrong = {"B": tensor, "2B": 2 * tensor, "2(n-1)B": 2 * (n - 1) * tensor,
             "an all-gather's": Fraction(n - 1, n) * tensor, "elements": answer / 4}
    for slip, value in wrong.items():
        assert abs(value / answer - 1) >= 0.25, slip
    assert math.isclose(answer * 10**6 / 2**20, answer, rel_tol=0.05)  # MB for MiB: a slip


@pytest.mark.parametrize("name", ["collective_bytes", "zero_bytes_per_device"])
def test_each_students_drawn_checks_are_valid_exact_and_their_own(name) -> None:
    """grader/content/cases/parallel.py's DRAWN: three value checks per seed, each with input
    the exercise accepts, whose reference answers (ints: exact, no tolerance) agree with an
    oracle (NCCL-tests' bus factors; the ZeRO paper's formulas, shards rounded up); and other
    seeds draw other inputs."""
    import random

    import solutions.parallel
    from grader.content.cases import as_case, reference_value
    from grader.content.cases.parallel import DRAWN

    assert set(DRAWN) == {"collective_bytes", "zero_bytes_per_device"}
    drawn = set()
    for seed in range(8):
        cases = [as_case(c) for c in DRAWN[name](random.Random(seed))]
        assert cases == [as_case(c) for c in DRAWN[name](random.Random(seed))]  # deterministic
        assert len(cases) == 3 and all(c.raises is None and c.rel_tol == 0 for c in cases)
        for case in cases:
            bound = arguments_of(getattr(solutions.parallel, name), case.expression)
            value = reference_value(case, vars(solutions.parallel))
            assert type(value) is int
            if name == "collective_bytes":
                n, tensor = bound["world_size"], bound["tensor_bytes"]
                assert bound["op"] in COLLECTIVES and n >= 2 and tensor % n == 0 and tensor > 0
                assert value == NCCL_TESTS_BUS_FACTOR[bound["op"]](n) * tensor
            else:
                psi, nd, stage = bound["n_params"], bound["world_size"], bound["stage"]
                p, g, k = (bound[a] for a in ("bytes_per_param", "bytes_per_grad",
                                              "optimizer_bytes_per_param"))
                assert psi >= 1 and nd >= 2 and stage in (1, 2, 3) and min(p, g, k) >= 1
                shard = math.ceil(Fraction(psi, nd))  # the paper's psi / Nd, padded
                assert value == [(p + g) * psi + k * shard, p * psi + (g + k) * shard,
                                 (p + g + k) * shard][stage - 1]
        drawn.add(tuple(c.expression for c in cases))
    assert len(drawn) == 8  # each seed its own inputs


# ---------------------------------------------------------------- other correct implementations
# tests/test_portability.py grades these as it grades a student: each is right, and each rounds
# in another order than the reference.


def ring_the_other_way(shards: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """A ring whose ranks send to rank r - 1 instead of r + 1: the same bytes, every chunk summed
    in the opposite order."""
    reversed_results, sent = ring_all_reduce(list(reversed(shards)))
    return list(reversed(reversed_results)), sent


def ring_by_one_sum(shards: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """Every rank's result as one float64 sum cast back, and the bytes the ring would send."""
    total = torch.stack(shards).to(torch.float64).sum(0).to(shards[0].dtype)
    return [total.clone() for _ in shards], collective_bytes("all_reduce", shards[0].nbytes,
                                                             len(shards))


def allreduce_seconds_per_step(tensor_bytes, world_size, bandwidth, latency=0.0) -> float:
    steps = 2 * (world_size - 1)
    return steps * (latency + tensor_bytes / world_size / bandwidth)


def min_tokens_by_times(peak_flops, bandwidth, world_size, bytes_per_grad=2) -> float:
    """Solve 4 N T / peak = 2 (n-1)/n N g / beta for T with N = 1."""
    allreduce = 2 * (world_size - 1) / world_size * bytes_per_grad / bandwidth
    return allreduce / (4 / peak_flops)


def bubble_as_one_minus(n_stages, n_microbatches) -> float:
    return 1 - n_microbatches / (n_microbatches + n_stages - 1)
