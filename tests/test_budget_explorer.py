"""Lesson 10's explorer: its numbers against closed forms, a brute-force search and the
published figures worked out here, and the panel showing them as its controls move (without a
browser; tests/test_widget_10_budget.py drives it in JupyterLab)."""

from __future__ import annotations

import html
import itertools
import json
import math
import re
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import solutions.budget
import solutions.budget_explorer
from grader.content.sync import solution_cell_source
from solutions.budget_explorer import (
    BUDGET_CHOICES,
    DEFAULT_DOLLARS_PER_GPU_HOUR,
    DEFAULT_GPU_WATTS,
    DEFAULT_KG_CO2_PER_KWH,
    INFERENCE_CHOICES,
    QUIET_COLOUR,
    SAVES_COLOUR,
    START_FLOPS,
    budget_explorer,
    budget_plan,
    flops_label,
    inference_label,
    plan_html,
)

DATA = Path(__file__).resolve().parent.parent / "data"
BUDGET = json.loads((DATA / "budget.json").read_text())
FITS, RUNS = BUDGET["fits"], BUDGET["runs"]
ACCELERATORS = json.loads((DATA / "hardware.json").read_text())["accelerators"]
H100 = ACCELERATORS["H100 SXM"]
HOFFMANN, BESIROGLU = "Hoffmann et al. 2022", "Besiroglu et al. 2024"
# What the notebook's copy of this module defines, in the module's order: the cell
# {"course": {"copy_of": "solutions.budget_explorer", "defines": DEFINES}}.
DEFINES = ["START_FLOPS", "DEFAULT_DOLLARS_PER_GPU_HOUR", "DEFAULT_MFU", "DEFAULT_GPU_WATTS",
           "DEFAULT_PUE", "DEFAULT_KG_CO2_PER_KWH", "FIT_KEYS", "BUDGET_CHOICES",
           "INFERENCE_CHOICES", "SAVES_COLOUR", "QUIET_COLOUR", "RULE_COLOUR", "budget_plan",
           "_readable", "_scaled", "_row", "_section", "flops_label", "inference_label",
           "plan_html", "budget_explorer"]

budgets = st.floats(18, 26).map(lambda e: 10.0**e)
fit_names = st.sampled_from([HOFFMANN, BESIROGLU])
inference = st.one_of(st.just(0.0), st.floats(6, 16).map(lambda e: 10.0**e))


def plan(compute_flops: float, fit: str = HOFFMANN, inference_tokens: float = 0.0, **kwargs):
    """budget_plan with the lesson's run: $2 an hour, 0.4 kg a kWh, an H100."""
    return budget_plan(compute_flops, FITS[fit], inference_tokens,
                       kwargs.pop("price", 2.0), kwargs.pop("intensity", 0.4),
                       kwargs.pop("gpu", H100), **kwargs)


def loss(fit: dict, n: float, d: float) -> float:
    return fit["E"] + fit["A"] / n ** fit["alpha"] + fit["B"] / d ** fit["beta"]


@settings(max_examples=80, deadline=None)
@given(budgets, fit_names)
def test_the_compute_optimal_point_is_the_closed_form_of_the_fit(compute_flops, name) -> None:
    """dL/dN = 0 along 6ND = C: alpha·A/N^alpha = beta·B/D^beta, solved here for N."""
    fit, got = FITS[name], plan(compute_flops, name)
    a, b = fit["alpha"], fit["beta"]
    n = (a * fit["A"] / (b * fit["B"])) ** (1 / (a + b)) * (compute_flops / 6) ** (b / (a + b))
    # a few roundings of powers apart: 1e-12 is thousands of them
    assert math.isclose(got["n_params"], n, rel_tol=1e-12)
    assert math.isclose(6 * got["n_params"] * got["n_tokens"], compute_flops, rel_tol=1e-12)
    assert got["tokens_per_param"] == got["n_tokens"] / got["n_params"]
    assert math.isclose(got["loss"], loss(fit, got["n_params"], got["n_tokens"]), rel_tol=1e-14)
    # the first-order condition itself, which a wrong exponent would break
    assert math.isclose(a * fit["A"] / got["n_params"] ** a,
                        b * fit["B"] / got["n_tokens"] ** b, rel_tol=1e-9)


