"""Lesson 05's explorer: the memory budget of a training run, one GPU's share of it.

``memory_budget`` adds up, for one GPU, what lesson 05 counts: the weights, gradients and AdamW
state of ``training_memory`` for a recipe, sharded over the GPUs, and the activations of
``activation_bytes_per_layer`` for the GPU's own batch. ``memory_budget_explorer`` is the
ipywidgets panel the notebook shows: a model from ``models.json``, a recipe, the sequence
length, the batch, activation checkpointing, FlashAttention, the number of GPUs and the GPU
from ``hardware.json``; every number it shows comes from ``memory_budget`` and lesson 04's
``model_params``.
"""

from __future__ import annotations

import math
import operator

import ipywidgets as widgets

from solutions.backprop import model_params
from solutions.memory import activation_bytes_per_layer, training_memory

# Colours from JupyterLab's theme where there is one (light or dark), these elsewhere: a line of
# the text's colour, and green or red for whether the plan fits.
LINE_COLOUR = "var(--jp-ui-font-color0, black)"
FITS_COLOUR = "var(--jp-success-color1, #007a33)"
MISSES_COLOUR = "var(--jp-error-color1, #b00020)"

# Each component of a budget: its label and colour (the colours of the lesson's memory bars).
BUDGET_PARTS = {"params": ("weights", "#0072B2"), "grads": ("gradients", "#56B4E9"),
                "master_params": ("fp32 master weights", "#009E73"),
                "adam_m": ("Adam m", "#E69F00"), "adam_v": ("Adam v", "#D55E00"),
                "quantization_scales": ("int8 scales", "#000000"),
                "activations": ("activations", "#CC79A7")}


