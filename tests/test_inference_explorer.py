"""Lesson 08's serving explorer: its numbers are the lesson's functions' (and the roofline's),
and the panel shows them as its controls move (without a browser;
tests/test_widget_08_inference.py drives it in JupyterLab)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from solutions.backprop import model_params
from solutions.flops import ridge_point
from solutions.inference import (
    decode_intensity,
    decode_tokens_per_second,
    kv_cache_bytes,
    max_batch_size,
    prefill_seconds,
)
from solutions.inference_explorer import (
    CACHE_BYTES,
    WEIGHT_FORMATS,
    _gb,
    plan_html,
    prefill_attention_flops,
    serving_explorer,
    serving_plan,
)
from solutions.serving import MEMORY_RESERVE, decode_params

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
ACCELERATORS = json.loads((DATA / "hardware.json").read_text())["accelerators"]


@settings(max_examples=60)
@given(st.sampled_from(sorted(MODELS)), st.sampled_from(sorted(ACCELERATORS)),
       st.sampled_from([1, 2, 4, 8]), st.integers(1, 2048), st.integers(1, 2**17),
       st.sampled_from(sorted(WEIGHT_FORMATS)), st.sampled_from(sorted(CACHE_BYTES)))
def test_every_number_of_a_plan_is_the_lessons_functions(model, gpu, n_gpus, batch, context,
                                                         weights, cache) -> None:
    shape, spec = MODELS[model], ACCELERATORS[gpu]
    plan = serving_plan(shape, spec, n_gpus, batch, context, weights, cache)
    n, n_step = model_params(shape), decode_params(shape)
    per_param, element = WEIGHT_FORMATS[weights][0], CACHE_BYTES[cache]
    head_dim = shape["d_model"] // shape["n_heads"]
    k = kv_cache_bytes(shape["n_layers"], shape["n_kv_heads"], head_dim, 1, 1, element)
    # fp8 matmuls only for W8A8 on a GPU with fp8 tensor cores; weight-only formats run bf16
    compute = "fp8" if weights == "fp8 (W8A8)" and "fp8" in spec["peak_flops"] else "bf16"
    peak, bandwidth = n_gpus * spec["peak_flops"][compute], n_gpus * spec["memory_bandwidth"]
    memory = n_gpus * spec["memory_bytes"]
    budget = memory * (1 - MEMORY_RESERVE)
    assert plan["n_params"] == n and plan["n_step"] == n_step and plan["kv_bytes_per_token"] == k
    assert plan["compute_dtype"] == compute and plan["weights"] == n * per_param
    assert plan["cache"] == kv_cache_bytes(shape["n_layers"], shape["n_kv_heads"], head_dim,
                                           context, batch, element) == batch * context * k
    assert plan["memory"] == memory and plan["budget"] == budget
    assert plan["fits"] == (n * per_param + batch * context * k <= budget)
    if n * per_param > budget:
        assert plan["max_batch"] is None
    else:
        assert plan["max_batch"] == max_batch_size(budget, n, context, k, per_param)
        # the largest batch fits and one more does not (the bar's verdict agrees)
        largest = serving_plan(shape, spec, n_gpus, max(plan["max_batch"], 1), context,
                               weights, cache)
        assert largest["fits"] == (plan["max_batch"] >= 1)
        assert not serving_plan(shape, spec, n_gpus, plan["max_batch"] + 1, context, weights,
                                cache)["fits"]
    assert plan["intensity"] == decode_intensity(n_step, batch, context, k, per_param)
    assert plan["ridge"] == ridge_point(peak, bandwidth)
    if plan["fits"]:
        tokens = decode_tokens_per_second(n_step, batch, context, k, peak, bandwidth, per_param)
        assert plan["tokens_per_second"] == tokens
        assert plan["time_per_output_token"] == batch / tokens
    else:  # no tokens per second for a batch that does not fit
        assert plan["tokens_per_second"] is None and plan["time_per_output_token"] is None
    # the prefill's roofline with its causal attention added to the compute: 4 d FLOPs per
    # layer and kept query-key pair, at the bf16 peak (attention multiplies activations)
    pairs = context * (context + 1) // 2
    attention_seconds = shape["n_layers"] * 4 * shape["d_model"] * pairs / (
        n_gpus * spec["peak_flops"]["bf16"])
    assert plan["time_to_first_token"] == pytest.approx(max(
        2 * n_step * context / peak + attention_seconds, n_step * per_param / bandwidth),
        rel=1e-12)
    assert plan["time_to_first_token"] >= prefill_seconds(n_step, context, 1, peak, bandwidth,
                                                          per_param)
    assert plan["prefill_attention_added"] == pytest.approx(
        shape["n_layers"] * 4 * shape["d_model"] * pairs / (2 * n_step * context), rel=1e-12)
    # memory-bound exactly when the step's bytes take longer than its FLOPs (lesson 03)
    memory_seconds = (n_step * per_param + batch * context * k) / bandwidth
    compute_seconds = 2 * n_step * batch / peak
    if not math.isclose(compute_seconds, memory_seconds, rel_tol=1e-9):
        assert (plan["bound"] == "compute") == (compute_seconds > memory_seconds)


def test_the_lessons_things_to_try() -> None:
    """The numbers the lesson's 'Things to try' and section 7 state."""
    h100, h200 = ACCELERATORS["H100 SXM"], ACCELERATORS["H200 SXM"]
    llama2, llama3 = MODELS["Llama 2 7B"], MODELS["Llama 3 70B"]
    assert serving_plan(llama2, h100, 1, 27, 4096)["fits"]
    assert not serving_plan(llama2, h100, 1, 28, 4096)["fits"]
    assert serving_plan(llama2, h100, 1, 1, 4096)["max_batch"] == 27
    assert serving_plan(llama2, h100, 1, 1, 4096, cache_dtype="fp8")["max_batch"] == 54
    assert serving_plan(llama2, h100, 1, 1, 4096, reserve=0)["max_batch"] == 30
    # at a context of 128 no batch makes Llama 2 7B compute-bound: 2N / (c k) is about 197
    n7 = decode_params(llama2)
    assert round(2 * n7 / (128 * 524_288)) == 197
    assert serving_plan(llama2, h100, 1, 1024, 128)["bound"] == "memory"
    assert round(ridge_point(h100["peak_flops"]["bf16"], h100["memory_bandwidth"])) == 295
    assert serving_plan(llama3, h100, 1, 1, 8192)["max_batch"] is None
    assert serving_plan(llama3, h200, 1, 1, 8192, "fp8 (W8A8)")["max_batch"] == 20
    assert serving_plan(llama3, h100, 8, 256, 128)["bound"] == "memory"
    assert serving_plan(llama3, h100, 8, 512, 128)["bound"] == "compute"
    assert serving_plan(llama3, h100, 8, 512, 128)["fits"]
    # fp8 two ways on an H100: W8A8 doubles the ridge and the prefill's speed; weight-only
    # fp8 reads the same bytes, so the same decode bound while memory-bound
    w8a8, weights_only = (serving_plan(llama2, h100, 1, 8, 4096, w) for w in
                          ("fp8 (W8A8)", "fp8, weights only"))
    assert w8a8["compute_dtype"] == "fp8" and weights_only["compute_dtype"] == "bf16"
    assert w8a8["tokens_per_second"] == weights_only["tokens_per_second"]
    assert math.isclose(w8a8["ridge"] / weights_only["ridge"], 2, rel_tol=1e-3)
    # and the prefill of one prompt of 4096 tokens runs 1.9 times as fast: its attention, 8%
    # of the weights' FLOPs, stays at the bf16 peak
    prompt = [serving_plan(llama2, h100, 1, 1, 4096, w)["time_to_first_token"]
              for w in ("fp8, weights only", "fp8 (W8A8)")]
    assert round(prompt[0] / prompt[1], 1) == 1.9
    # Llama 2 7B's prefill: attention adds 8%, 65%, 260% to the weights' FLOPs at 4K, 32K and
    # 128K tokens, and the time to first token goes from 59 ms to 0.72 s and 6.3 s
    longer = [serving_plan(llama2, h100, 1, 1, c) for c in (4096, 32768, 131072)]
    assert [round(p["prefill_attention_added"], 2) for p in longer] == [0.08, 0.65, 2.60]
    assert round(longer[0]["time_to_first_token"] * 1e3) == 59
    assert round(longer[1]["time_to_first_token"], 2) == 0.72
    assert round(longer[2]["time_to_first_token"], 1) == 6.3
    # at 131,072 tokens one H100 does not hold it (68.7 GB of cache beside 13.5 GB of
    # weights); two do, and so does one with the cache in fp8
    assert round(longer[2]["kv_bytes_per_token"] * 131072 / 1e8) / 10 == 68.7
    assert round(2 * longer[2]["n_params"] / 1e8) / 10 == 13.5
    assert not longer[2]["fits"] and serving_plan(llama2, h100, 2, 1, 131072)["fits"]
    assert serving_plan(llama2, h100, 1, 1, 131072, cache_dtype="fp8")["fits"]
    peak = h100["peak_flops"]["bf16"]
    for p, c in zip(longer, (4096, 32768, 131072), strict=True):
        assert p["time_to_first_token"] == pytest.approx(
            (2 * n7 * c + prefill_attention_flops(llama2, c)) / peak, rel=1e-12)
    # A100s have no fp8 tensor cores: W8A8 fp8 falls back to bf16 matmuls there
    a100 = ACCELERATORS["A100 SXM 80GB"]
    assert serving_plan(llama2, a100, 1, 1, 128, "fp8 (W8A8)")["compute_dtype"] == "bf16"


