"""Lesson 09's explorer: what an MoE's experts, top_k, decode batch and expert parallelism change.

``moe_plan`` computes, for a model of ``models.json``'s ``"moe_models"`` with its number of
experts and top_k changed, the lesson's counts: parameters in all and per token, the training
state per GPU when ``ep_size`` GPUs share the experts, one MoE block's all-to-all against its
experts' compute on lesson 07's H100 node, and a decode step's experts touched, weight bytes and
tokens per second on the roofline of the same GPUs, beside dense models of the same total and of
the same active size, and whether the decode's weights and cache fit in those GPUs' memory.
``experts_explorer`` is the ipywidgets panel the notebook shows.
"""

from __future__ import annotations

import ipywidgets as widgets

from solutions.expert_models import (
    all_to_all_seconds,
    decode_split,
    moe_decode_tokens_per_second,
    simple_params,
)
from solutions.experts import (
    expected_experts_touched,
    expert_parallel_bytes,
    moe_decode_bytes,
    moe_layer_flops,
)
from solutions.inference import decode_tokens_per_second

TRAINING_BYTES_PER_PARAM = 16  # lesson 05's mixed precision: bf16 weights and gradients, fp32 Adam
TOKENS_PER_RANK = 4096  # the tokens each GPU holds in one MoE block's forward, as in the lesson
CONTEXT = 1024  # each decoding sequence's context, as in the lesson
# JupyterLab's theme colours, legible in its light and dark themes; the fallbacks elsewhere
FITS_COLOUR = "var(--jp-success-color1, #007a33)"
MISSES_COLOUR = "var(--jp-error-color1, #b00020)"


def kv_bytes_per_token(shape: dict) -> int:
    """bf16 keys and values of one token in every layer: MLA keeps kv_lora_rank + qk_rope
    numbers per layer, grouped-query attention 2·n_kv_heads·head_dim."""
    if "mla" in shape:
        return 2 * shape["n_layers"] * (shape["mla"]["kv_lora_rank"]
                                        + shape["mla"]["qk_rope_head_dim"])
    return 2 * shape["n_layers"] * 2 * shape["n_kv_heads"] * shape["head_dim"]


def moe_plan(shape: dict, n_experts: int, top_k: int, batch_size: int, ep_size: int,
             gpu: dict, node: dict) -> dict:
    """The lesson's counts for ``shape`` with ``n_experts`` routed experts, ``top_k`` per token.

    Args:
        shape: an entry of ``models.json``'s ``"moe_models"`` (counted by ``moe_params``:
            every block an MoE block).
        n_experts, top_k: replace the model's own (1 <= top_k <= n_experts).
        batch_size: tokens of one decode step, one per sequence (>= 1).
        ep_size: GPUs the experts are spread over (1 to n_experts); decode runs on as many.
        gpu: an entry of ``hardware.json``'s ``"accelerators"`` (its bf16 peak, bandwidth and
            memory).
        node: ``interconnects.json``'s ``"H100 SXM node"`` (NVLink, the network card, GPUs per
            node).

    Returns:
        A dict of the counts (see the keys below); bytes, seconds and tokens per second.
    """
    if not 1 <= ep_size <= n_experts:
        raise ValueError(f"ep_size must be between 1 and n_experts={n_experts}, got {ep_size}")
    model = {**shape, "n_experts": n_experts, "top_k": top_k}
    total, active = simple_params(model)
    split = decode_split(model)
    routed = model["n_layers"] * n_experts * split["per_expert"]
    d, peak = model["d_model"], gpu["peak_flops"]["bf16"]
    kv = kv_bytes_per_token(model)
    lookup = total - routed - split["non_expert"]  # the input embedding, when untied
    return {
        "total": total, "active": active,
        "state_per_gpu": TRAINING_BYTES_PER_PARAM * (total - routed + routed / ep_size),
        "a2a_bytes": expert_parallel_bytes(TOKENS_PER_RANK, d, top_k, ep_size),
        "a2a_seconds": all_to_all_seconds(TOKENS_PER_RANK, d, top_k, ep_size,
                                          node["gpus_per_node"], node["nvlink_bytes_per_s"],
                                          node["nic_bytes_per_s"]),
        "expert_seconds": moe_layer_flops(TOKENS_PER_RANK, d, model["d_ff_expert"], n_experts,
                                          top_k, model["n_shared_experts"]) / peak,
        "touched": expected_experts_touched(batch_size, n_experts, top_k),
        "decode_bytes": moe_decode_bytes(batch_size, split["non_expert"], split["per_expert"],
                                         model["n_layers"], n_experts, top_k),
        "cache_bytes": batch_size * CONTEXT * kv,
        # what decode keeps in memory: the bf16 weights and every sequence's cache
        "decode_fits": 2 * total + batch_size * CONTEXT * kv <= ep_size * gpu["memory_bytes"],
        "moe_tokens": moe_decode_tokens_per_second(model, batch_size, CONTEXT, kv,
                                                   ep_size * peak,
                                                   ep_size * gpu["memory_bandwidth"]),
        "dense_total_tokens": decode_tokens_per_second(total - lookup, batch_size, CONTEXT, kv,
                                                       ep_size * peak,
                                                       ep_size * gpu["memory_bandwidth"]),
        "dense_active_tokens": decode_tokens_per_second(active - lookup, batch_size, CONTEXT,
                                                        kv, ep_size * peak,
                                                        ep_size * gpu["memory_bandwidth"]),
    }


