"""Lesson 07's explorer: a training run split over H100 nodes, what one GPU holds and sends.

``plan_html`` shows one ``parallel_plan`` (solutions/parallel_plan.py, which counts it);
``parallel_explorer`` is the ipywidgets panel the notebook shows, whose first settings are the
last layout of the lesson's table: Llama 3 70B on 1024 GPUs, 32 data-parallel copies with
ZeRO-1, tensor parallelism 8, 4 pipeline stages, 64 micro-batches of one sequence of 8192
tokens per copy, 40% MFU.
"""

from __future__ import annotations

import ipywidgets as widgets

from solutions.parallel_plan import parallel_plan

# The colour of JupyterLab's text where there is one (light or dark theme), black elsewhere.
LINE_COLOUR = "var(--jp-ui-font-color0, black)"

PLAN_PARTS = {"weights": ("weights (bf16)", "#0072B2"),
              "gradients": ("gradients", "#56B4E9"),
              "optimizer": ("fp32 master weights, Adam m and v", "#E69F00"),
              "activations": ("activations", "#CC79A7")}
EXPLORER_MODELS = ("Llama 2 7B", "Llama 3 70B", "Llama 3.1 405B")
ZERO_STAGES_SHOWN = (("0: nothing sharded", 0), ("1: optimizer state", 1),
                     ("2: and gradients", 2), ("3: and weights", 3))


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.1f} GB"


def _seconds(value: float) -> str:
    return f"{value * 1e3:,.0f} ms" if value < 1 else f"{value:,.2f} s"


def _overlap_words(plan: dict) -> str:
    """What the data-parallel traffic can hide behind, in words."""
    stage, keep, micro = plan["zero_stage"], plan["keep_unsharded"], plan["microbatches"]
    if stage == 3 and not keep:
        return "the forward and backward passes of every micro-batch"
    backward = ("the backward pass" if micro == 1 else
                "the backward pass of every micro-batch" if stage == 2 and not keep else
                "the backward pass of the last micro-batch")
    if stage == 0:
        return backward if micro == 1 else f"{backward} only"
    if stage == 3:  # keeping whole: gathered once, for the first forward pass
        return (f"{backward} for the reduce-scatter and the step's first forward pass for the "
                "all-gather")
    if plan["overlap_param_gather"]:
        return (f"{backward} for the reduce-scatter and the next step's first forward pass for "
                "the all-gather of the updated weights (Megatron-LM's overlap_param_gather)")
    return (f"{backward} for the reduce-scatter and nothing for the all-gather of the updated "
            "weights, which waits for the optimizer step (DeepSpeed's ZeRO-1/2, Megatron-LM's "
            "default)")