def shown(panel) -> dict[str, str]:
    """The panel's data-value of each row, by row."""
    html = panel.children[-1].value
    return dict(re.findall(r'data-part="(\w+)"><td>.*?</td><td [^>]*data-value="([^"]*)"', html))


def test_the_panel_shows_the_plan_of_its_controls() -> None:
    panel = serving_explorer(MODELS, ACCELERATORS)
    controls = {c._dom_classes[0].removeprefix("ctc-"): c for c in panel.children
                if getattr(c, "_dom_classes", ())}
    assert set(controls) == {"model", "gpu", "gpus", "batch", "context", "weights", "cache"}
    h100 = ACCELERATORS["H100 SXM"]
    plan = serving_plan(MODELS["Llama 2 7B"], h100, 1, 1, 4096)
    values = shown(panel)
    assert int(values["weights"]) == plan["weights"] and int(values["cache"]) == plan["cache"]
    assert int(values["max_batch"]) == 27 and float(values["budget"]) == 72e9
    assert float(values["tokens_per_second"]) == plan["tokens_per_second"]
    assert "KV cache, 1 sequence<" in panel.children[-1].value  # one sequence, not "1 sequences"
    assert float(values["time_to_first_token"]) == plan["time_to_first_token"]
    assert "59.2 ms (attention adds 8% to the weights' FLOPs)" in panel.children[-1].value
    controls["batch"].value = 64
    plan = serving_plan(MODELS["Llama 2 7B"], h100, 1, 64, 4096)
    values = shown(panel)
    assert int(values["cache"]) == plan["cache"] and not plan["fits"]
    assert 'data-fits="false"' in panel.children[-1].value
    assert "KV cache, 64 sequences" in panel.children[-1].value
    # no tokens per second for a batch that does not fit: the panel says so
    assert values["tokens_per_second"] == "None" and values["time_per_output_token"] == "None"
    assert "none: the batch does not fit" in panel.children[-1].value
    assert "a step would be memory-bound" in panel.children[-1].value
    controls["model"].value = "Llama 3 70B"
    assert shown(panel)["max_batch"] == "None"
    assert "the weights alone do not fit" in panel.children[-1].value
    controls["gpus"].value = 8
    plan = serving_plan(MODELS["Llama 3 70B"], h100, 8, 64, 4096)
    assert float(shown(panel)["intensity"]) == plan["intensity"]
    assert f'data-bound="{plan["bound"]}"' in panel.children[-1].value
    controls["weights"].value = "fp8 (W8A8)"
    assert "ridge point (fp8)" in panel.children[-1].value


