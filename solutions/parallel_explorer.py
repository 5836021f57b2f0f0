"""Lesson 07's explorer: a training run split over H100 nodes, counted per GPU.

``parallel_plan`` counts, for one GPU of a run split ``dp`` ways by data (with a ZeRO stage),
``tp`` ways by tensor parallelism and ``pp`` ways by pipeline stages, what it holds in memory,
what it sends per step and how long a step takes at a chosen MFU. Every number comes from the
lesson's functions (``zero_bytes_per_device``, ``zero_comm_bytes``, ``tensor_parallel_bytes``,
``pipeline_bubble_fraction``, ``min_tokens_to_hide_allreduce``), lesson 05's
``activation_bytes_per_layer`` and lesson 04's ``model_params``. ``parallel_explorer`` is the
ipywidgets panel the notebook shows.

The run's layout, as Megatron-LM lays it out: GPUs are numbered with the tensor-parallel rank
fastest, then the data-parallel rank, then the pipeline stage; a node holds 8 consecutive GPUs.
A group whose GPUs all sit in one node talks over NVLink; any other group over the NICs, one per
GPU. Assumptions, each stated where it is used: bf16 weights and gradients with fp32 master
weights and AdamW moments (2 + 2 + 12 bytes per parameter, the ZeRO paper's); layers split
evenly over the stages; activations counted by Korthikanti et al.'s formula (lesson 05), which
assumes multi-head attention and a GELU MLP of width 4d (Llama's grouped-query attention and
SwiGLU MLP keep somewhat different amounts), without stored scores (FlashAttention) and split
over the tensor-parallel ranks (Megatron's sequence parallelism); a 1F1B schedule; ZeRO-3
gathering the weights once for the forward passes and once for the backward passes of a step,
however many micro-batches it holds (FSDP with gradient accumulation gathers them again for
every micro-batch unless told to keep them).
"""

from __future__ import annotations

import math

import ipywidgets as widgets

from solutions.backprop import model_params
from solutions.memory import activation_bytes_per_layer
from solutions.parallel import (
    min_tokens_to_hide_allreduce,
    pipeline_bubble_fraction,
    tensor_parallel_bytes,
    zero_bytes_per_device,
    zero_comm_bytes,
)

# Bytes per parameter of each part, as (weights, gradients, optimizer state) for
# zero_bytes_per_device: bf16 weights, bf16 gradients, fp32 master weights + Adam m + v.
PART_BYTES = {"weights": (2, 0, 0), "gradients": (0, 2, 0), "optimizer": (0, 0, 12)}
PLAN_PARTS = {"weights": ("weights (bf16)", "#0072B2"),
              "gradients": ("gradients (bf16)", "#56B4E9"),
              "optimizer": ("fp32 master weights, Adam m and v", "#E69F00"),
              "activations": ("activations", "#CC79A7")}
EXPLORER_MODELS = ("Llama 2 7B", "Llama 3 70B", "Llama 3.1 405B")


