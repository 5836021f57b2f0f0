"""Lesson 09's explorer: its numbers are the lesson's functions' (and lessons 05, 07 and 08's
counts), and the panel shows them as its controls move (without a browser;
tests/test_widget_09_experts.py drives it in JupyterLab)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import ipywidgets as widgets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solutions.expert_models import simple_params
from solutions.experts import (
    expected_experts_touched,
    expert_parallel_bytes,
    moe_layer_flops,
    moe_params,
)
from solutions.experts_explorer import experts_explorer, kv_bytes_per_token, moe_plan
from solutions.inference import decode_tokens_per_second, kv_cache_bytes
from solutions.memory import training_memory

DATA = Path(__file__).resolve().parent.parent / "data"
MOE = json.loads((DATA / "models.json").read_text())["moe_models"]
H100 = json.loads((DATA / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((DATA / "interconnects.json").read_text())["H100 SXM node"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(MOE)), st.sampled_from([2, 4, 8, 16, 32, 64, 128, 256]),
       st.sampled_from([1, 2, 4, 8]), st.integers(1, 1024), st.sampled_from([1, 2, 4, 8, 64]))
def test_every_number_of_a_plan_is_the_lessons_functions(name, n_experts, top_k, batch,
                                                         ep_size) -> None:
    top_k, ep_size = min(top_k, n_experts), min(ep_size, n_experts)
    shape = MOE[name]
    plan = moe_plan(shape, n_experts, top_k, batch, ep_size, H100, NODE)
    d, layers = shape["d_model"], shape["n_layers"]
    total, active = moe_params(layers, d, shape["n_heads"], shape["n_kv_heads"],
                               shape["d_ff_expert"], n_experts, top_k, shape["vocab_size"],
                               shape["n_shared_experts"], shape["head_dim"],
                               shape["tied_embeddings"])
    assert (plan["total"], plan["active"]) == (total, active)
    routed = layers * n_experts * 3 * d * shape["d_ff_expert"]
    # lesson 05's mixed precision, the experts shared out, the rest whole on every GPU
    assert math.isclose(plan["state_per_gpu"],
                        sum(training_memory(total - routed, "mixed_bf16").values())
                        + sum(training_memory(routed, "mixed_bf16").values()) / ep_size,
                        rel_tol=1e-12)
    assert plan["a2a_bytes"] == expert_parallel_bytes(4096, d, top_k, ep_size)
    assert plan["expert_seconds"] == moe_layer_flops(4096, d, shape["d_ff_expert"], n_experts,
                                                     top_k, shape["n_shared_experts"]) / (
        H100["peak_flops"]["bf16"])
    assert plan["touched"] == expected_experts_touched(batch, n_experts, top_k)
    # decode keeps the bf16 weights and each sequence's cache of 1024 tokens (lesson 08)
    cache = kv_cache_bytes(layers, shape["n_kv_heads"], shape["head_dim"], 1024, batch) if (
        "mla" not in shape) else batch * 1024 * 61 * (512 + 64) * 2
    assert plan["cache_bytes"] == cache
    assert plan["decode_fits"] == (2 * total + cache <= ep_size * 80e9)
    # the dense models read and multiply all their matrices but the input embedding's lookup
    lookup = shape["vocab_size"] * d
    peak, bandwidth = ep_size * H100["peak_flops"]["bf16"], ep_size * H100["memory_bandwidth"]
    kv = kv_bytes_per_token(shape)
    for key, n in (("dense_total_tokens", total), ("dense_active_tokens", active)):
        assert plan[key] == decode_tokens_per_second(n - lookup, batch, 1024, kv, peak,
                                                     bandwidth)
    # an MoE is never slower than the dense model of its total, nor faster than that of its
    # active size (the same cache for all three)
    assert plan["dense_total_tokens"] * (1 - 1e-12) <= plan["moe_tokens"]
    assert plan["moe_tokens"] <= plan["dense_active_tokens"] * (1 + 1e-12)


def test_the_cache_per_token_is_lesson_08s_or_mlas() -> None:
    mixtral = MOE["Mixtral 8x7B"]
    assert kv_bytes_per_token(mixtral) == kv_cache_bytes(32, 8, 128, 1, 1) == 131_072
    assert kv_bytes_per_token(MOE["DeepSeek-V3"]) == 61 * (512 + 64) * 2  # lesson 08's MLA


def test_all_to_all_time_leaves_nvlink_for_the_network_beyond_a_node() -> None:
    """Within 8 GPUs the bytes ride NVLink (450 GB/s); from 16 on the share bound for other
    nodes crosses the 50 GB/s card and decides the time."""
    shape = MOE["DeepSeek-V3"]
    plans = {ep: moe_plan(shape, 256, 8, 1, ep, H100, NODE) for ep in (2, 8, 16, 64)}
    for ep in (2, 8):
        assert math.isclose(plans[ep]["a2a_seconds"], plans[ep]["a2a_bytes"] / 450e9,
                            rel_tol=1e-12)
    for ep in (16, 64):
        remote = 2 * 4096 * 8 * 7168 * 2 * (ep - 8) / ep
        assert math.isclose(plans[ep]["a2a_seconds"], remote / 50e9, rel_tol=1e-12)


def shown(panel) -> dict[str, str]:
    """The panel's data-value of each row, by row."""
    html = panel.children[-1].value
    return dict(re.findall(r'data-part="(\w+)"><td>.*?</td><td [^>]*data-value="([^"]*)"', html))