def plan_html(plan: dict, gpu_name: str, gpu_bytes: float) -> str:
    """The explorer's readout for one plan: memory per GPU against the GPU (a dashed line
    marks the GPU's memory on the bar), traffic per step and its time, whether the
    data-parallel traffic hides, the bubble and the step. Exact values ride in ``data-``
    attributes (the browser test reads them)."""
    total = plan["memory_total"]
    scale = max(total, gpu_bytes)
    rows, bar = [], []
    grad_label = f"gradients ({'bf16' if plan['bytes_per_grad'] == 2 else 'fp32'})"
    for part, n_bytes in plan["memory"].items():
        label, colour = PLAN_PARTS[part]
        label = grad_label if part == "gradients" else label
        rows.append(f'<tr data-part="{part}"><td><span style="color:{colour}">&#9632;</span> '
                    f'{label}</td><td style="text-align:right" data-bytes="{n_bytes}">'
                    f"{_gb(n_bytes)}</td></tr>")
        bar.append(f'<div style="width:{100 * n_bytes / scale:.3f}%;background:{colour}"></div>')
    line = 100 * gpu_bytes / scale
    verdict = (f"fits on one {gpu_name}, {_gb(gpu_bytes - total)} to spare" if plan["fits"] else
               f"does not fit on one {gpu_name}: {_gb(total - gpu_bytes)} too much")
    wire = []
    cell = 'style="padding:0 0 0 10px;text-align:right;white-space:nowrap"'
    for kind, label in (("data", "data parallel (gradients, ZeRO)"),
                        ("tensor", "tensor parallel (activations)"),
                        ("pipeline", "pipeline (stage boundaries)")):
        sent = plan["traffic"][kind]
        link = plan["links"][kind] if sent else "-"
        wire.append(f'<tr data-traffic="{kind}"><td>{label}</td>'
                    f'<td {cell} data-bytes="{sent}">{_gb(sent)}</td><td {cell}>{link}</td>'
                    f'<td {cell}>{_seconds(plan["seconds"][kind])}</td></tr>')
    data_seconds, overlapped = plan["seconds"]["data"], plan["overlapped_seconds"]
    if not plan["traffic"]["data"]:
        hides = "Data-parallel traffic: none (one copy)."
    elif plan["hidden"]:
        hides = (f"Data-parallel traffic hides: its {_seconds(data_seconds)} overlap "
                 f"{_seconds(overlapped)} of compute, {_overlap_words(plan)}.")
    else:
        only = "only " if overlapped < data_seconds else ""
        hides = (f"Data-parallel traffic does not hide: its {_seconds(data_seconds)} overlap "
                 f"{only}{_seconds(overlapped)} of compute, {_overlap_words(plan)}; "
                 f"{_seconds(plan['exposed_seconds'])} of it add to the step.")
    if not plan["traffic"]["data"]:
        threshold = ""
    elif plan["min_tokens_to_hide"] == float("inf"):
        threshold = " No size of micro-batch hides it: nothing overlaps the all-gather."
    else:
        threshold = (f" It hides from {plan['min_tokens_to_hide']:,.0f} tokens per "
                     f"micro-batch; this run has {plan['tokens_per_microbatch']:,}.")
    column = '<div style="width:390px">'
    return (
        '<div class="ctc-plan" style="font-size:14px;line-height:1.4">'
        f'<p data-gpus="{plan["gpus"]}" style="margin:0 0 6px 0"><b>{plan["gpus"]:,} '
        f'GPU{"s" if plan["gpus"] != 1 else ""}</b> in {plan["nodes"]:,} '
        f'node{"s" if plan["nodes"] != 1 else ""}; {plan["n_params"] / 1e9:,.1f} billion '
        'parameters; '
        f'{plan["tokens_per_step"]:,} tokens per step</p>'
        # two columns side by side where the notebook is wide enough: memory and the
        # step, then the traffic and whether it hides
        '<div style="display:flex;flex-wrap:wrap;align-items:flex-start;gap:0 16px">'
        + column + '<table style="border-collapse:collapse;width:100%">' + "".join(rows)
        + f'<tr data-part="total"><td><b>one GPU holds</b></td><td style="text-align:right" '
        f'data-bytes="{total}"><b>{_gb(total)}</b></td></tr></table>'
        '<div style="position:relative;width:100%;height:18px;margin:10px 0 4px 0;'
        'border:1px solid #444;display:flex">' + "".join(bar)
        + f'<div data-line="{gpu_bytes!r}" style="position:absolute;left:{line:.3f}%;top:-5px;'
        f'height:26px;border-left:3px dashed {LINE_COLOUR}"></div></div>'
        f'<p data-fits="{str(plan["fits"]).lower()}">{verdict} (the dashed line: '
        f'{_gb(gpu_bytes)}, in the label\'s gigabytes of 1e9 bytes)</p>'
        f'<p data-step="{plan["step_seconds"]!r}">Pipeline bubble {plan["bubble"]:.1%}; '
        f'<b>step {_seconds(plan["step_seconds"])}</b> (compute '
        f'{_seconds(plan["compute_seconds"])} at this MFU).</p></div>'
        + column + '<table style="border-collapse:collapse;width:100%"><tr>'
        '<th style="text-align:left;white-space:nowrap">traffic per GPU per step</th>'
        '<th>bytes</th><th>link</th>'
        "<th>time</th></tr>" + "".join(wire) + "</table>"
        f'<p data-hidden="{str(plan["hidden"]).lower()}">{hides}{threshold}</p></div></div></div>'
    )


