"""Lesson 08's explorer: serving a model on GPUs, its memory and the roofline's tokens per second.

``serving_plan`` adds up what lesson 08 counts for a batch: the weights' bytes, the KV cache of
``kv_cache_bytes``, the memory left for them once ``MEMORY_RESERVE`` is kept back, the largest
batch of ``max_batch_size``, the intensity of ``decode_intensity`` against lesson 03's
``ridge_point``, the bound of ``decode_tokens_per_second`` and the time to first token of
``prefill_seconds`` with the prefill's attention counted (``prefill_attention_flops``).
``serving_explorer`` is the ipywidgets panel the notebook shows: a model from ``models.json``, a
GPU from ``hardware.json`` and how many of them, the batch, the context, the weights' format and
the cache's dtype; every number it shows comes from ``serving_plan``.
"""

from __future__ import annotations

import ipywidgets as widgets

from solutions.backprop import model_params
from solutions.flops import ridge_point
from solutions.inference import (
    decode_intensity,
    decode_tokens_per_second,
    kv_cache_bytes,
    max_batch_size,
    prefill_seconds,
)
from solutions.serving import MEMORY_RESERVE, decode_params, serving_budget

# Colours from JupyterLab's theme where there is one (light or dark), these elsewhere: a line of
# the text's colour, and green or red for whether the plan fits.
LINE_COLOUR = "var(--jp-ui-font-color0, black)"
FITS_COLOUR = "var(--jp-success-color1, #007a33)"
MISSES_COLOUR = "var(--jp-error-color1, #b00020)"

# Each format of the weights: bytes of one stored weight, and the dtype the matmuls run in.
# fp8 matmuls need both operands in fp8: the weights and the activations (W8A8). Weights
# stored in fp8 or int4 alone are turned into bf16 as they are read, and multiplied in bf16.
WEIGHT_FORMATS = {"bf16": (2, "bf16"), "fp8 (W8A8)": (1, "fp8"),
                  "fp8, weights only": (1, "bf16"), "int4, weights only": (0.5, "bf16")}
CACHE_BYTES = {"bf16": 2, "fp8": 1}  # bytes of one cached key or value number


def prefill_attention_flops(shape: dict, prompt_len: int) -> int:
    """FLOPs of the attention matmuls of one causal prefill of ``prompt_len`` tokens.

    Each query head scores each key the causal mask keeps, P (P + 1) / 2 query-key pairs
    (position i sees i + 1 keys), and sums as many values: two matmuls of 2 head_dim FLOPs
    per pair, so 2 L d P (P + 1) over the L layers, with d = n_heads x head_dim the query
    heads' width (grouped-query attention shares keys and values, not this work): the attention
    term of ``prefill_flops_as_served``, the causal half of lesson 04's whole T x T square,
    what a causal FlashAttention kernel computes (up to the blocks on the diagonal). They grow
    with the square of the prompt: for Llama 2 7B about 8% of the weights' 2 N P FLOPs at
    4,096 tokens, 65% at 32,768, 260% at 131,072.

    Args:
        shape: a ``models.json`` entry (n_layers, d_model, n_heads).
        prompt_len: P (>= 1).

    Returns:
        FLOPs, an int.
    """
    width = shape["d_model"] // shape["n_heads"] * shape["n_heads"]
    return 2 * shape["n_layers"] * width * prompt_len * (prompt_len + 1)