def test_the_panel_shows_the_plan_of_its_controls() -> None:
    panel = experts_explorer(MOE, H100, NODE)
    controls = {c._dom_classes[0].removeprefix("ctc-"): c for c in panel.children
                if getattr(c, "_dom_classes", ())}
    assert set(controls) == {"model", "experts", "top-k", "batch", "ep"}
    # a slider of choices shows its value in a readout that takes no typing (lesson 08's too)
    assert all("ctc-choice-slider" in c._dom_classes for c in controls.values()
               if isinstance(c, widgets.SelectionSlider))
    assert "ctc-choice-slider" in controls["batch"]._dom_classes
    mixtral = MOE["Mixtral 8x7B"]
    plan = moe_plan(mixtral, 8, 2, 1, 2, H100, NODE)
    values = shown(panel)
    assert (int(values["total"]), int(values["active"])) == simple_params(mixtral)
    assert float(values["moe_tokens"]) == plan["moe_tokens"]
    controls["batch"].value = 64
    assert float(shown(panel)["touched"]) == expected_experts_touched(64, 8, 2)
    controls["ep"].value = 8
    controls["experts"].value = 4  # top_k and the GPUs stay within the experts
    assert controls["top-k"].options == (1, 2, 4) and controls["ep"].options == (1, 2, 4)
    assert (controls["top-k"].value, controls["ep"].value) == (2, 4)
    controls["model"].value = "DeepSeek-V3"  # a new model: its own experts and top_k
    assert (controls["experts"].value, controls["top-k"].value) == (256, 8)
    assert controls["ep"].value == 4  # the GPUs as they were
    controls["ep"].value = 2
    plan = moe_plan(MOE["DeepSeek-V3"], 256, 8, 64, controls["ep"].value, H100, NODE)
    assert float(shown(panel)["decode_bytes"]) == plan["decode_bytes"]
    assert 'data-fits="false"' in panel.children[-1].value  # 1.4 TB of weights on 2 GPUs
    controls["ep"].value = 64
    assert 'data-fits="true"' in panel.children[-1].value
    assert float(shown(panel)["cache_bytes"]) == 64 * 1024 * 61 * (512 + 64) * 2
    controls["batch"].value = 1024  # 72 GB of cache more: 1.51 TB, still within 64 x 80 GB
    assert 'data-fits="true"' in panel.children[-1].value
    controls["model"].value = "Mixtral 8x7B"  # 93 GB of weights and 137 GB of cache
    controls["ep"].value = 2
    plan = moe_plan(MOE["Mixtral 8x7B"], 8, 2, 1024, 2, H100, NODE)
    assert 2 * plan["total"] <= 160e9 < 2 * plan["total"] + plan["cache_bytes"]
    assert 'data-fits="false"' in panel.children[-1].value  # the weights alone would fit
    assert "weights and KV cache do not fit" in panel.children[-1].value
    assert "counted as every block an MoE block" in panel.children[-2].value


def test_a_plan_spreads_the_experts_over_at_most_as_many_gpus() -> None:
    with pytest.raises(ValueError, match="ep_size"):
        moe_plan(MOE["Mixtral 8x7B"], 8, 2, 1, 16, H100, NODE)