@pytest.mark.parametrize("n_gpus", [0, -1])
def test_a_plan_needs_a_gpu(n_gpus) -> None:
    with pytest.raises(ValueError, match="n_gpus"):
        serving_plan(MODELS["Llama 2 7B"], ACCELERATORS["H100 SXM"], n_gpus, 1, 128)


def test_the_html_carries_exact_values_and_readable_text() -> None:
    plan = serving_plan(MODELS["Llama 2 7B"], ACCELERATORS["H100 SXM"], 1, 8, 4096,
                        "int4, weights only")
    html = plan_html(plan, "H100 SXM", 1, 8)
    assert f'data-value="{plan["weights"]!r}">{_gb(plan["weights"])}' in html
    assert isinstance(plan["weights"], float) and plan["weights"] == model_params(
        MODELS["Llama 2 7B"]) / 2


def _causal_attention(q, k, v):
    """Causal attention that computes only what the mask keeps: for query i, its scores against
    keys 0..i and the weighted sum of those values. Grouped-query: each key/value head serves
    n_heads / n_kv_heads query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    rows = []
    for i in range(q.shape[2]):
        scores = q[:, :, i:i + 1] @ k[:, :, :i + 1].transpose(-1, -2) / q.shape[-1] ** 0.5
        rows.append(scores.softmax(-1) @ v[:, :, :i + 1])
    return torch.cat(rows, dim=2)


@pytest.mark.parametrize("heads, kv_heads, head_dim, layers, prompt",
                         [(4, 4, 8, 2, 5), (8, 2, 4, 3, 7), (2, 1, 16, 1, 1)])
def test_prefill_attention_flops_are_what_a_causal_kernel_computes(heads, kv_heads, head_dim,
                                                                   layers, prompt) -> None:
    """FlopCounterMode around attention that computes only the scores the causal mask keeps
    (query i against keys 0..i), layer by layer, counts what prefill_attention_flops says;
    keys and values shared by query heads (grouped-query attention) do not change it."""
    from torch.utils.flop_counter import FlopCounterMode

    shape = {"n_layers": layers, "d_model": heads * head_dim, "n_heads": heads,
             "n_kv_heads": kv_heads}
    generator = torch.Generator().manual_seed(0)
    with FlopCounterMode(display=False) as counter:
        for _ in range(layers):
            q = torch.randn(1, heads, prompt, head_dim, generator=generator)
            k, v = (torch.randn(1, kv_heads, prompt, head_dim, generator=generator)
                    for _ in "kv")
            _causal_attention(q, k, v)
    assert counter.get_total_flops() == prefill_attention_flops(shape, prompt)