def serving_plan(shape: dict, gpu: dict, n_gpus: int, batch_size: int, context_len: int,
                 weight_format: str = "bf16", cache_dtype: str = "bf16",
                 reserve: float = MEMORY_RESERVE) -> dict:
    """Memory and speed of ``batch_size`` sequences at ``context_len`` tokens.

    The ``n_gpus`` GPUs act as one device with n times the memory, bandwidth and FLOP/s (ideal
    tensor parallelism: its communication is left out). Memory is the label's (80 GB = 80e9
    bytes), and ``reserve`` of it is kept back for the CUDA context, NCCL's buffers, the
    allocator and activations; the weights and the caches share the rest. The matmuls run in
    the weight format's dtype where the GPU has it (fp8 needs W8A8), in bf16 otherwise.
    Attention's FLOPs are left out of a decode step, as in ``decode_intensity`` (their bytes,
    the cache, are counted); the time to first token counts them (``prefill_attention_flops``,
    at the bf16 peak: attention multiplies activations, which W8A8 leaves to bf16).

    Args:
        shape: a ``models.json`` entry (n_layers, d_model, n_heads, n_kv_heads, ...).
        gpu: a ``hardware.json`` accelerator (memory_bytes, memory_bandwidth, peak_flops).
        n_gpus: GPUs serving the model together (>= 1).
        batch_size: sequences decoded together (>= 1).
        context_len: tokens in each sequence's cache (>= 1).
        weight_format, cache_dtype: keys of ``WEIGHT_FORMATS`` and ``CACHE_BYTES``.
        reserve: the share of the memory kept back (0 <= reserve < 1).

    Returns:
        A dict: n_params (stored) and n_step (multiplied by a step), kv_bytes_per_token,
        weights and cache (bytes), memory (of all the GPUs), budget (memory less the reserve),
        fits, max_batch (None when the weights alone do not fit), intensity, ridge, bound
        ("memory" or "compute"), tokens_per_second (the roofline's bound; None when the batch
        does not fit), time_per_output_token (seconds, None likewise), time_to_first_token
        (the prefill of one prompt of context_len tokens, alone, its attention counted: the
        roofline of ``prefill_seconds`` with the attention's seconds added to the compute),
        prefill_attention_added (attention's FLOPs over the weights' in that prefill),
        peak_flops, bandwidth and compute_dtype.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus!r}")
    n_params, n_step = model_params(shape), decode_params(shape)
    per_param, wanted = WEIGHT_FORMATS[weight_format]
    head_dim = shape["d_model"] // shape["n_heads"]
    cache_element = CACHE_BYTES[cache_dtype]
    kv_per_token = kv_cache_bytes(shape["n_layers"], shape["n_kv_heads"], head_dim, 1, 1,
                                  cache_element)
    compute_dtype = wanted if wanted in gpu["peak_flops"] else "bf16"
    memory = n_gpus * gpu["memory_bytes"]
    budget = serving_budget(memory, reserve)
    peak = n_gpus * gpu["peak_flops"][compute_dtype]
    bandwidth = n_gpus * gpu["memory_bandwidth"]
    weights = n_params * per_param
    cache = kv_cache_bytes(shape["n_layers"], shape["n_kv_heads"], head_dim, context_len,
                           batch_size, cache_element)
    try:
        largest = max_batch_size(budget, n_params, context_len, kv_per_token, per_param)
    except ValueError:  # the weights alone do not fit
        largest = None
    fits = weights + cache <= budget
    intensity = decode_intensity(n_step, batch_size, context_len, kv_per_token, per_param)
    ridge = ridge_point(peak, bandwidth)
    tokens = (decode_tokens_per_second(n_step, batch_size, context_len, kv_per_token, peak,
                                       bandwidth, per_param) if fits else None)
    # max(weights / peak, bytes / bandwidth) becomes max(weights / peak + attention / bf16
    # peak, bytes / bandwidth): prefill_seconds, or the compute with attention if longer
    attention = prefill_attention_flops(shape, context_len)
    weight_flops = 2 * n_step * context_len
    with_attention = weight_flops / peak + attention / (n_gpus * gpu["peak_flops"]["bf16"])
    first_token = max(prefill_seconds(n_step, context_len, 1, peak, bandwidth, per_param),
                      with_attention)
    return {"n_params": n_params, "n_step": n_step, "kv_bytes_per_token": kv_per_token,
            "weights": weights, "cache": cache, "memory": memory, "budget": budget,
            "fits": fits, "max_batch": largest, "intensity": intensity, "ridge": ridge,
            "bound": "compute" if intensity >= ridge else "memory",
            "tokens_per_second": tokens,
            "time_per_output_token": None if tokens is None else batch_size / tokens,
            "time_to_first_token": first_token,
            "prefill_attention_added": attention / weight_flops,
            "peak_flops": peak, "bandwidth": bandwidth, "compute_dtype": compute_dtype}


def _gb(n_bytes: float) -> str:
    """Bytes as decimal gigabytes, as the explorer shows them."""
    return f"{n_bytes / 1e9:,.1f} GB"


def _row(part: str, label: str, value: float | int | str, text: str) -> str:
    """One row of the table; ``data-value`` holds the exact value (the browser test reads it)."""
    return (f'<tr data-part="{part}"><td>{label}</td><td style="text-align:right" '
            f'data-value="{value!r}">{text}</td></tr>')


def plan_html(plan: dict, gpu_name: str, n_gpus: int, batch_size: int) -> str:
    """The explorer's table and memory bar for one plan."""
    scale = max(plan["weights"] + plan["cache"], plan["memory"])
    gpus = f"{n_gpus} x {gpu_name}" if n_gpus > 1 else f"one {gpu_name}"
    largest, tokens = plan["max_batch"], plan["tokens_per_second"]
    sequences = "1 sequence" if batch_size == 1 else f"{batch_size:,} sequences"
    rows = [
        _row("weights", '<span style="color:#0072B2">&#9632;</span> weights', plan["weights"],
             _gb(plan["weights"])),
        _row("cache", f'<span style="color:#E69F00">&#9632;</span> KV cache, {sequences}',
             plan["cache"], _gb(plan["cache"])),
        _row("memory", gpus, plan["memory"], _gb(plan["memory"])),
        _row("budget", f"for weights and caches ({1 - plan['budget'] / plan['memory']:.0%} "
             "kept back)", plan["budget"], _gb(plan["budget"])),
        _row("max_batch", "largest batch that fits", largest,
             "none: the weights alone do not fit" if largest is None else f"{largest:,}"),
        _row("intensity", "FLOPs per byte of a step", plan["intensity"],
             f"{plan['intensity']:,.1f}"),
        _row("ridge", f"ridge point ({plan['compute_dtype']})", plan["ridge"],
             f"{plan['ridge']:,.0f}"),
        _row("tokens_per_second", "tokens/s at most (roofline)", tokens,
             "none: the batch does not fit" if tokens is None else f"{tokens:,.0f}"),
        _row("time_per_output_token", "time per output token", plan["time_per_output_token"],
             "none" if tokens is None else f"{plan['time_per_output_token'] * 1e3:,.1f} ms"),
        _row("time_to_first_token", "prefill of one prompt of the context",
             plan["time_to_first_token"],
             f"{plan['time_to_first_token'] * 1e3:,.1f} ms (attention adds "
             f"{plan['prefill_attention_added']:.0%} to the weights' FLOPs)"),
    ]
    bar = "".join(f'<div style="width:{100 * plan[part] / scale:.3f}%;background:{colour}"></div>'
                  for part, colour in (("weights", "#0072B2"), ("cache", "#E69F00")))
    if plan["fits"]:
        verdict = f"fits, {_gb(plan['budget'] - plan['weights'] - plan['cache'])} to spare"
    else:
        verdict = f"does not fit: {_gb(plan['weights'] + plan['cache'] - plan['budget'])} too much"
    bound = (f"a step {'is' if plan['fits'] else 'would be'} {plan['bound']}-bound: "
             f"{plan['intensity']:,.1f} FLOPs per byte, "
             f"{'above' if plan['bound'] == 'compute' else 'below'} the ridge point")
    return ('<div class="ctc-serving" style="font-size:15px;line-height:1.5">'
            '<table style="border-collapse:collapse;min-width:420px">' + "".join(rows)
            + '</table><div style="position:relative;width:600px;height:26px;margin:8px 0;'
            'background:#eee;display:flex">' + bar
            + f'<div style="position:absolute;left:{100 * plan["budget"] / scale:.3f}%;'
            f'top:-4px;height:34px;border-left:3px dashed {LINE_COLOUR}"></div>'
            f'<div style="position:absolute;left:{100 * plan["memory"] / scale:.3f}%;'
            f'top:-4px;height:34px;border-left:3px solid {LINE_COLOUR}"></div></div>'
            f'<div data-fits="{str(plan["fits"]).lower()}" style="font-weight:bold;color:'
            f'{FITS_COLOUR if plan["fits"] else MISSES_COLOUR}">{verdict}</div>'
            f'<div data-bound="{plan["bound"]}">{bound}</div></div>')