def test_the_two_fits_give_93_and_18_tokens_a_parameter_at_chinchillas_budget() -> None:
    """COURSE.md's figures: Hoffmann et al.'s published fit against Besiroglu et al.'s refit."""
    assert RUNS["Chinchilla"]["flops"] == START_FLOPS
    assert round(plan(START_FLOPS, HOFFMANN)["tokens_per_param"]) == 93
    assert round(plan(START_FLOPS, BESIROGLU)["tokens_per_param"]) == 18


def log_iso_loss_flops(fit: dict, target: float, inference_tokens: float,
                       log_n: np.ndarray) -> np.ndarray:
    """Lifetime FLOPs 6·N·D + 2·N·inference of each model on the curve L(N, D) = target, N = e^
    log_n (inf where no D reaches the target)."""
    left = target - fit["E"] - fit["A"] * np.exp(-fit["alpha"] * log_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(left > 0, (fit["B"] / left) ** (1 / fit["beta"]), np.inf)
    n = np.exp(log_n)
    return 6 * n * d + 2 * n * inference_tokens


@settings(max_examples=60, deadline=None)
@given(budgets, fit_names, inference)
def test_the_lifetime_model_reaches_the_same_loss_for_the_fewest_lifetime_flops(
        compute_flops, name, inference_tokens) -> None:
    fit, got = FITS[name], plan(compute_flops, name, inference_tokens)
    n, d = got["lifetime_n_params"], got["lifetime_n_tokens"]
    assert math.isclose(loss(fit, n, d), got["loss"], rel_tol=1e-9)
    assert got["lifetime_tokens_per_param"] == d / n
    assert got["lifetime_training_flops"] == 6 * n * d
    assert math.isclose(got["lifetime_flops_lifetime_optimal"],
                        6 * n * d + 2 * n * inference_tokens, rel_tol=1e-15)
    n_opt, d_opt = got["n_params"], got["n_tokens"]
    assert math.isclose(got["lifetime_flops_compute_optimal"],
                        compute_flops + 2 * n_opt * inference_tokens, rel_tol=1e-13)
    # the compute-optimal model is one of the models on the curve: never cheaper over a lifetime
    assert got["lifetime_flops_lifetime_optimal"] <= (
        got["lifetime_flops_compute_optimal"] * (1 + 1e-12))
    assert got["lifetime_flops_saved"] == 1 - (got["lifetime_flops_lifetime_optimal"]
                                               / got["lifetime_flops_compute_optimal"])
    # serving only pulls the model smaller and the training longer (N to 1e-6: the minimum is
    # flat, lifetime_optimal places it to ~1e-7)
    assert n <= n_opt * (1 + 1e-6) and d >= d_opt * (1 - 1e-6)
    # a brute-force search along the curve finds nothing cheaper: 20,001 models from the
    # smallest that can reach the loss to e times the compute-optimal one
    log_n_min = math.log(fit["A"] / (got["loss"] - fit["E"])) / fit["alpha"]
    grid = np.linspace(log_n_min, math.log(n_opt) + 1, 20_001)[1:]
    cheapest = log_iso_loss_flops(fit, got["loss"], inference_tokens, grid).min()
    assert got["lifetime_flops_lifetime_optimal"] <= cheapest * (1 + 1e-12)
    assert cheapest <= got["lifetime_flops_lifetime_optimal"] * (1 + 1e-4)  # a grid's step


@settings(max_examples=40, deadline=None)
@given(budgets, fit_names)
def test_with_no_inference_the_lifetime_model_is_the_compute_optimal_one(compute_flops,
                                                                         name) -> None:
    got = plan(compute_flops, name, 0.0)
    assert math.isclose(got["lifetime_n_params"], got["n_params"], rel_tol=1e-6)
    assert math.isclose(got["lifetime_n_tokens"], got["n_tokens"], rel_tol=1e-6)
    assert math.isclose(got["lifetime_training_flops"], compute_flops, rel_tol=1e-12)
    assert abs(got["lifetime_flops_saved"]) <= 1e-12


@pytest.mark.parametrize("name", [HOFFMANN, BESIROGLU])
def test_more_inference_means_a_smaller_model_trained_on_more_tokens(name) -> None:
    """Down the explorer's choices at Chinchilla's budget; at 1B tokens the model barely
    moves (its lifetime is nearly all training), so each step is compared to within 1e-6."""
    plans = [plan(START_FLOPS, name, t) for t in INFERENCE_CHOICES]
    sizes = [p["lifetime_n_params"] for p in plans]
    ratios = [p["lifetime_tokens_per_param"] for p in plans]
    saved = [p["lifetime_flops_saved"] for p in plans]
    assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(sizes))
    assert all(b >= a * (1 - 1e-6) for a, b in itertools.pairwise(ratios))
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(saved))
    # 1,000T tokens served: under either fit a model about 5 times smaller saves three
    # quarters of the lifetime FLOPs
    assert sizes[-1] < sizes[0] / 4 and saved[-1] > 0.7


