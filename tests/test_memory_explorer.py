"""Lesson 05's memory explorer: its budget against the paper's formulas and the lesson's
reference functions, and the panel's shown values as its controls move (without a browser;
tests/test_widget_05_adamw_memory.py drives it in JupyterLab)."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solutions.backprop import gated_mlp_d_ff, transformer_params
from solutions.memory import training_memory
from solutions.memory_explorer import (
    _gb,
    budget_html,
    memory_budget,
    memory_budget_explorer,
    smallest_gpu_count,
)

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
ACCELERATORS = json.loads((DATA / "hardware.json").read_text())["accelerators"]
RECIPES = ["fp32", "mixed_bf16", "adam8bit"]


def korthikanti(s: int, b: int, h: int, a: int) -> Fraction:
    """Korthikanti et al. 2022, eq. 1: bytes per layer with 16-bit activations, as printed."""
    return s * b * h * (34 + Fraction(5 * a * s, h))


@given(st.sampled_from(RECIPES), st.integers(1, 4096), st.integers(1, 8), st.integers(1, 8),
       st.integers(1, 4), st.integers(1, 64), st.integers(0, 10**12))
def test_one_gpu_without_checkpointing_holds_training_memory_and_every_layers_activations(
        recipe, s, b, heads, d_head_8, layers, n_params) -> None:
    h = 8 * d_head_8 * heads
    budget = memory_budget(n_params, layers, h, heads, recipe, s, b, False, 1)
    assert {k: v for k, v in budget.items() if k != "activations"} == training_memory(n_params,
                                                                                      recipe)
    if recipe != "fp32":  # 16-bit activations: the paper's equation as it is printed
        assert budget["activations"] == layers * korthikanti(s, b, h, heads)
    else:  # 4-byte values, 1-byte masks: 16 * 4 + 2 per sbh, 2 * 4 + 1 per score
        assert budget["activations"] == layers * (66 * s * b * h + 9 * heads * s * s * b)
    assert list(budget)[-1] == "activations" and all(type(v) is int for v in budget.values())


@given(st.sampled_from(RECIPES), st.integers(0, 10**13), st.integers(1, 5000))
def test_the_state_is_sharded_evenly_rounded_up(recipe, n_params, n_gpus) -> None:
    budget = memory_budget(n_params, 2, 64, 4, recipe, 128, 1, False, n_gpus)
    for part, whole in training_memory(n_params, recipe).items():
        assert budget[part] == math.ceil(Fraction(whole, n_gpus))
        assert budget[part] * n_gpus - whole < n_gpus  # no GPU holds a byte more than needed
    assert budget["activations"] == memory_budget(n_params, 2, 64, 4, recipe, 128, 1, False,
                                                  1)["activations"]  # each GPU: its own batch


def test_checkpointing_keeps_each_layers_input_and_one_layer_flash_attention_no_scores() -> None:
    s, b, h, a, layers = 4096, 2, 4096, 32, 32
    plain = memory_budget(7 * 10**9, layers, h, a, "mixed_bf16", s, b, False, 8)
    checkpointed = memory_budget(7 * 10**9, layers, h, a, "mixed_bf16", s, b, True, 8)
    flash = memory_budget(7 * 10**9, layers, h, a, "mixed_bf16", s, b, False, 8, True)
    both = memory_budget(7 * 10**9, layers, h, a, "mixed_bf16", s, b, True, 8, True)
    assert plain["activations"] == layers * korthikanti(s, b, h, a)
    assert checkpointed["activations"] == layers * 2 * s * b * h + korthikanti(s, b, h, a)
    assert flash["activations"] == layers * 34 * s * b * h
    assert both["activations"] == layers * 2 * s * b * h + 34 * s * b * h


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("recipe", RECIPES)
def test_smallest_gpu_count_is_the_fewest_that_fit(recipe, checkpointing) -> None:
    shape = MODELS["Llama 2 7B"]
    n = transformer_params(shape["n_layers"], shape["d_model"], shape["vocab_size"],
                           gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"]))
    sizes = (n, shape["n_layers"], shape["d_model"], shape["n_heads"], recipe, 1024, 1,
             checkpointing)
    needed = smallest_gpu_count(*sizes, 80e9)
    assert needed is not None
    assert sum(memory_budget(*sizes, needed).values()) <= 80e9
    assert needed == 1 or sum(memory_budget(*sizes, needed - 1).values()) > 80e9


def test_no_gpu_count_is_enough_when_one_batch_of_activations_does_not_fit() -> None:
    # Llama 2 7B, 4096 tokens, scores stored: 104 GB of activations on every GPU.
    shape = MODELS["Llama 2 7B"]
    sizes = (6_738_149_376, shape["n_layers"], shape["d_model"], shape["n_heads"], "mixed_bf16",
             4096, 1, False)
    assert memory_budget(*sizes, 1)["activations"] > 80e9
    assert smallest_gpu_count(*sizes, 80e9) is None


def test_the_panel_shows_every_part_with_its_exact_bytes() -> None:
    budget = memory_budget(10**9, 24, 2048, 16, "adam8bit", 2048, 4, True, 2)
    page = budget_html(budget, "H100 SXM", 80e9, 1)
    shown = dict(re.findall(r'data-part="(\w+)".*?data-bytes="(\d+)"', page))
    assert {k: int(v) for k, v in shown.items()} == {**budget, "total": sum(budget.values()),
                                                     "capacity": 80_000_000_000}
    assert f"{_gb(sum(budget.values()))}</td>" in page and 'data-fits="true"' in page


def _control(panel, name: str):
    return next(w for w in panel.children if f"ctc-{name}" in w._dom_classes)


def _shown_total(panel) -> int:
    return int(re.search(r'data-part="total".*?data-bytes="(\d+)"', panel.children[-1].value)[1])


def test_moving_a_control_changes_the_shown_total_to_the_reference() -> None:
    panel = memory_budget_explorer(MODELS, ACCELERATORS)
    shape = MODELS["Llama 2 7B"]
    n = transformer_params(shape["n_layers"], shape["d_model"], shape["vocab_size"],
                           gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"]))

    def reference(**changes) -> int:
        settings = {"n_params": n, "n_layers": shape["n_layers"], "d_model": shape["d_model"],
                    "n_heads": shape["n_heads"], "recipe": "mixed_bf16", "seq_len": 4096,
                    "batch": 1, "checkpointing": False, "n_gpus": 1,
                    "dropout": shape["dropout"], **changes}
        return sum(memory_budget(**settings).values())

    assert _shown_total(panel) == reference()
    _control(panel, "checkpointing").value = True
    assert _shown_total(panel) == reference(checkpointing=True)
    _control(panel, "gpus").value = 8
    assert _shown_total(panel) == reference(checkpointing=True, n_gpus=8)
    _control(panel, "recipe").value = "fp32"
    assert _shown_total(panel) == reference(checkpointing=True, n_gpus=8, recipe="fp32")
    assert 'data-fits="true"' in panel.children[-1].value


def llama_2_7b_budget(seq_len: int, n_gpus: int = 1, dropout: bool | None = None) -> dict:
    shape = MODELS["Llama 2 7B"]
    d_ff = gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"])
    n_params = transformer_params(shape["n_layers"], shape["d_model"], shape["vocab_size"], d_ff,
                                  shape["tied_embeddings"])
    sizes = (n_params, shape["n_layers"], shape["d_model"], shape["n_heads"], "mixed_bf16",
             seq_len, 1, False)
    dropout = shape["dropout"] if dropout is None else dropout
    return {"budget": memory_budget(*sizes, n_gpus, False, dropout),
            "gpus": smallest_gpu_count(*sizes, ACCELERATORS["H100 SXM"]["memory_bytes"], False,
                                       dropout)}


def test_every_model_says_whether_it_has_dropout_and_where_that_is_stated() -> None:
    for name, shape in MODELS.items():
        assert isinstance(shape["dropout"], bool) and shape["dropout_source"], name
    assert MODELS["Llama 2 7B"]["dropout"] is False and MODELS["GPT-2 small"]["dropout"] is True


def test_without_dropout_the_korthikanti_count_keeps_no_masks() -> None:
    s, h, a, layers = 4096, 4096, 32, 32
    with_masks = llama_2_7b_budget(s, dropout=True)["budget"]["activations"]
    without = llama_2_7b_budget(s, dropout=False)["budget"]["activations"]
    assert with_masks == layers * korthikanti(s, 1, h, a)  # the paper's eq. 1, exactly
    assert with_masks - without == layers * (2 * s * h + 3 * a * s * s)  # masks, dropped copy


def test_the_explorers_llama_claims_hold() -> None:
    """Lesson 05's "things to try": at 4096 tokens Llama 2 7B's activations take about 52 GB
    and it takes 4 H100s sharing the 108 GB of state; at 8192 the activations alone (172 GB)
    exceed one GPU, however many share the state."""
    at_4096, at_8192 = llama_2_7b_budget(4096), llama_2_7b_budget(8192)
    assert round(at_4096["budget"]["activations"] / 1e9) == 52
    state = sum(at_4096["budget"].values()) - at_4096["budget"]["activations"]
    assert round(state / 1e9) == 108 and at_4096["gpus"] == 4
    assert round(at_8192["budget"]["activations"] / 1e9) == 172 and at_8192["gpus"] is None
    assert llama_2_7b_budget(4096, dropout=True)["gpus"] is None  # the old, wrong count


def test_lessons_05_and_06_count_llama_activations_alike() -> None:
    """Lesson 06 counts what torch saves for its model of the same shape (52.47 GB at 4096
    tokens: the logits, the loss and the final norm too), lesson 05 Korthikanti's per-layer
    count without dropout (51.54 GB): within 2%, the difference being those extra tensors."""
    import torch

    from solutions.training import saved_activation_bytes

    shape = MODELS["Llama 2 7B"]
    d_ff = gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"])
    lesson_06 = saved_activation_bytes(shape["n_layers"], shape["d_model"], shape["n_heads"],
                                       4096, shape["vocab_size"], 1, d_ff, torch.bfloat16)
    lesson_05 = llama_2_7b_budget(4096)["budget"]["activations"]
    assert lesson_05 < lesson_06 < 1.02 * lesson_05


def _saved_values_per_token(mlp, x) -> int:
    """Elements autograd saves for the backward pass in one forward pass of ``mlp``, per token:
    each storage once (an input that feeds two matmuls is kept once), the weights left out."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes() // tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        mlp(x)
    return sum(kept.values()) // (x.numel() // x.shape[-1])