def _row(part: str, label: str, value: float | bool, text: str) -> str:
    """One row of the table; ``data-value`` holds the exact value (the browser test reads it)."""
    return (f'<tr data-part="{part}"><td>{label}</td><td style="text-align:right;'
            f'padding-left:16px" data-value="{value!r}">{text}</td></tr>')


def plan_html(plan: dict, n_experts: int, top_k: int, batch_size: int, ep_size: int) -> str:
    """The explorer's table for one plan."""
    gpus = "one GPU" if ep_size == 1 else f"{ep_size} GPUs"
    rows = [
        _row("total", "parameters in all", plan["total"], f"{plan['total'] / 1e9:,.2f} B"),
        _row("active", f"parameters per token ({top_k} of {n_experts} experts)",
             plan["active"], f"{plan['active'] / 1e9:,.2f} B"),
        _row("state_per_gpu", f"training state per GPU, experts over {gpus}",
             plan["state_per_gpu"], f"{plan['state_per_gpu'] / 1e9:,.1f} GB"),
        _row("a2a_bytes", f"all-to-all per MoE block, per GPU ({TOKENS_PER_RANK:,} tokens)",
             plan["a2a_bytes"], f"{plan['a2a_bytes'] / 1e6:,.1f} MB"),
        _row("a2a_seconds", "... its time on the H100 node's links", plan["a2a_seconds"],
             f"{plan['a2a_seconds'] * 1e3:,.2f} ms"),
        _row("expert_seconds", "... the experts' forward at the bf16 peak",
             plan["expert_seconds"], f"{plan['expert_seconds'] * 1e3:,.2f} ms"),
        _row("touched", f"experts a decode step of {batch_size:,} reads, per layer",
             plan["touched"], f"{plan['touched']:,.1f} of {n_experts}"),
        _row("decode_bytes", "weight bytes of that step (bf16)", plan["decode_bytes"],
             f"{plan['decode_bytes'] / 1e9:,.1f} GB"),
        _row("cache_bytes", f"KV cache of the batch ({CONTEXT:,} tokens each)",
             plan["cache_bytes"], f"{plan['cache_bytes'] / 1e9:,.1f} GB"),
        _row("moe_tokens", f"tokens/s, this MoE on {gpus}", plan["moe_tokens"],
             f"{plan['moe_tokens']:,.0f}"),
        _row("dense_total_tokens", "tokens/s, dense of the same total", plan["dense_total_tokens"],
             f"{plan['dense_total_tokens']:,.0f}"),
        _row("dense_active_tokens", "tokens/s, dense of the same active size",
             plan["dense_active_tokens"], f"{plan['dense_active_tokens']:,.0f}"),
    ]
    # the whole memory, no reserve (lesson 08's plans keep 10%; section 7 says so)
    fits = (f"decode's bf16 weights and KV cache fit in the whole memory of {gpus}"
            if plan["decode_fits"] else f"decode's bf16 weights and KV cache do not fit in "
            f"the whole memory of {gpus}: more GPUs or a smaller batch")
    colour = FITS_COLOUR if plan["decode_fits"] else MISSES_COLOUR
    return ('<div class="ctc-moe" style="font-size:15px;line-height:1.5">'
            '<table style="border-collapse:collapse;min-width:520px">' + "".join(rows)
            + f'</table><div data-fits="{str(plan["decode_fits"]).lower()}" '
            f'style="font-weight:bold;color:{colour}">'
            f'{fits}</div></div>')