@settings(max_examples=80, deadline=None)
@given(budgets, st.floats(0.01, 100), st.floats(0, 1), st.floats(0.05, 1),
       st.floats(100, 1500), st.floats(1, 2), st.sampled_from(sorted(ACCELERATORS)))
def test_the_runs_cost_is_gpu_hours_at_the_mfu_times_price_power_and_intensity(
        compute_flops, price, intensity, mfu, watts, pue, gpu) -> None:
    spec = ACCELERATORS[gpu]
    got = plan(compute_flops, price=price, intensity=intensity, gpu=spec, mfu=mfu,
               gpu_watts=watts, pue=pue)
    hours = compute_flops / (spec["peak_flops"]["bf16"] * mfu) / 3600
    assert math.isclose(got["gpu_hours"], hours, rel_tol=1e-15)
    assert math.isclose(got["dollars"], hours * price, rel_tol=1e-14)
    kwh = hours * watts * pue / 1000  # W·h / 1000
    assert math.isclose(got["kwh"], kwh, rel_tol=1e-14)
    assert math.isclose(got["tonnes_co2"], kwh * intensity / 1000, rel_tol=1e-14)  # kg / 1000


def test_deepseek_v3s_gpu_hours_at_two_dollars_cost_its_published_bill() -> None:
    """A budget that takes 2.788M H800-hours at 40% MFU costs DeepSeek-V3's $5.576M."""
    run, h800 = RUNS["DeepSeek-V3"], ACCELERATORS["H800 SXM"]
    compute_flops = run["gpu_hours"] * 3600 * h800["peak_flops"]["bf16"] * 0.4
    got = plan(compute_flops, price=run["dollars_per_gpu_hour"], gpu=h800, mfu=0.4)
    assert math.isclose(got["gpu_hours"], 2_788_000, rel_tol=1e-12)
    assert math.isclose(got["dollars"], run["dollars"], rel_tol=1e-12)


def test_the_defaults_are_the_sources() -> None:
    """$2 is DeepSeek-V3's assumed price, 700 W Llama 3.1's H100s; 0.4 kg per kWh is within 5%
    of what Llama 3.1's card implies: 11,390 t over 39.3M GPU-hours at 700 W."""
    assert RUNS["DeepSeek-V3"]["dollars_per_gpu_hour"] == DEFAULT_DOLLARS_PER_GPU_HOUR
    llama = RUNS["Llama 3.1"]
    assert llama["gpu_watts"] == DEFAULT_GPU_WATTS
    implied = llama["tonnes_co2eq_location_based"] * 1000 / (
        llama["gpu_hours"] * llama["gpu_watts"] / 1000)
    assert round(implied, 2) == 0.41  # the module's comment
    assert abs(DEFAULT_KG_CO2_PER_KWH / implied - 1) < 0.05