def serving_explorer(models: dict[str, dict], accelerators: dict[str, dict]) -> widgets.VBox:
    """A panel of controls and the serving plan they give, updated as the controls move.

    Args:
        models: ``models.json``'s ``"models"`` (each with n_kv_heads).
        accelerators: ``hardware.json``'s ``"accelerators"``.

    Returns:
        The panel (display it).
    """
    def control(widget: widgets.DOMWidget, name: str) -> widgets.DOMWidget:
        widget.add_class(f"ctc-{name}")  # a handle for the browser test
        widget.style.description_width = "150px"
        if isinstance(widget, widgets.SelectionSlider):  # its readout takes no typing: the
            widget.add_class("ctc-choice-slider")  # lab's style (grader/lab/labextension) says so
        widget.layout.width = "560px"
        return widget

    model = control(widgets.Dropdown(options=list(models), value="Llama 2 7B",
                                     description="model"), "model")
    gpu = control(widgets.Dropdown(options=list(accelerators), value="H100 SXM",
                                   description="GPU"), "gpu")
    n_gpus = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=1,
                                             description="GPUs"), "gpus")
    batch = control(widgets.SelectionSlider(options=[2**k for k in range(11)], value=1,
                                            description="batch (sequences)"), "batch")
    context = control(widgets.SelectionSlider(options=[2**k for k in range(7, 18)], value=4096,
                                              description="context (tokens)"), "context")
    weight_format = control(widgets.Dropdown(options=list(WEIGHT_FORMATS), value="bf16",
                                             description="weights"), "weights")
    cache_dtype = control(widgets.Dropdown(options=list(CACHE_BYTES), value="bf16",
                                           description="KV cache"), "cache")
    heading = widgets.HTML()
    shown = widgets.HTML()

    def update(_change: object = None) -> None:
        shape = models[model.value]
        plan = serving_plan(shape, accelerators[gpu.value], n_gpus.value, batch.value,
                            context.value, weight_format.value, cache_dtype.value)
        beyond = (f" (beyond its trained context of {shape['context_length']:,})"
                  if context.value > shape["context_length"] else "")
        heading.value = (f"<b>{model.value}</b>: {plan['n_params'] / 1e9:,.2f} billion "
                         f"parameters stored, {plan['n_step'] / 1e9:,.2f} billion multiplied "
                         f"by a step, {shape['n_kv_heads']} KV heads for {shape['n_heads']} "
                         f"query heads, {plan['kv_bytes_per_token'] / 1024:,.0f} KiB of cache "
                         f"per token; {batch.value} x {context.value:,} tokens{beyond}")
        shown.value = plan_html(plan, gpu.value, n_gpus.value, batch.value)

    controls = [model, gpu, n_gpus, batch, context, weight_format, cache_dtype]
    for widget in controls:
        widget.observe(update, names="value")
    update()
    return widgets.VBox([*controls, heading, shown])