def experts_explorer(models: dict[str, dict], gpu: dict, node: dict) -> widgets.VBox:
    """A panel of controls and the counts they give, updated as the controls move.

    Args:
        models: ``models.json``'s ``"moe_models"``.
        gpu: the GPU of every count (``hardware.json``'s H100 SXM in the lesson).
        node: ``interconnects.json``'s ``"H100 SXM node"``.

    Returns:
        The panel (display it).
    """
    def control(widget: widgets.DOMWidget, name: str) -> widgets.DOMWidget:
        widget.add_class(f"ctc-{name}")  # a handle for the browser test
        widget.style.description_width = "170px"
        if isinstance(widget, widgets.SelectionSlider):  # its readout takes no typing: the
            widget.add_class("ctc-choice-slider")  # lab's style (grader/lab/labextension) says so
        widget.layout.width = "560px"
        return widget

    sizes = [2**i for i in range(11)]
    model = control(widgets.Dropdown(options=list(models), value="Mixtral 8x7B",
                                     description="model"), "model")
    experts = control(widgets.SelectionSlider(options=sizes[1:9], value=8,
                                              description="experts per layer"), "experts")
    top_k = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=2,
                                            description="top_k"), "top-k")
    batch = control(widgets.SelectionSlider(options=sizes, value=1,
                                            description="decode batch"), "batch")
    ep = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=2,
                                         description="GPUs (ep size)"), "ep")
    heading, shown = widgets.HTML(), widgets.HTML()
    busy = []  # set while the controls are being adjusted: one update at the end

    def update(_change: object = None) -> None:
        if busy:
            return
        busy.append(True)
        try:  # top_k and the GPUs cannot exceed the experts; new options keep the value
            for widget, choices in ((top_k, (1, 2, 4, 8, 16)), (ep, (1, 2, 4, 8, 16, 32, 64))):
                kept = widget.value
                widget.options = [n for n in choices if n <= experts.value]
                widget.value = min(kept, max(widget.options))
        finally:
            busy.clear()
        shape = models[model.value]
        plan = moe_plan(shape, experts.value, top_k.value, batch.value, ep.value, gpu, node)
        heading.value = (f"<b>{model.value}</b> (as published: {shape['n_experts']} experts, "
                         f"top {shape['top_k']}, {shape['n_shared_experts']} shared), counted "
                         "as every block an MoE block; H100 SXM, bf16, a context of 1,024")
        shown.value = plan_html(plan, experts.value, top_k.value, batch.value, ep.value)

    def reset(_change: object = None) -> None:  # a new model: its own experts and top_k
        shape = models[model.value]
        busy.append(True)
        try:
            experts.value = shape["n_experts"]
            top_k.options = [k for k in (1, 2, 4, 8, 16) if k <= experts.value]
            top_k.value = shape["top_k"]  # the GPUs stay as they were (update keeps them)
        finally:
            busy.clear()
        update()

    model.observe(reset, names="value")
    for widget in (experts, top_k, batch, ep):
        widget.observe(update, names="value")
    update()
    return widgets.VBox([model, experts, top_k, batch, ep, heading, shown])