@pytest.mark.parametrize(("change", "message"), [
    ({"compute_flops": 0.0}, "compute_flops must be > 0"),
    ({"compute_flops": -1e20}, "compute_flops must be > 0"),
    ({"compute_flops": math.nan}, "compute_flops must be finite"),
    ({"compute_flops": math.inf}, "compute_flops must be finite"),
    ({"compute_flops": True}, "compute_flops must be a number"),
    ({"fit": {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34}}, "fit lacks 'beta'"),
    ({"fit": {"E": 1.69, "A": -1.0, "B": 410.7, "alpha": 0.34, "beta": 0.28}}, "A must be > 0"),
    ({"inference_tokens": -1.0}, "inference_tokens must be >= 0"),
    ({"inference_tokens": math.nan}, "inference_tokens must be finite"),
    ({"dollars_per_gpu_hour": 0.0}, "dollars_per_gpu_hour must be > 0"),
    ({"kg_co2_per_kwh": -0.1}, "kg_co2_per_kwh must be >= 0"),
    ({"gpu": {"peak_flops": {"fp32": 6.7e13}}}, r"gpu must give .* bf16 peak"),
    ({"gpu": {"peak_flops": {"bf16": 0.0}}}, r"gpu must give .* bf16 peak"),
    ({"mfu": 0.0}, r"mfu must be a share of the peak"),
    ({"mfu": 1.5}, r"mfu must be a share of the peak"),
    ({"mfu": math.nan}, r"mfu must be a share of the peak"),
    ({"mfu": True}, r"mfu must be a share of the peak"),
    ({"gpu_watts": 0.0}, "gpu_watts must be > 0"),
    ({"pue": 0.9}, "pue must be >= 1"),
])
def test_bad_input_raises_a_value_error_that_names_the_argument(change, message) -> None:
    args = {"compute_flops": START_FLOPS, "fit": FITS[HOFFMANN], "inference_tokens": 1e12,
            "dollars_per_gpu_hour": 2.0, "kg_co2_per_kwh": 0.4, "gpu": H100} | change
    with pytest.raises(ValueError, match=message):
        budget_plan(**args)


def shown(panel_or_html) -> dict[str, str]:
    """The data-value of each part the table shows, by part."""
    text = panel_or_html if isinstance(panel_or_html, str) else panel_or_html.children[-1].value
    return dict(re.findall(r'data-part="(\w+)".*?data-value="([^"]*)"', text))


@settings(max_examples=30, deadline=None)
@given(budgets, fit_names, inference)
def test_the_table_shows_every_number_of_the_plan_exactly(compute_flops, name,
                                                         inference_tokens) -> None:
    got = plan(compute_flops, name, inference_tokens)
    values = shown(plan_html(got, name, inference_tokens))
    assert set(values) == set(got)
    assert all(float(values[key]) == got[key] for key in got)


def test_the_table_escapes_the_fit_name_and_colours_from_the_lab_theme() -> None:
    text = plan_html(plan(START_FLOPS), "<b>mine</b> & yours", 0.0)
    assert "&lt;b&gt;mine&lt;/b&gt; &amp; yours" in text and "<b>mine" not in text
    assert f"color:{QUIET_COLOUR}" in text and "no inference" in text
    assert "lifetime FLOPs, no tokens served" in text
    served = plan_html(plan(START_FLOPS, BESIROGLU, 1e13), BESIROGLU, 1e13)
    assert f"color:{SAVES_COLOUR}" in served
    assert "serving 10T tokens" in served and "saves 28.6% of the lifetime FLOPs" in served
    # every colour is one of JupyterLab's variables, so the dark theme gets its own
    for html_text in (text, served):
        colours = re.findall(r"(?:color|border-bottom):\s*([^;\"]+)", html_text)
        assert len(colours) >= 4 and all(re.fullmatch(r"(1px solid )?var\(--jp-[^)]+\)", c)
                                         for c in colours), colours


