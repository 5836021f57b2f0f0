"""Lesson 03 reference code against FlopCounterMode, Tensor.nbytes and the datasheets in data/."""

from __future__ import annotations

import ast
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from grader.content.cases import as_case, reference_value
from grader.content.cases.flops import DRAWN as FLOPS_DRAWN
from grader.content.cases.flops import VARIANTS as FLOPS_VARIANTS
from grader.content.lessons import load_lesson
from grader.grading.plans import variant_answer
from solutions.flops import (
    ADD_VS_MATMUL_OPTIONS,
    MV_COUNT_OPTIONS,
    arithmetic_intensity,
    choice_add_vs_matmul,
    choice_mv_flops,
    einsum_flops,
    matmul_bytes,
    matmul_flops,
    mfu,
    predicted_critical_batch_h100,
    ridge_point,
    roofline,
)
from solutions.hardware import (
    cpu_peak_flops,
    load_hardware,
    match_accelerator,
)

HARDWARE = load_hardware()
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# The first torch and FlopCounterMode calls are slow (lazy initialisation): no per-example deadline.
torch_settings = settings(deadline=None, max_examples=60)
size = st.integers(1, 5)


def counted_flops(fn, *args) -> int:
    """What FlopCounterMode counts while ``fn(*args)`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def run_einsum(equation: str, *shapes: tuple[int, ...]) -> int:
    return counted_flops(torch.einsum, equation, *(torch.randn(s) for s in shapes))


# ---------------------------------------------------------------- matmuls against FlopCounterMode


@torch_settings
@given(size, size, size, st.integers(1, 64))
def test_matmul_flops_equals_flop_counter_for_torch_mm(m: int, k: int, n: int, scale: int) -> None:
    m, n = m * scale, n * scale
    flops = matmul_flops(m, k, n)
    assert type(flops) is int and flops == 2 * m * k * n
    assert flops == counted_flops(torch.mm, torch.randn(m, k), torch.randn(k, n))


@torch_settings
@given(st.lists(size, min_size=1, max_size=3), size, size, size)
def test_matmul_operator_with_batch_dims_counts_every_batch(batch, m, k, n) -> None:
    rows = math.prod(batch)
    a, b = torch.randn(*batch, m, k), torch.randn(*batch, k, n)
    # A batched left operand times one matrix folds the batch into the rows of a single mm.
    assert counted_flops(torch.matmul, a, b[(0,) * len(batch)]) == matmul_flops(rows * m, k, n)
    # Both batched: one bmm, the batch is an index shared by both operands and the output.
    batch_letters = "pqr"[: len(batch)]
    equation = f"{batch_letters}ik,{batch_letters}kj->{batch_letters}ij"
    want = einsum_flops(equation, a.shape, b.shape)
    assert want == rows * matmul_flops(m, k, n)
    assert counted_flops(torch.matmul, a, b) == want


@torch_settings
@given(size, size, size, size, size)
def test_matmul_broadcasts_batch_dims_before_counting(b1: int, b2: int, m: int, k: int, n: int):
    a, b = torch.randn(b1, 1, m, k), torch.randn(b2, k, n)  # batch shape broadcasts to (b1, b2)
    assert counted_flops(torch.matmul, a, b) == b1 * b2 * matmul_flops(m, k, n)


@torch_settings
@given(size, size, size, size)
def test_bmm_equals_einsum_flops_of_a_batched_matmul(batch: int, m: int, k: int, n: int) -> None:
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    want = einsum_flops("bmk,bkn->bmn", a.shape, b.shape)
    assert want == batch * matmul_flops(m, k, n)
    assert counted_flops(torch.bmm, a, b) == want


@torch_settings
@given(st.lists(size, min_size=1, max_size=2), size, size, st.booleans())
def test_linear_counts_the_matmul_and_not_the_bias(batch, d_in, d_out, with_bias) -> None:
    x, weight = torch.randn(*batch, d_in), torch.randn(d_out, d_in)
    bias = torch.randn(d_out) if with_bias else None
    # x @ weight.T over all leading rows; FlopCounterMode's addmm formula leaves out the bias add.
    assert counted_flops(F.linear, x, weight, bias) == matmul_flops(math.prod(batch), d_in, d_out)


def test_flop_counter_counts_only_matmul_like_ops() -> None:
    a, v = torch.randn(3, 4), torch.randn(4)
    assert counted_flops(torch.add, a, a) == 0  # elementwise ops are not counted at all
    assert counted_flops(torch.matmul, a, v) == 0  # matrix @ vector runs as aten.mv: not counted
    assert counted_flops(torch.matmul, v, a.T) == matmul_flops(1, 4, 3)  # vector @ matrix is an mm


# ---------------------------------------------------------------- einsums against FlopCounterMode


@st.composite
def shared_or_kept_einsums(draw) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """Einsums where every index is in both operands or in the output (the rule's domain),
    with at least one contracted index of size > 1 so that torch runs a bmm."""
    n_batch, n_contracted, n_left, n_right = (draw(st.integers(0, 2)), draw(st.integers(1, 2)),
                                              draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    letters = draw(st.permutations(LETTERS))[: n_batch + n_contracted + n_left + n_right]
    batch, contracted = letters[:n_batch], letters[n_batch : n_batch + n_contracted]
    left, right = letters[n_batch + n_contracted :][:n_left], letters[-n_right:][:n_right]
    sizes = {letter: draw(size) for letter in letters}
    sizes[contracted[0]] = draw(st.integers(2, 5))
    a = draw(st.permutations(batch + contracted + left))
    b = draw(st.permutations(batch + contracted + right))
    out = draw(st.permutations(batch + left + right))
    equation = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
    return equation, tuple(sizes[i] for i in a), tuple(sizes[i] for i in b)


@torch_settings
@given(shared_or_kept_einsums())
def test_einsum_flops_equals_flop_counter_when_every_index_is_shared_or_kept(case) -> None:
    equation, shape_a, shape_b = case
    flops = einsum_flops(equation, shape_a, shape_b)
    all_sizes = dict(zip(equation.split("->")[0].replace(",", ""), shape_a + shape_b, strict=True))
    assert type(flops) is int and flops == 2 * math.prod(all_sizes.values())
    assert flops == run_einsum(equation, shape_a, shape_b)


@st.composite
def any_einsums(draw) -> tuple[str, dict[str, int], str, str, str]:
    """Any two-operand einsum: operands from random subsets of the indices, output a random
    subset of the indices used, in random orders. Covers outer and elementwise products."""
    letters = draw(st.lists(st.sampled_from(LETTERS), min_size=1, max_size=6, unique=True))
    sizes = {letter: draw(size) for letter in letters}
    a = draw(st.permutations(draw(st.lists(st.sampled_from(letters), max_size=4, unique=True))))
    b = draw(st.permutations(draw(st.lists(st.sampled_from(letters), max_size=4, unique=True))))
    used = sorted(set(a) | set(b))
    out = draw(st.permutations(draw(st.lists(st.sampled_from(used), unique=True)))) if used else []
    a, b, out = "".join(a), "".join(b), "".join(out)
    return f"{a},{b}->{out}", sizes, a, b, out


@torch_settings
@given(any_einsums())
def test_flop_counter_sums_lone_indices_first_and_skips_products_with_nothing_to_contract(case):
    equation, sizes, a, b, out = case
    shape_a, shape_b = tuple(sizes[i] for i in a), tuple(sizes[i] for i in b)
    counted = run_einsum(equation, shape_a, shape_b)
    flops = einsum_flops(equation, shape_a, shape_b)
    assert flops == 2 * math.prod(sizes[i] for i in set(a) | set(b))
    # torch first sums out each index that is in one operand only and not in the output (a sum
    # FlopCounterMode does not count), then runs a bmm if anything is left to contract, else an
    # elementwise mul (not counted either).
    lone = {i for i in set(a) ^ set(b) if i not in out}
    contracted = {i for i in set(a) & set(b) if i not in out and sizes[i] > 1}
    a_left, b_left = ("".join(i for i in term if i not in lone) for term in (a, b))
    after_sums = einsum_flops(f"{a_left},{b_left}->{out}", tuple(sizes[i] for i in a_left),
                              tuple(sizes[i] for i in b_left))
    assert counted == (after_sums if contracted else 0)
    assert counted <= flops
    if not lone and contracted:  # the rule's domain: exact agreement
        assert counted == flops


@pytest.mark.parametrize(
    ("equation", "shapes", "ours", "flop_counter"),
    [
        ("ij,jk->i", [(2, 3), (3, 4)], 2 * 2 * 3 * 4, 2 * 2 * 3),  # k summed out of the 2nd first
        ("bi,bj->b", [(2, 3), (2, 4)], 2 * 2 * 3 * 4, 0),  # then nothing left to contract
        ("i,j->ij", [(3,), (4,)], 2 * 3 * 4, 0),  # outer product: an elementwise mul
        ("ij,ij->ij", [(3, 4), (3, 4)], 2 * 3 * 4, 0),  # elementwise product
        ("ij,jk->ik", [(2, 1), (1, 4)], 2 * 2 * 1 * 4, 0),  # contracting a size-1 index: a mul
    ],
)
def test_einsum_flops_differs_from_flop_counter_where_documented(equation, shapes, ours,
                                                                 flop_counter) -> None:
    assert einsum_flops(equation, *shapes) == ours
    assert run_einsum(equation, *shapes) == flop_counter


def test_einsum_flops_of_worked_examples() -> None:
    assert einsum_flops("ij,jk->ik", (2, 3), (3, 4)) == matmul_flops(2, 3, 4) == 48
    assert einsum_flops("bhqd,bhkd->bhqk", (2, 4, 8, 16), (2, 4, 8, 16)) == 2 * 2 * 4 * 8 * 8 * 16
    assert einsum_flops(" i j , j k -> i k ", [2, 3], torch.Size([3, 4])) == 48  # spaces ignored
    assert einsum_flops(",i->i", (), (5,)) == 10  # a scalar operand
    assert einsum_flops("ij,jk->ik", (0, 3), (3, 4)) == 0
    assert type(einsum_flops("i,i->", (np.int64(3),), (3,))) is int


@pytest.mark.parametrize(
    ("equation", "shapes", "message"),
    [
        ("ij,jk", [(2, 3), (3, 4)], "explicitly after one '->'"),
        ("ij,jk->ik->i", [(2, 3), (3, 4)], "explicitly after one '->'"),
        ("ii,ij->j", [(3, 3), (3, 4)], "repeats an index"),
        ("ij,jk->ik", [(2, 3), (5, 4)], "'j' has size 3 in one operand and 5"),
        ("ij,jk->ik", [(2, 3)], "2 operands but 1 shapes"),
        ("ij,jk->ik", [(2, 3), (3, 4), (4, 5)], "2 operands but 3 shapes"),
        ("...ij,...jk->...ik", [(2, 3), (3, 4)], "ellipsis"),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "expected two operands, found 3"),
        ("ij,jk->ik", [(2, 3, 1), (3, 4)], "has 2 indices but 3 dimensions"),
        ("ij,jk->iz", [(2, 3), (3, 4)], "output index 'z' is in neither operand"),
        ("ij,jk->ii", [(2, 3), (3, 4)], "repeats an index"),
        ("i1,1k->ik", [(2, 3), (3, 4)], "letters"),
        ("ij,jk->ik", [(2, -3), (-3, 4)], "negative"),
    ],
)
def test_einsum_flops_rejects_what_it_cannot_count(equation, shapes, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        einsum_flops(equation, *shapes)


# ---------------------------------------------------------------- bytes against Tensor.nbytes


@settings(deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40),
       st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
def test_matmul_bytes_equals_nbytes_of_inputs_and_output(m, k, n, dtype) -> None:
    a, b = torch.ones(m, k, dtype=dtype), torch.ones(k, n, dtype=dtype)
    out = a @ b
    got = matmul_bytes(m, k, n, dtype.itemsize)
    assert type(got) is int
    assert got == a.nbytes + b.nbytes + out.nbytes


def test_matmul_bytes_and_intensity_of_a_square_matmul() -> None:
    # 2n^3 FLOPs over 3n^2 elements: intensity n/3 per element, n/6 FLOP/byte in fp32.
    for n in (64, 1024, 8192):
        intensity = arithmetic_intensity(matmul_flops(n, n, n), matmul_bytes(n, n, n, 4))
        assert intensity == n / 6 and type(intensity) is float
    assert arithmetic_intensity(matmul_flops(8192, 8192, 8192), matmul_bytes(8192, 8192, 8192, 2)) \
        == 8192 / 3


# ---------------------------------------------------------------- hardware figures


def test_dense_peaks_in_the_data_are_half_the_sparse_ones() -> None:
    # The datasheets print sparse figures to 4 significant digits and the data holds them
    # halved and rounded (1978.9 / 2 = 989.45 -> 989.4), hence 1e-3 rather than exact.
    for name, spec in HARDWARE.items():
        for dtype, sparse in spec["peak_flops_with_sparsity"].items():
            assert spec["peak_flops"][dtype] == pytest.approx(sparse / 2, rel=1e-3), (name, dtype)
    h100 = HARDWARE["H100 SXM"]
    assert h100["peak_flops_with_sparsity"]["bf16"] == pytest.approx(1979e12, rel=1e-3)
    assert h100["peak_flops"]["bf16"] == pytest.approx(989.4e12, rel=1e-4)  # not 1979e12


def test_ridge_points_of_h100_and_a100_in_bf16() -> None:
    h100, a100 = HARDWARE["H100 SXM"], HARDWARE["A100 SXM 80GB"]
    h100_ridge = ridge_point(h100["peak_flops"]["bf16"], h100["memory_bandwidth"])
    a100_ridge = ridge_point(a100["peak_flops"]["bf16"], a100["memory_bandwidth"])
    assert h100_ridge == 989.4e12 / 3.35e12 and round(h100_ridge) == 295
    assert a100_ridge == 312e12 / 2.039e12 and round(a100_ridge) == 153
    # A square bf16 matmul does 2n^3 FLOPs on 3n^2 x 2 bytes: intensity n/3, so on an H100 it
    # is compute-bound from n = 887 (887/3 = 295.67 > 295.34 > 886/3 = 295.33).
    def bf16_square(n: int) -> float:
        return arithmetic_intensity(matmul_flops(n, n, n), matmul_bytes(n, n, n, 2))

    assert bf16_square(887) > h100_ridge > bf16_square(886)


@pytest.mark.parametrize(
    ("device_name", "entry"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100 80GB PCIe", None),  # not in the data: no guessing
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("Tesla V100-SXM2-16GB", None),
    ],
)
def test_match_accelerator_maps_cuda_device_names_to_entries(device_name, entry) -> None:
    assert match_accelerator(device_name, HARDWARE) == entry


def test_cpu_peak_flops_is_cores_x_clock_x_lanes_x_2_x_fma_units() -> None:
    assert cpu_peak_flops(2, 2.6e9, 512, 2) == 2 * 2.6e9 * 16 * 2 * 2 == 332.8e9
    assert cpu_peak_flops(2, 2.6e9, 512, 2, bytes_per_element=8) == 166.4e9  # 8 fp64 lanes
    assert cpu_peak_flops(8, 3.0e9, 256, 2) == 768e9  # AVX2: 8 fp32 lanes
    assert cpu_peak_flops(1, 1e9, 128, 1) == 8e9  # SSE/NEON: 4 lanes
    assert type(cpu_peak_flops(1, 1, 128, 1)) is float
    with pytest.raises(ValueError, match="cores must be positive"):
        cpu_peak_flops(0, 2.6e9, 512, 2)
    with pytest.raises(ValueError, match="whole number of 4-byte elements"):
        cpu_peak_flops(1, 2.6e9, 100, 2)


# detect_cpu and the FLOPs per cycle of each kind of core: tests/test_cpu.py.


# ---------------------------------------------------------------- roofline, ridge and MFU


positive = st.floats(1e9, 1e16)
intensity = st.floats(0, 1e6)


@given(intensity, intensity, positive, positive)
def test_roofline_is_monotone_non_decreasing_in_intensity(i1, i2, peak, bandwidth) -> None:
    low, high = sorted([i1, i2])
    assert roofline(low, peak, bandwidth) <= roofline(high, peak, bandwidth) <= peak


@given(intensity, positive, positive)
def test_roofline_is_the_peak_above_the_ridge_and_bandwidth_bound_below(i, peak, bandwidth):
    ridge = ridge_point(peak, bandwidth)
    attainable = roofline(i, peak, bandwidth)
    assert type(attainable) is float
    # Stay a hair away from the ridge, where peak / bandwidth * bandwidth may round off peak.
    if i > ridge * (1 + 1e-12):
        assert attainable == peak
    elif i < ridge * (1 - 1e-12):
        assert attainable == i * bandwidth
    assert roofline(ridge * 2, peak, bandwidth) == peak
    assert roofline(ridge / 2, peak, bandwidth) == pytest.approx(peak / 2, rel=1e-12)


def test_mfu_is_achieved_flops_per_second_over_peak() -> None:
    # A 8192^3 bf16 matmul (1.1e12 FLOPs) in 2 ms on an H100 SXM: 550 TFLOP/s of 989.4.
    flops = matmul_flops(8192, 8192, 8192)
    assert mfu(flops, 2e-3, 989.4e12) == flops / 2e-3 / 989.4e12
    assert mfu(flops, 2e-3, 989.4e12) == pytest.approx(0.5557, abs=1e-4)
    assert mfu(989.4e12, 1.0, 989.4e12) == 1.0 and mfu(0, 1.0, 1.0) == 0.0
    assert type(mfu(np.int64(10), np.float64(2.0), 5)) is float


def test_graded_functions_return_plain_python_numbers_for_numpy_input() -> None:
    assert type(matmul_flops(np.int64(2), np.int32(3), 4)) is int
    assert type(matmul_bytes(np.int64(2), 3, 4, np.int64(2))) is int
    assert type(arithmetic_intensity(np.float64(6.0), np.int64(4))) is float
    assert type(ridge_point(np.float32(4.0), 2)) is float
    assert type(roofline(np.float64(1.0), 4.0, np.float64(2.0))) is float
    assert arithmetic_intensity(6, 4) == 1.5 and ridge_point(4, 2) == 2.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: matmul_flops(-1, 2, 3), "m=-1"),
        (lambda: matmul_flops(1, -2, -3), "k=-2, n=-3"),
        (lambda: matmul_bytes(2, 2, -1, 4), "n=-1"),
        (lambda: matmul_bytes(2, 2, 2, 0), "bytes_per_element must be positive"),
        (lambda: arithmetic_intensity(10, 0), "bytes must be positive"),
        (lambda: arithmetic_intensity(-1, 10), "flops must be >= 0"),
        (lambda: arithmetic_intensity(1, math.nan), "bytes must be positive"),
        (lambda: ridge_point(0, 1e12), "peak_flops must be positive"),
        (lambda: ridge_point(1e12, -1), "bandwidth must be positive"),
        (lambda: roofline(-0.5, 1e12, 1e12), "intensity must be >= 0"),
        (lambda: roofline(1, 1e12, 0), "bandwidth must be positive"),
        (lambda: mfu(1e12, 0, 1e12), "seconds must be positive"),
        (lambda: mfu(1e12, 1, 0), "peak_flops must be positive"),
        (lambda: mfu(-1, 1, 1e12), "flops must be >= 0"),
    ],
)
def test_bad_input_raises_value_error_saying_what_is_wrong(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_sizes_must_be_integers() -> None:
    with pytest.raises(TypeError):
        matmul_flops(2.5, 3, 4)
    with pytest.raises(TypeError, match="sequence of ints"):
        einsum_flops("i,i->", 3, 3)


# ---------------------------------------------------------------- the answers to the predictions


def test_flop_counter_counts_nothing_for_a_matrix_times_a_vector() -> None:
    """Section 5's answer: torch runs (256, 256) @ (256,) as aten::mv, which FlopCounterMode
    has no formula for."""
    a, v = torch.randn(256, 256), torch.randn(256)
    assert counted_flops(torch.matmul, a, v) == MV_COUNT_OPTIONS[choice_mv_flops] == 0
    assert MV_COUNT_OPTIONS["a"] == matmul_flops(256, 256, 1)


CRITICAL = "predicted_critical_batch_h100"
CRITICAL_VARIANTS = range(len(FLOPS_VARIANTS[CRITICAL].choices))
# Bytes per element of each dtype a variant may name, from torch's own dtypes.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp64": torch.float64, "fp8": torch.float8_e4m3fn}


def matmul_peak(spec: dict, dtype: str) -> float:
    """The dense peak of a matmul in ``dtype`` on a GPU of hardware.json: its Tensor Cores'
    rate where the datasheet gives one apart from the vector rate (fp64), else the dtype's."""
    return spec["peak_flops"].get(f"{dtype}_tensor", spec["peak_flops"][dtype])


def critical_variant(index: int) -> tuple[dict, float]:
    """A variant's names, and the answer graded for it (the notebook's cell, run again)."""
    return (FLOPS_VARIANTS[CRITICAL].bound(index),
            variant_answer(load_lesson("03_matmul_flops"), CRITICAL, index))


def exact_crossing(d_in: int, d_out: int, dtype: torch.dtype, peak: float, bandwidth: float):
    """The smallest batch B at which (B, d_in) @ (d_in, d_out) in ``dtype`` is compute-bound,
    in rationals: FLOPs from FlopCounterMode on meta tensors, bytes from their nbytes, and the
    batch found by bisection on intensity >= peak / bandwidth."""
    from fractions import Fraction

    weight = torch.empty(d_in, d_out, dtype=torch.float32, device="meta")

    def compute_bound(batch: int) -> bool:
        x = torch.empty(batch, d_in, dtype=torch.float32, device="meta")
        flops = counted_flops(torch.mm, x, weight)  # FlopCounterMode needs no real data
        elements = x.numel() + weight.numel() + batch * d_out
        moved = elements * torch.empty((), dtype=dtype).element_size()
        return Fraction(flops, moved) >= Fraction(peak) / Fraction(bandwidth)

    low, high = 1, 1
    while not compute_bound(high):
        low, high = high, 2 * high
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if not compute_bound(middle) else (low, middle)
    return high


@pytest.mark.parametrize("index", CRITICAL_VARIANTS)
def test_each_variants_figures_are_its_gpus_in_the_data(index: int) -> None:
    names, _ = critical_variant(index)
    spec = HARDWARE[names["layer_gpu"]]
    assert names["layer_peak_tflops"] * 1e12 == pytest.approx(
        matmul_peak(spec, names["layer_dtype"]), rel=1e-12)
    assert names["layer_bandwidth_tbs"] * 1e12 == pytest.approx(spec["memory_bandwidth"],
                                                                rel=1e-12)
    assert names["layer_bytes"] == TORCH_DTYPES[names["layer_dtype"]].itemsize


@pytest.mark.parametrize("index", CRITICAL_VARIANTS)
def test_critical_batch_of_a_layer_far_wider_than_the_batch_is_the_answer(index: int) -> None:
    """Section 8's graded answer, for each student's GPU and dtype: the batch where a layer far
    wider than any batch turns compute-bound (from the datasheet figures of data/hardware.json
    and FlopCounterMode's FLOPs), the ridge point itself in bf16; about 295 for the default."""
    names, answer = critical_variant(index)
    spec = HARDWARE[names["layer_gpu"]]
    peak, bandwidth = matmul_peak(spec, names["layer_dtype"]), spec["memory_bandwidth"]
    dtype = TORCH_DTYPES[names["layer_dtype"]]
    # The first whole batch above the answer: a layer of finite width falls a little short of
    # the ridge at a batch equal to it (fp64's answer is 80 exactly: its crossing is 81).
    assert exact_crossing(2**30, 2**30, dtype, peak, bandwidth) == math.floor(answer) + 1
    assert answer == pytest.approx(ridge_point(peak, bandwidth) * dtype.itemsize / 2, rel=1e-12)
    if index == 0:
        assert answer == predicted_critical_batch_h100 and round(answer) == 295


def test_each_variant_has_its_own_answer() -> None:
    """Every two answers are more than the graded band (10%) apart: no one else's number, nor
    the default's, passes for a student."""
    answers = sorted(critical_variant(index)[1] for index in CRITICAL_VARIANTS)
    assert all(high > 1.1 * low for low, high in itertools.pairwise(answers))


@pytest.mark.parametrize("index", CRITICAL_VARIANTS)
def test_a_weight_matmul_has_intensity_about_2b_over_its_element_bytes(index: int) -> None:
    """(B, D) @ (D, F) with b bytes per element: 2BDF / (b(BD + DF + BF)) =
    (2B / b) / (1 + B/F + B/D), exactly (oracle: the same in rationals), within B/F + B/D of
    2B / b."""
    from fractions import Fraction

    b = critical_variant(index)[0]["layer_bytes"]
    for d_in, d_out in [(4096, 4096), (4096, 16384), (12288, 49152), (2**20, 2**20)]:
        for batch in (1, 64, 295, 1024):
            intensity = arithmetic_intensity(matmul_flops(batch, d_in, d_out),
                                             matmul_bytes(batch, d_in, d_out, b))
            exact = Fraction(2 * batch, b) / (1 + Fraction(batch, d_out) + Fraction(batch, d_in))
            assert intensity == pytest.approx(float(exact), rel=1e-15)
            assert 1 - intensity / (2 * batch / b) <= batch / d_out + batch / d_in


@pytest.mark.parametrize("index", CRITICAL_VARIANTS)
def test_exact_critical_batch_of_a_wide_layer_is_within_the_graded_band(index: int) -> None:
    """The crossing for finite D, F is above the answer, by under 5% for GPT-3's MLP
    (12288, 49152) in every variant, inside the prediction's 10% band: 305 for the default
    (3% above), 346 for its (4096, 4096)."""
    names, answer = critical_variant(index)
    spec = HARDWARE[names["layer_gpu"]]
    peak, bandwidth = matmul_peak(spec, names["layer_dtype"]), spec["memory_bandwidth"]
    dtype = TORCH_DTYPES[names["layer_dtype"]]
    gpt3 = exact_crossing(12288, 49152, dtype, peak, bandwidth)
    assert answer < gpt3 < 1.05 * answer
    if index == 0:
        assert gpt3 == 305 and exact_crossing(4096, 4096, dtype, peak, bandwidth) == 346


def test_wrong_peaks_or_bytes_per_element_miss_the_graded_band() -> None:
    """The slips the band is meant to catch, in every variant: the sparse peak (for the dtypes
    that have one: not fp32), the vector rate where a matmul runs on Tensor Cores of their own
    (fp64), or bytes per element of another dtype (fp32's 4, or 2 in fp8, or 2 for fp32), or
    none at all (B = the ridge point in fp8), are off by a factor of 2."""
    for index in CRITICAL_VARIANTS:
        names, answer = critical_variant(index)
        spec = HARDWARE[names["layer_gpu"]]
        dtype, bandwidth = names["layer_dtype"], spec["memory_bandwidth"]
        b = names["layer_bytes"]
        sparse = spec["peak_flops_with_sparsity"].get(dtype)
        peak = matmul_peak(spec, dtype)
        vector = spec["peak_flops"][dtype] if peak != spec["peak_flops"][dtype] else None
        wrong = [*([sparse / bandwidth * b / 2] if sparse else []),
                 *([vector / bandwidth * b / 2] if vector else []),  # fp64 off its tensor cores
                 *(peak / bandwidth * other / 2 for other in (1, 2, 4) if other != b)]
        for number in wrong:
            assert not math.isclose(number, answer, rel_tol=0.1), (index, number)


# ---------------------------------------------------------------- each student's drawn inputs


@pytest.mark.parametrize("exercise", sorted(FLOPS_DRAWN))
def test_drawn_inputs_are_valid_and_differ_between_students(exercise: str) -> None:
    import solutions.flops as reference
    from tests.grading_helpers import drawn_calls

    for calls in drawn_calls(FLOPS_DRAWN[exercise], range(6)):
        for call in map(as_case, calls):
            got = reference_value(call, vars(reference))
            assert type(got) is int and got > 0
            arguments = ast.literal_eval(call.expression.split("(", 1)[1].rsplit(")", 1)[0])
            assert got == drawn_oracle(exercise, *arguments), call.expression


def drawn_oracle(exercise: str, *arguments) -> int:
    """The answer to a drawn call from torch: Tensor.nbytes of meta tensors for matmul_bytes,
    FlopCounterMode of torch.einsum on meta tensors for einsum_flops (in its domain: each index in
    both operands or the output), or 2 x the product of the sizes when nothing is contracted over
    a size above 1 (which FlopCounterMode counts as 0)."""
    if exercise == "matmul_bytes":
        m, k, n, size = arguments
        dtype = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[size]
        return sum(torch.empty(shape, dtype=dtype, device="meta").nbytes
                   for shape in ((m, k), (k, n), (m, n)))
    equation, shape_a, shape_b = arguments
    (a, b), out = equation.split("->")[0].split(","), equation.split("->")[1]
    sizes = dict(zip(a + b, shape_a + shape_b, strict=True))
    assert all(i in out or (i in a and i in b) for i in sizes)  # the generator's domain
    if not any(sizes[i] > 1 for i in set(a) & set(b) - set(out)):
        return 2 * math.prod(sizes.values())
    return counted_flops(torch.einsum, equation, torch.empty(shape_a, device="meta"),
                         torch.empty(shape_b, device="meta"))


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_an_add_takes_over_ten_times_a_matmuls_time_per_flop_on_every_roofline(name) -> None:
    """Section 11's answer: an add reaches at most bandwidth / 6 FLOP/s in bf16 (bandwidth / 12
    in fp32); a large matmul at only 20% MFU is still more than 10 times faster per FLOP."""
    spec = HARDWARE[name]
    for dtype, bytes_per_element in (("bf16", 2), ("fp32", 4)):
        peak, bandwidth = spec["peak_flops"][dtype], spec["memory_bandwidth"]
        add = roofline(arithmetic_intensity(1, 3 * bytes_per_element), peak, bandwidth)
        low, high = ADD_VS_MATMUL_OPTIONS[choice_add_vs_matmul]
        assert low <= 0.2 * peak / add < high, (dtype, 0.2 * peak / add)


def test_an_add_takes_over_ten_times_a_matmuls_time_per_flop_on_a_cpu() -> None:
    """The same on this lesson's example CPU (2 cores, AVX-512, 2 FMA units, 20 GB/s): a ridge
    point of 16.6 FLOP/byte, so 12 x 16.6 x 0.2 = 40 times in fp32."""
    peak = cpu_peak_flops(2, 2.6e9, 512, 2)
    add = roofline(1 / 12, peak, 20e9)
    assert 0.2 * peak / add == pytest.approx(12 * ridge_point(peak, 20e9) * 0.2)
    assert 0.2 * peak / add > ADD_VS_MATMUL_OPTIONS[choice_add_vs_matmul][0]


# ---------------------------------------------------------------- the roofline explorer


def _control(widget, name: str):
    """The widget with CSS class ``ctc-<name>`` inside the explorer."""
    if f"ctc-{name}" in getattr(widget, "_dom_classes", ()):
        return widget
    for child in getattr(widget, "children", ()):
        found = _control(child, name)
        if found is not None:
            return found
    return None


def _shown(explorer) -> dict[str, float]:
    import re

    html = _control(explorer, "readout").value
    return {key: float(value) for key, value in
            re.findall(r"class='ctc-(\w+)' data-value='([^']+)'", html)}


def test_explorer_readout_is_the_reference_functions() -> None:
    from solutions.roofline_explorer import explorer_readout

    got = explorer_readout(256, 8192, 8192, 2, 989.4e12, 3.35e12)
    intensity = arithmetic_intensity(matmul_flops(256, 8192, 8192),
                                     matmul_bytes(256, 8192, 8192, 2))
    assert got["intensity"] == intensity and got["bound"] == "memory-bound"
    assert got["attainable"] == roofline(intensity, 989.4e12, 3.35e12)
    assert got["ridge_point"] == ridge_point(989.4e12, 3.35e12)
    assert explorer_readout(1024, 8192, 8192, 2, 989.4e12, 3.35e12)["bound"] == "compute-bound"


def test_explorer_shows_what_the_reference_gives_as_its_controls_move() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from solutions.roofline_explorer import roofline_explorer

    explorer = roofline_explorer(HARDWARE)
    h100, a100 = HARDWARE["H100 SXM"], HARDWARE["A100 SXM 80GB"]
    assert _shown(explorer)["ridge_point"] == ridge_point(h100["peak_flops"]["bf16"],
                                                          h100["memory_bandwidth"])
    _control(explorer, "m").value = 4096
    shown = _shown(explorer)
    intensity = arithmetic_intensity(matmul_flops(4096, 8192, 8192),
                                     matmul_bytes(4096, 8192, 8192, 2))
    assert shown["intensity"] == intensity
    assert shown["attainable"] == roofline(intensity, h100["peak_flops"]["bf16"],
                                           h100["memory_bandwidth"])
    _control(explorer, "gpu").value = "A100 SXM 80GB"
    assert _shown(explorer)["ridge_point"] == ridge_point(a100["peak_flops"]["bf16"],
                                                          a100["memory_bandwidth"])
    _control(explorer, "dtype").value = "fp32"
    assert _shown(explorer)["intensity"] == arithmetic_intensity(
        matmul_flops(4096, 8192, 8192), matmul_bytes(4096, 8192, 8192, 4))
    _control(explorer, "peak").value = 10.0  # a slider moved: the chip is now the sliders'
    assert _control(explorer, "gpu").value.startswith("custom")
    assert _shown(explorer)["ridge_point"] == ridge_point(10e12, a100["memory_bandwidth"])



def test_the_padded_vocabulary_lesson_03_names_is_the_next_multiple_of_128() -> None:
    padded = -(-50257 // 128) * 128
    assert padded == 50304 and padded % 128 == 0 and padded - 128 < 50257
    # "The padded one does 0.09% more FLOPs": the logits matmul's FLOPs grow with V.
    assert f"{(padded / 50257 - 1) * 100:.2f}" == "0.09"
