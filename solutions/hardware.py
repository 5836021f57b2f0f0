"""Lesson 03 helpers: where peak FLOP/s and memory bandwidth come from.

GPU figures are read from ``data/hardware.json`` (datasheet values, dense). A CPU's peak is
worked out from figures a student can look up or read from ``/proc/cpuinfo``:
cores x clock x SIMD lanes x 2 FLOPs per fused multiply-add x FMA units per core.
``solutions.cpu`` finds those figures for the machine at hand (``detect_cpu``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from solutions.cpu import PEAK_INPUTS, detect_cpu

__all__ = ["HARDWARE_JSON", "PEAK_INPUTS", "cpu_peak_flops", "detect_cpu", "load_hardware",
           "match_accelerator"]

HARDWARE_JSON = Path(__file__).resolve().parent.parent / "data" / "hardware.json"


def load_hardware(path: str | Path = HARDWARE_JSON) -> dict[str, dict[str, Any]]:
    """The accelerators of ``hardware.json``, by name (``"H100 SXM"``, ``"A100 SXM 80GB"``...).

    Args:
        path: the JSON file (in a lesson folder, its own copy: ``"hardware.json"``).

    Returns:
        ``{name: {"memory_bandwidth": bytes/s, "memory_bytes": bytes, "peak_flops": {dtype:
        FLOP/s}, "peak_flops_with_sparsity": {...}, "source": str}}``. ``peak_flops`` is dense;
        ``memory_bytes`` is the label's size (80 GB = 80e9 bytes). H100 SXM also has
        ``"memory_reported"``: nvidia-smi's and CUDA's totals for the same card, as printed.
    """
    with open(path) as file:
        return json.load(file)["accelerators"]


def match_accelerator(device_name: str, accelerators: dict[str, Any]) -> str | None:
    """The entry of ``accelerators`` that a CUDA device name (``torch.cuda.get_device_name()``)
    stands for, or None when no entry or more than one fits.

    A name fits an entry when it holds the entry's model (``"H100"``), its form factor (PCIe
    or NVL when the device name says so, SXM otherwise: ``"NVIDIA H100 80GB HBM3"`` is the SXM
    part) and any memory size the entry names (``"80GB"``).
    """
    upper = device_name.upper()
    compact = re.sub(r"[\s-]", "", upper)  # "A100 80GB PCIe" and "A100-PCIE-80GB" alike
    form = "PCIE" if "PCIE" in compact else "NVL" if "NVL" in compact else "SXM"
    fits = []
    for key in accelerators:
        model, *details = key.upper().split()
        # "H100" must stand alone: "GH200" is not an "H200".
        if not re.search(rf"(?<![A-Z0-9]){model}(?![0-9])", upper) or form not in details:
            continue
        if all(detail in compact for detail in details if re.fullmatch(r"\d+GB", detail)):
            fits.append(key)
    return fits[0] if len(fits) == 1 else None


def cpu_peak_flops(
    cores: int,
    clock_hz: float,
    simd_width_bits: int,
    fma_units_per_core: int,
    bytes_per_element: int = 4,
) -> float:
    """A CPU's peak FLOP/s from its datasheet figures.

    Each core issues up to ``fma_units_per_core`` fused multiply-add (FMA) instructions per
    clock cycle. One FMA instruction works on every lane of a SIMD register, and computes
    a * b + c in each lane: 2 FLOPs. A register of ``simd_width_bits`` holds
    simd_width_bits / (8 x bytes_per_element) lanes. So::

        peak = cores x clock_hz x lanes x 2 x fma_units_per_core

    For example 2 cores at 2.6 GHz with AVX-512 (16 fp32 lanes) and 2 FMA units:
    2 x 2.6e9 x 16 x 2 x 2 = 332.8e9 FLOP/s in fp32.

    Args:
        cores: physical cores doing the work (hyper-threads share a core's FMA units).
        clock_hz: clock rate in Hz, e.g. 2.6e9. Wide-vector code often runs below the
            maximum clock, so the result is an upper bound.
        simd_width_bits: the width of each FMA unit: 512, 256 or 128. Usually the widest
            vector register (AVX-512, AVX2, NEON), but narrower where a core splits wide
            instructions: AMD Zen 4 runs a 512-bit FMA as two 256-bit halves (256).
        fma_units_per_core: FMAs of that width each core can start per cycle (1, 2 or 4;
            a core without FMA that starts a multiply and an add per cycle counts as 1).
        bytes_per_element: 4 for fp32, 8 for fp64.

    Returns:
        Peak FLOP/s as a float.
    """
    for name, value in [("cores", cores), ("clock_hz", clock_hz),
                        ("simd_width_bits", simd_width_bits),
                        ("fma_units_per_core", fma_units_per_core),
                        ("bytes_per_element", bytes_per_element)]:
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if simd_width_bits % (8 * bytes_per_element):
        raise ValueError(f"a {simd_width_bits}-bit register does not hold a whole number of "
                         f"{bytes_per_element}-byte elements")
    lanes = simd_width_bits // (8 * bytes_per_element)
    return float(cores * clock_hz * lanes * 2 * fma_units_per_core)