def parallel_plan(shape: dict, dp: int, tp: int, pp: int, zero_stage: int, microbatches: int,
                  micro_batch_size: int, seq_len: int, mfu: float, checkpointing: bool,
                  peak_flops: float, gpu_bytes: float, node: dict) -> dict:
    """One GPU's share of a training step split dp x tp x pp ways.

    Memory: the ``model_params`` of ``shape``, divided over tp x pp (each GPU holds its stage's
    layers, each matrix split tp ways), then held as ZeRO ``zero_stage`` holds it over the dp
    ranks. Activations: the stage's layers, ``activation_bytes_per_layer`` with no scores
    stored, divided by tp, for the micro-batches in flight at once (1F1B: at most pp of them, so
    the first stage keeps as many activations as the whole model does for one micro-batch);
    with ``checkpointing`` only each layer's input is kept, plus one layer's activations.

    Traffic per step, per GPU: data parallel ``zero_comm_bytes`` of the GPU's parameters over
    dp; tensor parallel ``tensor_parallel_bytes`` per layer and micro-batch (one and a half
    times with checkpointing, which runs the forward's two all-reduces again); pipeline: each
    micro-batch's activation sent on and its gradient sent back at each stage boundary, split
    over tp.

    Time per step: the FLOPs (6 N per token, 8 N with checkpointing; attention's matmuls left
    out, as 6ND does) at ``mfu`` x ``peak_flops``, and tensor parallelism's all-reduces, which
    wait for each layer, both stretched by the pipeline's bubble; plus the data-parallel
    traffic that the backward pass (4 N per token) does not hide. Pipeline sends are small and
    overlap the next micro-batch's compute: counted in bytes, not in time.

    Returns:
        ``gpus``, ``nodes``, ``n_params``; ``memory`` (bytes per part, ints) and
        ``memory_total``; ``traffic`` and ``seconds`` per kind (``"data"``, ``"tensor"``,
        ``"pipeline"``) with ``links`` (``"NVLink"`` or ``"NIC"``); ``bubble``;
        ``compute_seconds``, ``backward_seconds``, ``step_seconds``; ``tokens_per_step``;
        ``min_tokens_to_hide`` (tokens per data-parallel replica per step, at this MFU) and
        ``tokens_per_replica``; ``hidden`` (whether the data-parallel traffic hides). Under
        ZeRO-3 the threshold is 1.5 times ``min_tokens_to_hide_allreduce``'s, since its
        traffic is 1.5 times an all-reduce's.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches),
                        ("micro_batch_size", micro_batch_size), ("seq_len", seq_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if tp > node["gpus_per_node"]:
        raise ValueError(f"tp={tp}: tensor parallelism stays inside a node of "
                         f"{node['gpus_per_node']} GPUs")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    n_params = model_params(shape)
    n_layers, d, heads = shape["n_layers"], shape["d_model"], shape["n_heads"]
    shard = -(-n_params // (tp * pp))  # this GPU's parameters, before ZeRO
    memory = {part: zero_bytes_per_device(shard, dp, zero_stage, *widths)
              for part, widths in PART_BYTES.items()}
    layers = -(-n_layers // pp)
    in_flight = min(pp, microbatches)
    one_layer = activation_bytes_per_layer(seq_len, micro_batch_size, d, heads, 2,
                                           recompute_attention=True,
                                           dropout=shape.get("dropout", True))
    if checkpointing:
        kept = 2 * seq_len * micro_batch_size * d  # each layer's bf16 input
        activations = (layers * in_flight * kept + one_layer) / tp
    else:
        activations = layers * in_flight * one_layer / tp
    memory["activations"] = math.ceil(activations)

    per_node = node["gpus_per_node"]
    links = {"tensor": "NVLink", "data": "NVLink" if tp * dp <= per_node else "NIC",
             "pipeline": "NVLink" if tp * dp * pp <= per_node else "NIC"}
    bandwidth = {"NVLink": node["nvlink_bytes_per_s"], "NIC": node["nic_bytes_per_s"]}
    activation_bytes = micro_batch_size * seq_len * d * 2
    traffic = {
        "data": zero_comm_bytes(shard, dp, zero_stage, bytes_per_param=2),
        "tensor": (tensor_parallel_bytes(micro_batch_size, seq_len, d, tp, 2) * layers
                   * microbatches * (3 if checkpointing else 2) // 2),
        "pipeline": 0 if pp == 1 else 2 * microbatches * activation_bytes // tp,
    }
    seconds = {kind: traffic[kind] / bandwidth[links[kind]] for kind in traffic}

    tokens_per_replica = microbatches * micro_batch_size * seq_len
    rate = mfu * peak_flops
    flops_per_token = (8 if checkpointing else 6) * n_params
    compute = flops_per_token * tokens_per_replica / (tp * pp) / rate
    backward = 4 * n_params * tokens_per_replica / (tp * pp) / rate
    bubble = pipeline_bubble_fraction(pp, microbatches)
    exposed = max(0.0, seconds["data"] - backward)
    step = (compute + seconds["tensor"]) / (1 - bubble) + exposed
    return {
        "gpus": dp * tp * pp, "nodes": math.ceil(dp * tp * pp / per_node),
        "n_params": n_params, "memory": memory, "memory_total": sum(memory.values()),
        "fits": sum(memory.values()) <= gpu_bytes,
        "traffic": traffic, "seconds": seconds, "links": links, "bubble": bubble,
        "compute_seconds": compute, "backward_seconds": backward, "step_seconds": step,
        "tokens_per_step": dp * tokens_per_replica, "tokens_per_replica": tokens_per_replica,
        "min_tokens_to_hide": (1.5 if zero_stage == 3 else 1) * min_tokens_to_hide_allreduce(
            rate, bandwidth[links["data"]], dp),
        "hidden": seconds["data"] <= backward,
    }


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.1f} GB"


def _seconds(value: float) -> str:
    return f"{value * 1e3:,.0f} ms" if value < 1 else f"{value:,.2f} s"


def plan_html(plan: dict, gpu_name: str, gpu_bytes: float) -> str:
    """The explorer's readout for one plan: memory per GPU against the GPU, traffic per step
    and its time, the bubble and the step. Exact values ride in ``data-`` attributes (the
    browser test reads them)."""
    total = plan["memory_total"]
    scale = max(total, gpu_bytes)
    rows, bar = [], []
    for part, n_bytes in plan["memory"].items():
        label, colour = PLAN_PARTS[part]
        rows.append(f'<tr data-part="{part}"><td><span style="color:{colour}">&#9632;</span> '
                    f'{label}</td><td style="text-align:right" data-bytes="{n_bytes}">'
                    f"{_gb(n_bytes)}</td></tr>")
        bar.append(f'<div style="width:{100 * n_bytes / scale:.3f}%;background:{colour}"></div>')
    verdict = (f"fits on one {gpu_name}" if plan["fits"] else
               f"does not fit on one {gpu_name}: {_gb(total - gpu_bytes)} too much")
    wire = []
    cell = 'style="padding:0 12px;text-align:right"'
    for kind, label in (("data", "data parallel (gradients, ZeRO)"),
                        ("tensor", "tensor parallel (activations)"),
                        ("pipeline", "pipeline (stage boundaries)")):
        sent = plan["traffic"][kind]
        link = plan["links"][kind] if sent else "-"
        wire.append(f'<tr data-traffic="{kind}"><td>{label}</td>'
                    f'<td {cell} data-bytes="{sent}">{_gb(sent)}</td><td {cell}>{link}</td>'
                    f'<td {cell}>{_seconds(plan["seconds"][kind])}</td></tr>')
    hides = ("hides behind the backward pass" if plan["hidden"] else
             "does not hide: the backward pass is shorter")
    return (
        '<div class="ctc-plan" style="font-size:15px;line-height:1.5">'
        f'<p data-gpus="{plan["gpus"]}"><b>{plan["gpus"]:,} GPUs</b> in {plan["nodes"]:,} '
        f'node(s); {plan["n_params"] / 1e9:,.1f} billion parameters; '
        f'{plan["tokens_per_step"]:,} tokens per step</p>'
        '<table style="border-collapse:collapse;min-width:420px">' + "".join(rows)
        + f'<tr data-part="total"><td><b>one GPU holds</b></td><td style="text-align:right" '
        f'data-bytes="{total}"><b>{_gb(total)}</b></td></tr></table>'
        f'<div style="display:flex;height:18px;width:420px;border:1px solid #444">'
        + "".join(bar) + "</div>"
        f'<p data-fits="{str(plan["fits"]).lower()}">{verdict} ({_gb(gpu_bytes)})</p>'
        '<table style="border-collapse:collapse;min-width:420px"><tr><th style="text-align:left">'
        "traffic per GPU per step</th><th>bytes</th><th>link</th><th>time</th></tr>"
        + "".join(wire) + "</table>"
        f'<p data-hidden="{str(plan["hidden"]).lower()}">Data-parallel traffic {hides} '
        f'({_seconds(plan["seconds"]["data"])} against {_seconds(plan["backward_seconds"])}); '
        f'it would hide from {plan["min_tokens_to_hide"]:,.0f} tokens per replica per step, '
        f'this run has {plan["tokens_per_replica"]:,}.</p>'
        f'<p data-step="{plan["step_seconds"]!r}">Pipeline bubble {plan["bubble"]:.1%}; '
        f'<b>step {_seconds(plan["step_seconds"])}</b> (compute '
        f'{_seconds(plan["compute_seconds"])} at this MFU).</p></div>'
    )


def parallel_explorer(models: dict, accelerators: dict, node: dict) -> widgets.VBox:
    """The panel: model, degrees of data, tensor and pipeline parallelism, ZeRO stage,
    micro-batches, sequence length, MFU and checkpointing; the readout of ``plan_html``."""

    def control(widget: widgets.Widget, name: str) -> widgets.Widget:
        widget.style = {"description_width": "200px"}
        widget.layout = widgets.Layout(width="620px")
        widget.add_class(f"ctc-{name}")
        return widget

    model = control(widgets.Dropdown(options=[m for m in EXPLORER_MODELS if m in models],
                                     value="Llama 3 70B", description="model"), "model")
    dp = control(widgets.SelectionSlider(options=[2**k for k in range(11)], value=32,
                                         description="data parallel (dp)"), "dp")
    zero = control(widgets.ToggleButtons(options=[0, 1, 2, 3], value=1,
                                         description="ZeRO stage"), "zero")
    tp = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=8,
                                         description="tensor parallel (tp)"), "tp")
    pp = control(widgets.SelectionSlider(options=[2**k for k in range(6)], value=4,
                                         description="pipeline stages (pp)"), "pp")
    micro = control(widgets.SelectionSlider(options=[2**k for k in range(8)], value=16,
                                            description="micro-batches per step"), "micro")
    micro_size = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=1,
                                                 description="sequences per micro-batch"),
                         "micro-size")
    seq_len = control(widgets.SelectionSlider(options=[2048, 4096, 8192], value=8192,
                                              description="sequence length"), "seq")
    mfu = control(widgets.FloatSlider(value=0.4, min=0.1, max=0.8, step=0.05,
                                      description="MFU"), "mfu")
    checkpointing = control(widgets.Checkbox(value=False, description="activation "
                                             "checkpointing"), "checkpointing")
    shown = widgets.HTML()
    gpu = accelerators["H100 SXM"]

    def update(_change: object = None) -> None:
        plan = parallel_plan(models[model.value], dp.value, tp.value, pp.value, zero.value,
                             micro.value, micro_size.value, seq_len.value, mfu.value,
                             checkpointing.value, gpu["peak_flops"]["bf16"],
                             gpu["memory_bytes"], node)
        shown.value = plan_html(plan, "H100 SXM", gpu["memory_bytes"])

    controls = [model, dp, zero, tp, pp, micro, micro_size, seq_len, mfu, checkpointing]
    for widget in controls:
        widget.observe(update, names="value")
    update()
    return widgets.VBox([*controls, shown])