def parallel_explorer(models: dict, accelerators: dict, node: dict) -> widgets.VBox:
    """The panel: model, degrees of data, tensor and pipeline parallelism, ZeRO stage and
    whether it keeps gradients and weights whole across micro-batches, when ZeRO-1/2 gather
    the updated weights (``overlap_param_gather``), the gradients' width,
    micro-batches, sequence length, MFU and checkpointing; the readout of ``plan_html``
    under them. Controls and readout each take two columns where the notebook is wide
    enough, so that in a 1280x720 window a student sees the readout change as a control
    moves. ``children``: the controls (a box of two columns), then the readout."""

    def control(widget: widgets.Widget, name: str) -> widgets.Widget:
        widget.style = {"description_width": "160px"}
        widget.layout = widgets.Layout(width="390px")
        widget.add_class(f"ctc-{name}")
        if isinstance(widget, widgets.SelectionSlider):  # its readout takes no typing: the
            widget.add_class("ctc-choice-slider")  # lab's style (grader/lab/labextension) says so
        return widget

    model = control(widgets.Dropdown(options=[m for m in EXPLORER_MODELS if m in models],
                                     value="Llama 3 70B", description="model"), "model")
    dp = control(widgets.SelectionSlider(options=[2**k for k in range(11)], value=32,
                                         description="data parallel (dp)"), "dp")
    # A dropdown, as the model's: its label lines up with the others' (a row of toggle
    # buttons puts its label out of line).
    zero = control(widgets.Dropdown(options=ZERO_STAGES_SHOWN, value=1,
                                    description="ZeRO stage"), "zero")
    keep = control(widgets.Dropdown(options=[("sharded as the stage says", False),
                                             ("gradients and weights whole", True)],
                                    value=False, description="across micro-batches"), "keep")
    gather = control(widgets.Dropdown(options=[("after the optimizer step", False),
                                               ("with the next forward pass", True)],
                                      value=False, description="new weights' all-gather"),
                     "gather")
    grads = control(widgets.Dropdown(options=[("bf16, 2 bytes each", 2),
                                              ("fp32, 4 bytes each", 4)],
                                     value=2, description="gradients"), "grads")
    tp = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=8,
                                         description="tensor parallel (tp)"), "tp")
    pp = control(widgets.SelectionSlider(options=[2**k for k in range(6)], value=4,
                                         description="pipeline stages (pp)"), "pp")
    micro = control(widgets.SelectionSlider(options=[2**k for k in range(8)], value=64,
                                            description="micro-batches per step"), "micro")
    micro_size = control(widgets.SelectionSlider(options=[1, 2, 4, 8], value=1,
                                                 description="micro-batch size"),
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
                             gpu["memory_bytes"], node, keep_unsharded=keep.value,
                             bytes_per_grad=grads.value,
                             overlap_param_gather=gather.value)
        shown.value = plan_html(plan, "H100 SXM", gpu["memory_bytes"])

    # the run's shape, then what each GPU keeps and sends
    columns = ([model, dp, tp, pp, micro, micro_size, seq_len],
               [zero, keep, gather, grads, mfu, checkpointing])
    for widget in (*columns[0], *columns[1]):
        widget.observe(update, names="value")
    update()
    controls = widgets.Box([widgets.VBox(column) for column in columns], layout=widgets.Layout(
        display="flex", flex_flow="row wrap", align_items="flex-start", grid_gap="0 16px"))
    return widgets.VBox([controls, shown])