def test_the_budgets_are_a_log_grid_from_1e18_to_1e26_with_chinchillas() -> None:
    """Ten steps a power of ten, each to three digits (so within 0.5% of 10^(k/10)), and
    Chinchilla's 5.76e23 between 10^23.7 and 10^23.8."""
    assert BUDGET_CHOICES[0] == 1e18 and BUDGET_CHOICES[-1] == 1e26
    assert len(BUDGET_CHOICES) == 82 and START_FLOPS in BUDGET_CHOICES
    grid = [c for c in BUDGET_CHOICES if c != START_FLOPS]
    exponents = np.log10(grid)
    assert np.abs(exponents - np.arange(180, 261) / 10).max() < math.log10(1.005)
    assert list(BUDGET_CHOICES) == sorted(set(BUDGET_CHOICES))
    assert [flops_label(c) for c in BUDGET_CHOICES[55:60]] == [
        "3.16e23", "3.98e23", "5.01e23", "5.76e23", "6.31e23"]
    assert all(float(flops_label(c)) == c for c in BUDGET_CHOICES)  # the label is the value


def test_the_inference_choices_run_from_none_to_a_thousand_trillion_tokens() -> None:
    assert INFERENCE_CHOICES[0] == 0 and INFERENCE_CHOICES[-1] == 1e15
    labels = [inference_label(t) for t in INFERENCE_CHOICES]
    assert labels[:4] == ["none", "1B", "3B", "10B"] and labels[-3:] == ["100T", "300T",
                                                                          "1,000T"]
    assert inference_label(15e12) == "15T"  # Llama 3's training tokens, for comparison


def test_the_panel_shows_the_plan_of_its_controls() -> None:
    panel = budget_explorer(FITS, H100)
    controls = {c._dom_classes[0].removeprefix("ctc-budget-"): c for c in panel.children
                if getattr(c, "_dom_classes", ())}
    assert set(controls) == {"flops", "fit", "inference", "price", "grid"}
    assert tuple(c for _, c in controls["flops"].options) == BUDGET_CHOICES
    assert controls["flops"].value == START_FLOPS
    assert all("ctc-choice-slider" in controls[name]._dom_classes
               for name in ("flops", "inference"))
    assert list(controls["fit"].options) == [HOFFMANN, BESIROGLU]
    values = shown(panel)
    first = plan(START_FLOPS)
    assert {k: float(v) for k, v in values.items()} == first
    assert "Hoffmann et al. 2022</b>: L(N, D) = 1.69 + 406.4/N^0.34" in panel.children[-2].value
    assert "989.4 TFLOP/s" in panel.children[-2].value
    controls["flops"].value = 1e25
    controls["fit"].value = BESIROGLU
    controls["inference"].value = 1e13
    controls["price"].value = 3.5
    controls["grid"].value = 0.05
    expected = plan(1e25, BESIROGLU, 1e13, price=3.5, intensity=0.05)
    assert {k: float(v) for k, v in shown(panel).items()} == expected
    assert "Besiroglu et al. 2024" in panel.children[-2].value
    controls["price"].value = 0.0  # a text box bounded at a cent: never a free GPU
    assert controls["price"].value == 0.01
    assert float(shown(panel)["dollars"]) == expected["gpu_hours"] * 0.01


def test_the_notebooks_copy_runs_without_the_solutions_package() -> None:
    """The cell sync writes from DEFINES, run where only the setup cell's imports and the
    lesson's functions are defined (as in the notebook), makes the same panel."""
    source = solution_cell_source(solutions.budget_explorer, DEFINES, given=DEFINES)
    assert "import" not in source
    top = [name for name in vars(solutions.budget_explorer) if name in DEFINES]
    assert top == DEFINES  # every definition, in the module's order
    lesson = {name: getattr(solutions.budget, name) for name in (
        "chinchilla_loss", "compute_optimal", "lifetime_optimal", "run_cost")}
    namespace = {"html": html, "math": math, "widgets": widgets, **lesson}
    exec(compile(source, "<copy of budget_explorer>", "exec"), namespace)
    panel = namespace["budget_explorer"](FITS, H100)
    assert {k: float(v) for k, v in shown(panel).items()} == plan(START_FLOPS)
