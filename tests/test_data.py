"""Hardware figures in data/: complete, sourced, dense (the sparse figure is never the peak)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HARDWARE = json.loads((Path(__file__).resolve().parent.parent / "data" / "hardware.json")
                      .read_text())["accelerators"]


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_accelerator_names_its_source_and_has_every_figure(name: str) -> None:
    entry = HARDWARE[name]
    assert "datasheet" in entry["source"]
    assert entry["memory_bytes"] >= 40e9 and entry["memory_bandwidth"] >= 1e12
    assert {"fp32", "bf16", "fp16"} <= set(entry["peak_flops"])


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_dense_peaks_are_half_the_sparse_ones(name: str) -> None:
    entry = HARDWARE[name]
    for dtype, sparse in entry["peak_flops_with_sparsity"].items():
        assert entry["peak_flops"][dtype] == pytest.approx(sparse / 2, rel=1e-3)


def test_the_figures_the_course_quotes() -> None:
    h100 = HARDWARE["H100 SXM"]
    assert h100["peak_flops"]["bf16"] == 989.4e12  # not 1979e12, which is with sparsity
    assert h100["memory_bandwidth"] == 3.35e12 and h100["memory_bytes"] == 80e9
    assert HARDWARE["A100 SXM 80GB"]["peak_flops"]["bf16"] == 312e12
    assert HARDWARE["H200 SXM"]["memory_bytes"] == 141e9
    # Hopper dense bf16 = 132 SMs x 4096 FLOP/clock x 1.83 GHz boost clock, to 0.1 TFLOP/s.
    assert round(132 * 4096 * 1.83e9 / 1e11) * 1e11 == h100["peak_flops"]["bf16"]


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_an_fp64_matmul_has_its_tensor_core_peak_beside_the_vector_one(name: str) -> None:
    """fp64 is the datasheet's vector rate, fp64_tensor its FP64 Tensor Core rate, where an
    fp64 matmul runs (issue 50: lesson 03's fp64 variant read the vector rate): twice it on
    Ampere and Hopper (to the datasheets' rounding), the same on the H800, whose fp64 is cut
    to 1 TFLOP/s on both."""
    flops = HARDWARE[name]["peak_flops"]
    assert flops["fp64"] <= flops["fp64_tensor"] <= 2.05 * flops["fp64"]
    if name != "H800 SXM":
        assert flops["fp64_tensor"] >= 1.95 * flops["fp64"]
    if name in ("H100 SXM", "H200 SXM"):
        assert (flops["fp64"], flops["fp64_tensor"]) == (34e12, 67e12)
