"""Lesson 03 helpers: where peak FLOP/s and memory bandwidth come from.

GPU figures are read from ``data/hardware.json`` (datasheet values, dense). A CPU's peak is
worked out from figures a student can look up or read from ``/proc/cpuinfo``:
cores x clock x SIMD lanes x 2 FLOPs per fused multiply-add x FMA units per core.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

HARDWARE_JSON = Path(__file__).resolve().parent.parent / "data" / "hardware.json"
PEAK_INPUTS = ("cores", "clock_hz", "simd_width_bits", "fma_units_per_core")


def load_hardware(path: str | Path = HARDWARE_JSON) -> dict[str, dict[str, Any]]:
    """The accelerators of ``hardware.json``, by name (``"H100 SXM"``, ``"A100 SXM 80GB"``...).

    Args:
        path: the JSON file (in a lesson folder, its own copy: ``"hardware.json"``).

    Returns:
        ``{name: {"memory_bandwidth": bytes/s, "memory_bytes": bytes, "peak_flops": {dtype:
        FLOP/s}, "peak_flops_with_sparsity": {...}, "source": str}}``. ``peak_flops`` is dense.
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
        simd_width_bits: vector register width: 512 (AVX-512), 256 (AVX2), 128 (SSE, NEON).
        fma_units_per_core: FMA instructions each core can start per cycle (1 or 2).
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


def detect_cpu() -> dict[str, Any]:
    """Best-effort guess of this machine's ``cpu_peak_flops`` inputs, saying where each came from.

    Never raises: whatever cannot be read falls back to a stated assumption.

    Returns:
        ``{"model_name": str, "cores": int, "clock_hz": float, "simd_width_bits": int,
        "fma_units_per_core": int, "source": {input name: where its value came from}}``.
        ``cpu_peak_flops(**{k: info[k] for k in PEAK_INPUTS})`` gives the peak.
    """
    cpuinfo = _read_text("/proc/cpuinfo")
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())  # first processor's values
    source: dict[str, str] = {}
    info: dict[str, Any] = {"model_name": fields.get("model name", "unknown CPU"),
                            "source": source}

    try:
        logical = len(os.sched_getaffinity(0))
        where = "len(os.sched_getaffinity(0))"
    except (AttributeError, OSError):
        logical, where = os.cpu_count() or 1, "os.cpu_count()"
    try:  # /proc/cpuinfo: "siblings" = logical CPUs per socket, "cpu cores" = physical ones
        threads_per_core = max(1, int(fields["siblings"]) // int(fields["cpu cores"]))
    except (KeyError, ValueError, ZeroDivisionError):
        threads_per_core = 1
    info["cores"] = max(1, logical // threads_per_core)
    source["cores"] = f"{where} = {logical} logical CPUs, {threads_per_core} thread(s) per core"
    if threads_per_core == 1 and "siblings" not in fields:
        source["cores"] += " (assumed: /proc/cpuinfo has no siblings/cpu cores)"

    max_khz = _read_text("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    ghz_in_name = re.search(r"@\s*([\d.]+)\s*GHz", info["model_name"])
    if max_khz.isdigit():
        info["clock_hz"] = int(max_khz) * 1e3
        source["clock_hz"] = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
    elif _is_number(fields.get("cpu MHz", "")):
        info["clock_hz"] = float(fields["cpu MHz"]) * 1e6
        source["clock_hz"] = ("'cpu MHz' in /proc/cpuinfo: the clock when read, which can be "
                              "below the turbo clock a busy core reaches")
    elif ghz_in_name and _is_number(ghz_in_name[1]):
        info["clock_hz"] = float(ghz_in_name[1]) * 1e9
        source["clock_hz"] = "base clock in the model name in /proc/cpuinfo"
    else:
        info["clock_hz"] = 2.0e9
        source["clock_hz"] = "assumed 2 GHz: no clock found in /sys or /proc/cpuinfo"

    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    for flag, bits in [("avx512f", 512), ("avx2", 256), ("fma", 256)]:
        if flag in flags:
            info["simd_width_bits"] = bits
            source["simd_width_bits"] = f"'{flag}' in the flags of /proc/cpuinfo"
            break
    else:
        info["simd_width_bits"] = 128
        source["simd_width_bits"] = "assumed 128 (SSE/NEON): no avx2, fma or avx512f flag"

    if "fma" in flags or "avx512f" in flags:
        info["fma_units_per_core"] = 2
        source["fma_units_per_core"] = (
            "assumed 2, as on most x86 server cores since Haswell and Zen 2 (some Xeon models "
            "have 1 for AVX-512): /proc/cpuinfo does not say; check the CPU's documentation")
    else:
        info["fma_units_per_core"] = 1
        source["fma_units_per_core"] = "assumed 1: no x86 fma flag in /proc/cpuinfo"
    return info


def _read_text(path: str) -> str:
    """The file's text, or "" when it cannot be read."""
    try:
        return Path(path).read_text()
    except (OSError, ValueError):  # missing, unreadable, or not text
        return ""


def _is_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False