def test_a_swiglu_mlp_keeps_more_than_the_gpt_mlp_the_count_assumes() -> None:
    """Lesson 05's "things to try": Korthikanti's count is of a GPT MLP (d -> 4d -> d: its input,
    the GELU's input and the down-projection's input, 9d values per token). Llama's SwiGLU
    keeps its input, the gate's output (SiLU's input), SiLU's output and the up-projection's
    (the product's two inputs) and the product (the down-projection's input): d + 4 d_ff.
    For Llama 2 7B at 4096 tokens that is 2.95 GB more, about 54.5 GB, and 5 GPUs, not 4."""
    import torch
    from torch import nn

    d, d_ff = 8, 24

    class SwiGLU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.up = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
            self.down = nn.Linear(d_ff, d, bias=False)

        def forward(self, x):
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))

    gpt = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))
    x = torch.randn(2, 5, d, requires_grad=True)
    assert _saved_values_per_token(gpt, x) == 9 * d
    assert _saved_values_per_token(SwiGLU(), x) == d + 4 * d_ff

    shape, s = MODELS["Llama 2 7B"], 4096
    assert (shape["d_ff"], shape["mlp_matrices"]) == (11008, 3)
    extra = (4 * shape["d_ff"] - 8 * shape["d_model"]) * 2 * s * shape["n_layers"]  # bf16
    assert round(extra / 1e9, 2) == 2.95
    at_4096 = llama_2_7b_budget(s)
    activations = at_4096["budget"]["activations"] + extra
    assert round(activations / 1e9, 1) == 54.5
    state = sum(at_4096["budget"].values()) - at_4096["budget"]["activations"]
    gpu = ACCELERATORS["H100 SXM"]["memory_bytes"]
    assert at_4096["gpus"] == 4 and math.ceil(state / (gpu - activations)) == 5