def memory_budget(n_params: int, n_layers: int, d_model: int, n_heads: int, recipe: str,
                  seq_len: int, batch: int, checkpointing: bool, n_gpus: int,
                  flash_attention: bool = False, dropout: bool = True) -> dict[str, int]:
    """Bytes one GPU holds at the peak of a training step, per component.

    The weights, gradients and optimizer state of ``training_memory(n_params, recipe)`` are
    sharded over the GPUs as ZeRO stage 3 (PyTorch's FSDP) shards them: each GPU keeps
    1/n_gpus of every component, rounded up. The activations are not sharded: each GPU runs the
    forward and backward pass of its own ``batch`` sequences of ``seq_len`` tokens (data
    parallelism), and keeps ``activation_bytes_per_layer`` per layer (Korthikanti et al., with
    dropout masks where the model has dropout; 16-bit activations in the mixed recipes, 4-byte
    ones in "fp32"). With
    ``checkpointing`` each layer keeps only its input, e*s*b*h bytes, and one layer's full
    activations are rebuilt at a time in the backward pass. With ``flash_attention`` the
    attention scores are never stored. Left out: the logits and the loss, temporary buffers, the
    CUDA context, the communication buffers of sharding and the allocator's spare memory.

    Args:
        n_params: parameters of the model (>= 0).
        n_layers, d_model, n_heads: the model's shape (>= 1).
        recipe: ``"fp32"``, ``"mixed_bf16"`` or ``"adam8bit"`` (``training_memory``).
        seq_len, batch: tokens per sequence and sequences per GPU (>= 0).
        checkpointing: whether every layer runs under activation checkpointing.
        n_gpus: GPUs the training state is sharded over (>= 1).
        flash_attention: whether attention runs as one fused kernel that stores no scores.
        dropout: whether the model has dropout (``models.json``'s ``dropout``): its masks and
            the dropped copy of the softmax output are kept too.

    Returns:
        ``training_memory``'s components, each divided over the GPUs, then ``"activations"``;
        ints that add up to one GPU's total.
    """
    n_gpus, n_layers = operator.index(n_gpus), operator.index(n_layers)
    if n_gpus < 1 or n_layers < 1:
        raise ValueError(f"n_gpus and n_layers must be >= 1, got {n_gpus} and {n_layers}")
    budget = {part: -(-n_bytes // n_gpus)  # rounded up: no GPU holds a fraction of a byte
              for part, n_bytes in training_memory(n_params, recipe).items()}
    e = 4 if recipe == "fp32" else 2  # bytes of one stored activation value
    one_layer = activation_bytes_per_layer(seq_len, batch, d_model, n_heads, e,
                                           recompute_attention=flash_attention, dropout=dropout)
    if checkpointing:
        budget["activations"] = n_layers * e * seq_len * batch * d_model + one_layer
    else:
        budget["activations"] = n_layers * one_layer
    return budget


def smallest_gpu_count(n_params: int, n_layers: int, d_model: int, n_heads: int, recipe: str,
                       seq_len: int, batch: int, checkpointing: bool, gpu_bytes: float,
                       flash_attention: bool = False, dropout: bool = True) -> int | None:
    """The fewest GPUs of ``gpu_bytes`` each such that ``memory_budget`` fits on every one;
    None when no number of GPUs is enough (the activations of one GPU's batch do not fit)."""
    shape = (n_params, n_layers, d_model, n_heads, recipe, seq_len, batch, checkpointing)

    def total(n_gpus: int) -> int:
        return sum(memory_budget(*shape, n_gpus, flash_attention, dropout).values())

    whole = memory_budget(*shape, 1, flash_attention, dropout)
    activations = whole.pop("activations")
    room = gpu_bytes - activations
    # However many GPUs, each holds at least one byte of every component that is not empty.
    if room < sum(n_bytes > 0 for n_bytes in whole.values()):
        return None
    n_gpus = max(1, math.ceil(sum(whole.values()) / room))  # too few only by rounding up
    while total(n_gpus) > gpu_bytes:
        n_gpus += 1
    return n_gpus


def _gb(n_bytes: float) -> str:
    """Bytes as decimal gigabytes (1e9 bytes), as the explorer shows them and as a GPU's label
    reads: an H100's 80 GB is 80e9 bytes in every budget of the course."""
    return f"{n_bytes / 1e9:,.1f} GB"


def budget_html(budget: dict[str, int], gpu_name: str, gpu_bytes: float,
                n_gpus_needed: int | None) -> str:
    """The explorer's table and bar for one budget. Each value carries its exact bytes in a
    ``data-bytes`` attribute (the browser test reads them)."""
    total = sum(budget.values())
    scale = max(total, gpu_bytes)
    rows, segments = [], []
    for part, n_bytes in budget.items():
        label, colour = BUDGET_PARTS[part]
        rows.append(f'<tr data-part="{part}"><td><span style="color:{colour}">&#9632;</span> '
                    f'{label}</td><td style="text-align:right" data-bytes="{n_bytes}" '
                    f'title="{n_bytes:,} bytes">{_gb(n_bytes)}</td></tr>')
        segments.append(f'<div style="width:{100 * n_bytes / scale:.3f}%;background:{colour}">'
                        "</div>")
    fits = total <= gpu_bytes
    if fits:
        verdict = f"fits on one {gpu_name}, {_gb(gpu_bytes - total)} to spare"
    elif n_gpus_needed is None:
        verdict = (f"does not fit: the activations of this batch alone exceed one "
                   f"{gpu_name}; checkpoint, shorten the sequences or cut the batch")
    else:
        verdict = (f"does not fit: {_gb(total - gpu_bytes)} too much; with this batch it fits "
                   f"when sharded over {n_gpus_needed:,} GPUs")
    capacity_left = 100 * gpu_bytes / scale
    return (
        '<div class="ctc-budget" style="font-size:15px;line-height:1.5">'
        '<table style="border-collapse:collapse;min-width:380px">' + "".join(rows)
        + f'<tr data-part="total" style="font-weight:bold;border-top:1px solid #888">'
        f'<td>total per GPU</td><td style="text-align:right" data-bytes="{total}" '
        f'title="{total:,} bytes">{_gb(total)}</td></tr>'
        f'<tr data-part="capacity"><td>one {gpu_name}, as labelled</td>'
        f'<td style="text-align:right" data-bytes="{int(gpu_bytes)}" title="{int(gpu_bytes):,} '
        f'bytes: the label\'s GB, 1e9 bytes each">{_gb(gpu_bytes)}</td></tr></table>'
        '<div style="position:relative;width:600px;height:26px;margin:8px 0;'
        'background:#eee;display:flex">' + "".join(segments)
        + f'<div style="position:absolute;left:{capacity_left:.3f}%;top:-4px;height:34px;'
        f'border-left:3px dashed {LINE_COLOUR}"></div></div>'
        f'<div data-fits="{str(fits).lower()}" style="font-weight:bold;color:'
        f'{FITS_COLOUR if fits else MISSES_COLOUR}">{verdict}</div></div>')


def memory_budget_explorer(models: dict[str, dict], accelerators: dict[str, dict]) -> widgets.VBox:
    """A panel of controls and the memory budget they give, updated as the controls move.

    Args:
        models: ``models.json``'s ``"models"``: each with n_layers, d_model, n_heads, d_ff,
            mlp_matrices, vocab_size, context_length, tied_embeddings and dropout.
        accelerators: ``hardware.json``'s ``"accelerators"``: each with memory_bytes, the
            label's bytes (80 GB = 80e9), the convention of every budget in lesson 05.

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
    recipe = control(widgets.Dropdown(options=["fp32", "mixed_bf16", "adam8bit"],
                                      value="mixed_bf16", description="recipe"), "recipe")
    seq_len = control(widgets.SelectionSlider(options=[2**k for k in range(7, 18)], value=4096,
                                              description="sequence length"), "seq-len")
    batch = control(widgets.IntSlider(value=1, min=1, max=64, description="sequences per GPU"),
                    "batch")
    checkpointing = control(widgets.Checkbox(value=False, description="activation checkpointing"),
                            "checkpointing")
    flash = control(widgets.Checkbox(value=False, description="FlashAttention (no scores kept)"),
                    "flash")
    n_gpus = control(widgets.SelectionSlider(options=[2**k for k in range(11)], value=1,
                                             description="GPUs (sharded state)"), "gpus")
    gpu = control(widgets.Dropdown(options=list(accelerators), value="H100 SXM",
                                   description="GPU"), "gpu")
    heading = widgets.HTML()
    shown = widgets.HTML()

    def update(_change: object = None) -> None:
        shape = models[model.value]
        n_params = model_params(shape)
        sizes = (n_params, shape["n_layers"], shape["d_model"], shape["n_heads"], recipe.value,
                 seq_len.value, batch.value, checkpointing.value)
        dropout = shape.get("dropout", True)
        budget = memory_budget(*sizes, n_gpus.value, flash.value, dropout)
        gpu_bytes = accelerators[gpu.value]["memory_bytes"]
        heading.value = (f"<b>{model.value}</b>: {n_params / 1e9:,.2f} billion parameters, "
                         f"{shape['n_layers']} layers of width {shape['d_model']}, "
                         f"{'with' if dropout else 'no'} dropout, "
                         f"{batch.value * seq_len.value:,} tokens per GPU")
        shown.value = budget_html(budget, gpu.value, gpu_bytes,
                                  smallest_gpu_count(*sizes, gpu_bytes, flash.value, dropout))

    controls = [model, recipe, seq_len, batch, checkpointing, flash, n_gpus, gpu]
    for widget in controls:
        widget.observe(update, names="value")
    update()
    return widgets.VBox([*controls, heading, shown])
