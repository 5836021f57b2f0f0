"""Lesson 10's explorer: what a training budget buys, what serving changes, what the run costs.

``budget_plan`` computes, for a budget of C FLOPs and one fit of L(N, D) = E + A/N^α + B/D^β
(``budget.json``'s ``"fits"``), the lesson's numbers: the compute-optimal model and its loss
(``compute_optimal``, ``chinchilla_loss``); the model that reaches the same loss for the fewest
lifetime FLOPs once it also serves some tokens (``lifetime_optimal``), beside the
compute-optimal model's lifetime FLOPs; and the run's GPU-hours at a GPU's dense bf16 peak and
an MFU, with its dollars, energy and emissions (``run_cost``). ``budget_explorer`` is the
ipywidgets panel the notebook shows.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from solutions.budget import chinchilla_loss, compute_optimal, lifetime_optimal, run_cost

START_FLOPS = 5.76e23  # the explorer's first budget: Gopher's, for which Chinchilla was trained
# The run's defaults: DeepSeek-V3's assumed rental price (budget.json); Llama 3 405B's 38-43%
# bf16 MFU (Llama 3 paper, table 4); the H100's 700 W TDP (Llama 3.1's model card) with a PUE
# of 1, as that card counts (its 700 W is "adjusted for power usage efficiency"); about the
# intensity Llama 3.1's card implies (11,390 t over 39.3M H100-hours at 700 W: 0.41 kg per
# kWh; tests/test_budget_explorer.py works it out).
DEFAULT_DOLLARS_PER_GPU_HOUR = 2.0
DEFAULT_MFU = 0.4
DEFAULT_GPU_WATTS = 700.0
DEFAULT_PUE = 1.0
DEFAULT_KG_CO2_PER_KWH = 0.4
FIT_KEYS = ("E", "A", "B", "alpha", "beta")
# Budgets the explorer offers: ten a power of ten, 1e18 to 1e26 FLOPs, to three digits, and
# START_FLOPS. A slider of floats would snap its first value to its grid (5.76e23 to 10^23.8).
BUDGET_CHOICES = tuple(sorted({float(f"{10 ** (k / 10):.3g}") for k in range(180, 261)}
                              | {START_FLOPS}))
# Inference tokens the explorer offers: none, then 1 and 3 of every power of ten, 1B to 1,000T.
INFERENCE_CHOICES = (0.0, *(m * 10.0**e for e in range(9, 16) for m in (1, 3)))[:-1]
# JupyterLab's theme colours, legible in its light and dark themes; the fallbacks elsewhere
SAVES_COLOUR = "var(--jp-success-color1, #007a33)"
QUIET_COLOUR = "var(--jp-ui-font-color2, #616161)"
RULE_COLOUR = "var(--jp-border-color1, #bdbdbd)"


def budget_plan(compute_flops: float, fit: dict, inference_tokens: float,
                dollars_per_gpu_hour: float, kg_co2_per_kwh: float, gpu: dict,
                mfu: float = DEFAULT_MFU, gpu_watts: float = DEFAULT_GPU_WATTS,
                pue: float = DEFAULT_PUE) -> dict:
    """The lesson's numbers for a training budget of compute_flops FLOPs under one fit.

    Args:
        compute_flops: C, the training budget, FLOPs (> 0).
        fit: the fit's ``E``, ``A``, ``B``, ``alpha`` and ``beta`` (an entry of
            ``budget.json``'s ``"fits"``; other keys are ignored).
        inference_tokens: tokens the model processes once trained (>= 0), 2·N FLOPs each.
        dollars_per_gpu_hour: the price of one GPU for one hour, dollars (> 0).
        kg_co2_per_kwh: the grid's carbon intensity, kg CO2eq per kWh (>= 0).
        gpu: an entry of ``hardware.json``'s ``"accelerators"`` (its ``peak_flops["bf16"]``,
            the dense peak, FLOP/s).
        mfu: the share of that peak the run achieves (0 < mfu <= 1).
        gpu_watts: one GPU's power, watts (> 0).
        pue: the data centre's power usage effectiveness (>= 1).

    Returns:
        A dict of floats: ``compute_flops``; the compute-optimal ``n_params``, ``n_tokens``,
        ``tokens_per_param`` and ``loss`` (nats per token); the lifetime-optimal model for that
        loss, ``lifetime_n_params``, ``lifetime_n_tokens``, ``lifetime_tokens_per_param`` and
        its ``lifetime_training_flops`` (6·N·D); the lifetime FLOPs 6·N·D + 2·N·inference of
        the compute-optimal model, ``lifetime_flops_compute_optimal``, and of the
        lifetime-optimal one, ``lifetime_flops_lifetime_optimal``, and the share of the former
        the latter saves, ``lifetime_flops_saved``; the training's ``gpu_hours``
        (C / (peak·mfu) / 3600) and its ``dollars``, ``kwh`` and ``tonnes_co2``.

    Raises:
        ValueError: a key of the fit missing, the GPU without a bf16 peak, mfu outside (0, 1],
            or (from the lesson's functions) any other argument out of its range.
    """
    missing = [key for key in FIT_KEYS if key not in fit]
    if missing:
        raise ValueError(f"fit lacks {', '.join(map(repr, missing))}: a fit of L(N, D) = "
                         f"E + A/N^alpha + B/D^beta needs {', '.join(FIT_KEYS)}")
    params = {key: fit[key] for key in FIT_KEYS}
    peak = gpu.get("peak_flops", {}).get("bf16")
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0 \
            or not math.isfinite(peak):
        raise ValueError(f"gpu must give a finite dense bf16 peak > 0 as "
                         f"gpu['peak_flops']['bf16'], got {peak!r}")
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise ValueError(f"mfu must be a share of the peak, 0 < mfu <= 1, got {mfu!r}")
    n_params, n_tokens = (float(x) for x in compute_optimal(compute_flops, **params))
    loss = float(chinchilla_loss(n_params, n_tokens, **params))
    lean_params, lean_tokens = (float(x) for x in lifetime_optimal(loss, inference_tokens,
                                                                   **params))
    serving = 2 * float(inference_tokens)
    optimal_flops = 6 * n_params * n_tokens + serving * n_params
    lean_flops = 6 * lean_params * lean_tokens + serving * lean_params
    gpu_hours = compute_flops / (peak * mfu) / 3600
    dollars, kwh, tonnes = (float(x) for x in run_cost(gpu_hours, dollars_per_gpu_hour,
                                                       gpu_watts, pue, kg_co2_per_kwh))
    return {
        "compute_flops": float(compute_flops),
        "n_params": n_params, "n_tokens": n_tokens, "tokens_per_param": n_tokens / n_params,
        "loss": loss,
        "lifetime_n_params": lean_params, "lifetime_n_tokens": lean_tokens,
        "lifetime_tokens_per_param": lean_tokens / lean_params,
        "lifetime_training_flops": 6 * lean_params * lean_tokens,
        "lifetime_flops_compute_optimal": optimal_flops,
        "lifetime_flops_lifetime_optimal": lean_flops,
        "lifetime_flops_saved": 1 - lean_flops / optimal_flops,
        "gpu_hours": gpu_hours, "dollars": dollars, "kwh": kwh, "tonnes_co2": tonnes,
    }


def _readable(x: float) -> str:
    """A number as people write it: 5,576,000, 295, 12.3, 0.0123, 1.5e-08."""
    if x != 0 and abs(x) < 1e-4:
        return f"{x:.2g}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _scaled(x: float) -> str:
    """A count with its scale: 70.0 B, 1.40 T, 1,234 T, 950 k."""
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= limit:
            return f"{_readable(x / limit)} {suffix}"
    return _readable(x)


def _row(part: str, label: str, value: float, text: str) -> str:
    """One row of the table; ``data-value`` holds the exact value (the browser test reads it)."""
    return (f'<tr data-part="{part}"><td>{label}</td><td style="text-align:right;'
            f'padding-left:16px;white-space:nowrap" data-value="{value!r}">{text}</td></tr>')


def _section(title: str) -> str:
    """A row that heads the rows below it."""
    return (f'<tr><td colspan="2" style="padding-top:6px;color:{QUIET_COLOUR};'
            f'border-bottom:1px solid {RULE_COLOUR}">{title}</td></tr>')


def flops_label(flops: float) -> str:
    """``5.76e23``, ``1e18``: FLOPs as the explorer's slider names a budget."""
    return f"{flops:.3g}".replace("e+", "e")


def inference_label(tokens: float) -> str:
    """``none``, ``300B``, ``15T``: inference tokens as the explorer's slider names them."""
    if tokens == 0:
        return "none"
    return _scaled(tokens).replace(" ", "") if tokens < 1e12 else f"{tokens / 1e12:,.0f}T"


def plan_html(plan: dict, fit_name: str, inference_tokens: float) -> str:
    """The explorer's tables for one plan (``budget_plan``'s) under the fit ``fit_name``.

    Two columns where the output area is wide enough (the compute-optimal model and its run;
    the lifetime-optimal model), one below the other where it is not:
    under a 1280x720 window the whole panel, controls and all, fits the notebook's view, so
    that a student sees the plan change as a control moves."""
    served = inference_label(inference_tokens)
    compute_optimal = [
        _section(f"compute-optimal under {html.escape(fit_name)}"),
        _row("compute_flops", "training budget, FLOPs", plan["compute_flops"],
             flops_label(plan["compute_flops"])),
        _row("n_params", "parameters", plan["n_params"], _scaled(plan["n_params"])),
        _row("n_tokens", "training tokens", plan["n_tokens"], _scaled(plan["n_tokens"])),
        _row("tokens_per_param", "tokens a parameter", plan["tokens_per_param"],
             _readable(plan["tokens_per_param"])),
        _row("loss", "fitted loss, nats per token", plan["loss"], f"{plan['loss']:.4f}"),
    ]
    lifetime_optimal = [
        _section("the same loss for the fewest lifetime FLOPs, "
                 f"{served if inference_tokens else 'no'} tokens served"),
        _row("lifetime_n_params", "parameters", plan["lifetime_n_params"],
             _scaled(plan["lifetime_n_params"])),
        _row("lifetime_n_tokens", "training tokens", plan["lifetime_n_tokens"],
             _scaled(plan["lifetime_n_tokens"])),
        _row("lifetime_tokens_per_param", "tokens a parameter",
             plan["lifetime_tokens_per_param"], _readable(plan["lifetime_tokens_per_param"])),
        _row("lifetime_training_flops", "its training, FLOPs", plan["lifetime_training_flops"],
             f"{flops_label(plan['lifetime_training_flops'])} "
             f"({plan['lifetime_training_flops'] / plan['compute_flops']:.3g}x the budget)"),
        _row("lifetime_flops_compute_optimal", "lifetime FLOPs, compute-optimal model",
             plan["lifetime_flops_compute_optimal"],
             flops_label(plan["lifetime_flops_compute_optimal"])),
        _row("lifetime_flops_lifetime_optimal", "lifetime FLOPs, this model",
             plan["lifetime_flops_lifetime_optimal"],
             flops_label(plan["lifetime_flops_lifetime_optimal"])),
    ]
    training_run = [
        _section("the budget's training run (the compute-optimal model's; the lifetime-optimal "
                 "model's costs its x the budget)"),
        _row("gpu_hours", "GPU-hours", plan["gpu_hours"], _readable(plan["gpu_hours"])),
        _row("dollars", "dollars", plan["dollars"], f"${_readable(plan['dollars'])}"),
        _row("kwh", "energy, kWh", plan["kwh"], _readable(plan["kwh"])),
        _row("tonnes_co2", "emissions, tonnes CO2eq", plan["tonnes_co2"],
             _readable(plan["tonnes_co2"])),
    ]
    saved = plan["lifetime_flops_saved"]
    if inference_tokens == 0:
        verdict, colour = ("no inference: the compute-optimal model is the lifetime-optimal "
                           "one", QUIET_COLOUR)
    else:
        verdict, colour = (f"serving {served} tokens, the smaller model trained longer saves "
                           f"{max(saved, 0.0):.1%} of the lifetime FLOPs", SAVES_COLOUR)
    def column(*tables: list[str]) -> str:
        return "<div>" + "".join('<table style="border-collapse:collapse;width:400px">'
                                 + "".join(rows) + "</table>" for rows in tables) + "</div>"

    return ('<div class="ctc-budget-plan" style="font-size:14px;line-height:1.4">'
            '<div style="display:flex;flex-wrap:wrap;align-items:flex-start;gap:0 28px">'
            + column(compute_optimal, training_run) + column(lifetime_optimal)
            + f'</div><div data-part="lifetime_flops_saved" data-value="{saved!r}" '
            f'style="font-weight:bold;color:{colour};padding-top:4px">{verdict}</div></div>')


def budget_explorer(fits: dict[str, dict], gpu: dict, mfu: float = DEFAULT_MFU,
                    gpu_watts: float = DEFAULT_GPU_WATTS,
                    pue: float = DEFAULT_PUE) -> widgets.VBox:
    """A panel of controls and the plan they give, updated as the controls move.

    Args:
        fits: ``budget.json``'s ``"fits"``, by name.
        gpu: the GPU of the run (``hardware.json``'s H100 SXM in the lesson).
        mfu, gpu_watts, pue: as in ``budget_plan``, fixed for the panel.

    Returns:
        The panel (display it). Its controls have the CSS classes ``ctc-budget-flops``,
        ``ctc-budget-fit``, ``ctc-budget-inference``, ``ctc-budget-price`` and
        ``ctc-budget-grid``.
    """
    def control(widget: widgets.DOMWidget, name: str) -> widgets.DOMWidget:
        widget.add_class(f"ctc-budget-{name}")  # a handle for the browser test
        widget.style.description_width = "170px"
        if isinstance(widget, widgets.SelectionSlider):  # its readout takes no typing: the
            widget.add_class("ctc-choice-slider")  # lab's style (grader/lab/labextension) says so
        widget.layout.width = "560px"
        return widget

    flops = control(widgets.SelectionSlider(
        options=[(flops_label(c), c) for c in BUDGET_CHOICES], value=START_FLOPS,
        description="training budget, FLOPs"), "flops")
    fit = control(widgets.Dropdown(options=list(fits), description="fit of L(N, D)"), "fit")
    inference = control(widgets.SelectionSlider(
        options=[(inference_label(t), t) for t in INFERENCE_CHOICES], value=0.0,
        description="inference tokens"), "inference")
    price = control(widgets.BoundedFloatText(value=DEFAULT_DOLLARS_PER_GPU_HOUR, min=0.01,
                                             max=100.0, step=0.1,
                                             description="$ per GPU-hour"), "price")
    grid = control(widgets.FloatSlider(value=DEFAULT_KG_CO2_PER_KWH, min=0.0, max=1.0,
                                       step=0.01, readout_format=".2f",
                                       description="grid, kg CO2eq per kWh"), "grid")
    heading, shown = widgets.HTML(), widgets.HTML()

    def update(_change: object = None) -> None:
        params = fits[fit.value]
        plan = budget_plan(flops.value, params, inference.value, price.value, grid.value, gpu,
                           mfu, gpu_watts, pue)
        heading.value = (
            f"<b>{html.escape(fit.value)}</b>: L(N, D) = {params['E']} + {params['A']}/N^"
            f"{params['alpha']} + {params['B']}/D^{params['beta']}<br>the run: "
            f"{mfu:.0%} MFU on a dense bf16 peak of {gpu['peak_flops']['bf16'] / 1e12:,.1f} "
            f"TFLOP/s, {gpu_watts:,.0f} W a GPU, PUE {pue}")
        shown.value = plan_html(plan, fit.value, inference.value)

    controls = [flops, fit, inference, price, grid]
    for widget in controls:
        widget.observe(update, names="value")
    update()
    return widgets.VBox([*controls, heading, shown])
