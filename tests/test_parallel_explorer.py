"""Lesson 07's explorer (solutions/parallel_explorer.py) against the lesson's functions, and
every number lesson 07's text states, computed again."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solutions.backprop import model_params
from solutions.memory import activation_bytes_per_layer
from solutions.parallel import (
    collective_bytes,
    min_tokens_to_hide_allreduce,
    pipeline_bubble_fraction,
    tensor_parallel_bytes,
    zero_bytes_per_device,
    zero_comm_bytes,
)
from solutions.parallel_demos import largest_fitting
from solutions.parallel_explorer import parallel_explorer, parallel_plan, plan_html

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
H100 = json.loads((DATA / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((DATA / "interconnects.json").read_text())["H100 SXM node"]
PEAK, GPU_BYTES = H100["peak_flops"]["bf16"], H100["memory_bytes"]
LLAMA = MODELS["Llama 3 70B"]


def plan(dp=32, tp=8, pp=4, stage=1, micro=16, size=1, seq=8192, mfu=0.4, checkpointing=False,
         model=LLAMA):
    return parallel_plan(model, dp, tp, pp, stage, micro, size, seq, mfu, checkpointing, PEAK,
                         GPU_BYTES, NODE)


@given(st.sampled_from([1, 2, 8, 64, 1024]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4, 16]), st.integers(0, 3), st.sampled_from([1, 4, 16]),
       st.booleans())
def test_every_number_of_a_plan_is_the_lessons_functions(dp, tp, pp, stage, micro, ckpt) -> None:
    got = plan(dp, tp, pp, stage, micro, 2, 4096, 0.5, ckpt)
    n = model_params(LLAMA)
    shard = -(-n // (tp * pp))
    assert sum(got["memory"][p] for p in ("weights", "gradients", "optimizer")) \
        == zero_bytes_per_device(shard, dp, stage)
    assert got["memory_total"] == sum(got["memory"].values())
    assert got["fits"] == (got["memory_total"] <= GPU_BYTES)
    assert got["traffic"]["data"] == zero_comm_bytes(shard, dp, stage)
    layers = -(-LLAMA["n_layers"] // pp)
    per_layer = tensor_parallel_bytes(2, 4096, LLAMA["d_model"], tp)
    assert got["traffic"]["tensor"] == per_layer * layers * micro * (3 if ckpt else 2) // 2
    assert got["bubble"] == pipeline_bubble_fraction(pp, micro)
    one_layer = activation_bytes_per_layer(4096, 2, LLAMA["d_model"], LLAMA["n_heads"], 2,
                                           recompute_attention=True, dropout=False)
    if not ckpt:
        assert got["memory"]["activations"] == math.ceil(layers * min(pp, micro) * one_layer / tp)
    assert got["gpus"] == dp * tp * pp and got["nodes"] == math.ceil(dp * tp * pp / 8)
    rate = 0.5 * PEAK
    bandwidth = NODE["nvlink_bytes_per_s"] if tp * dp <= 8 else NODE["nic_bytes_per_s"]
    # ZeRO-3 sends 1.5 times an all-reduce's bytes, so it needs 1.5 times the tokens
    assert got["min_tokens_to_hide"] == (1.5 if stage == 3 else 1) \
        * min_tokens_to_hide_allreduce(rate, bandwidth, dp)
    # hidden exactly when the replica's tokens reach the minimum (the ratio may round either
    # way at the boundary, so only where the two are apart)
    if dp > 1 and shard % dp == 0 and not ckpt:
        ratio = got["tokens_per_replica"] / got["min_tokens_to_hide"]
        if abs(ratio - 1) > 1e-9:
            assert got["hidden"] == (ratio > 1)
    assert got["step_seconds"] >= got["compute_seconds"] / (1 - got["bubble"])


def test_one_gpu_holds_lesson_05s_sixteen_bytes_per_parameter() -> None:
    seven = MODELS["Llama 2 7B"]
    got = plan(1, 1, 1, 0, 1, 1, 4096, 0.4, False, seven)
    assert got["memory_total"] - got["memory"]["activations"] == 16 * model_params(seven)
    assert got["traffic"] == {"data": 0, "tensor": 0, "pipeline": 0} and got["bubble"] == 0


def test_bad_layouts_are_named() -> None:
    with pytest.raises(ValueError, match="tp=16: tensor parallelism stays inside a node"):
        plan(tp=16)
    with pytest.raises(ValueError, match="dp must be >= 1"):
        plan(dp=0)
    with pytest.raises(ValueError, match=r"mfu must be in \(0, 1\]"):
        plan(mfu=0)


def test_the_readout_carries_the_plans_exact_values() -> None:
    got = plan()
    html = plan_html(got, "H100 SXM", GPU_BYTES)
    for part, n_bytes in got["memory"].items():
        assert f'data-part="{part}"' in html and f'data-bytes="{n_bytes}"' in html
    assert f'data-bytes="{got["memory_total"]}"' in html
    assert f'data-fits="{str(got["fits"]).lower()}"' in html
    assert f'data-step="{got["step_seconds"]!r}"' in html
    assert f'data-gpus="{got["gpus"]}"' in html


def test_the_panel_shows_the_plan_of_its_controls() -> None:
    panel = parallel_explorer(MODELS, {"H100 SXM": H100}, NODE)
    controls = {next(c for c in w._dom_classes if c.startswith("ctc-")): w
                for w in panel.children[:-1]}
    shown = panel.children[-1]
    assert f'data-bytes="{plan()["memory_total"]}"' in shown.value
    controls["ctc-zero"].value = 3
    controls["ctc-pp"].value = 1
    controls["ctc-checkpointing"].value = True
    assert f'data-bytes="{plan(stage=3, pp=1, checkpointing=True)["memory_total"]}"' \
        in shown.value


# ---------------------------------------------------------------- what lesson 07 says


def test_the_numbers_of_lesson_07s_text() -> None:
    # section 1: per rank, all-reduce 2(n-1)/n B and all-gather (n-1)/n B tend to 2B and B
    assert collective_bytes("all_reduce", 8192 * 10**6, 64) / 8192e6 == 1.96875
    # section 5: tokens per GPU per step to hide the bf16 all-reduce
    assert round(min_tokens_to_hide_allreduce(PEAK, NODE["nvlink_bytes_per_s"], 8)) == 1924
    nic = min_tokens_to_hide_allreduce(PEAK, NODE["nic_bytes_per_s"], 8)
    assert round(nic, -3) == 17_000 and round(min_tokens_to_hide_allreduce(
        0.4 * PEAK, NODE["nic_bytes_per_s"], 8), -3) == 7_000
    assert math.isclose(nic / min_tokens_to_hide_allreduce(PEAK, NODE["nvlink_bytes_per_s"], 8),
                        9)
    # section 6: the ZeRO paper's figure 1 and the 8 H100s
    assert [round(zero_bytes_per_device(7_500_000_000, 64, s) / 1e9, 1) for s in range(4)] \
        == [120.0, 31.4, 16.6, 1.9]
    largest = [largest_fitting(lambda n, s=s: zero_bytes_per_device(n, 8, s), GPU_BYTES)
               for s in range(4)]
    assert [round(n / 1e9, 1) for n in largest] == [5.0, 14.5, 21.3, 40.0]
    assert zero_comm_bytes(7_500_000_000, 64, 3) * 2 == 3 * zero_comm_bytes(7_500_000_000, 64, 2)
    # section 6's choice: the first weight is 78% of the MLP's parameters
    assert round(64 * 128 / (64 * 128 + 128 + 128 * 16 + 16 + 16 * 4 + 4), 2) == 0.78
    # section 7: Llama 3 70B, one sequence of 8192, 8 ranks: 0.94 GB per layer per step;
    # over NVLink a fraction of the layer's compute at 40% MFU, over a NIC more than it
    per_layer = tensor_parallel_bytes(1, 8192, LLAMA["d_model"], 8)
    assert round(per_layer / 1e9, 2) == 0.94
    compute = 6 * 8192 * model_params(LLAMA) / LLAMA["n_layers"] / 8 / (0.4 * PEAK)
    assert per_layer / NODE["nvlink_bytes_per_s"] < compute / 5
    assert per_layer / NODE["nic_bytes_per_s"] > compute
    # section 7: per token and block, 8 (t-1)/t d e bytes: 14 d at t = 8 in bf16, 115 KB
    per_token = tensor_parallel_bytes(1, 1, LLAMA["d_model"], 8)
    assert per_token == 14 * LLAMA["d_model"] and round(per_token / 1e3) == 115
    # section 1: 1.75 B at 8 ranks, 2 B to three digits at 1024
    assert collective_bytes("all_reduce", 8 * 10**6, 8) == 1.75 * 8 * 10**6
    assert round(collective_bytes("all_reduce", 1024 * 10**6, 1024) / (1024 * 10**6), 2) == 2.0
    # section 8: 4 stages, 8 micro-batches
    assert round(pipeline_bubble_fraction(4, 8), 4) == 0.2727


def test_the_layouts_of_section_9_and_the_things_to_try() -> None:
    zero3 = plan(1024, 1, 1, 3, 2)
    tensor = plan(128, 8, 1, 1, 16)
    pipeline = plan(32, 8, 4, 1, 64)
    assert zero3["tokens_per_step"] == tensor["tokens_per_step"] == pipeline["tokens_per_step"] \
        == 16 * 2**20
    state = zero3["memory_total"] - zero3["memory"]["activations"]
    assert round(state / 1e9) == 1 and round(zero3["memory"]["activations"] / 1e9) == 172
    assert not zero3["fits"] and tensor["fits"] and pipeline["fits"]
    assert zero3["traffic"]["data"] * 2 == 3 * zero_comm_bytes(-(-model_params(LLAMA) // 1),
                                                               1024, 2)
    # "three times the bf16 gradients' bytes"
    assert round(zero3["traffic"]["data"] / (2 * model_params(LLAMA)), 2) == 3.0
    assert tensor["traffic"]["tensor"] > 1e12 and tensor["links"]["tensor"] == "NVLink"
    assert pipeline["memory_total"] < tensor["memory_total"]
    assert 0.03 < pipeline["bubble"] < 0.05  # "a few percent with 64 micro-batches"
    # things to try: ZeRO-3 without tensor or pipeline parallelism, 32 copies
    flat = plan(32, 1, 1, 3, 16)
    assert round((flat["memory_total"] - flat["memory"]["activations"]) / 1e9) == 35
    assert round(flat["memory"]["activations"] / 1e9) == 172 and not flat["fits"]
    checkpointed = plan(32, 1, 1, 3, 16, checkpointing=True)
    assert round(checkpointed["memory"]["activations"] / 1e9) == 13 and checkpointed["fits"]
    # pipeline stages 4 -> 1 at 16 micro-batches; 4 micro-batches
    assert plan(pp=1)["memory_total"] > plan()["memory_total"] and plan(pp=1)["bubble"] == 0
    assert round(plan()["bubble"], 2) == 0.16 and round(plan(micro=4)["bubble"], 2) == 0.43
    # one micro-batch of 2048 tokens per copy: the all-reduce no longer hides
    small = plan(micro=1, seq=2048)
    assert small["tokens_per_replica"] == 2048 and not small["hidden"]
    assert round(small["min_tokens_to_hide"], -2) == 7700 and plan()["hidden"]


def test_lesson_07_states_no_number_its_tests_do_not() -> None:
    """A coarse guard: the figures in the lesson's markdown that are not examples of a call are
    among those asserted above (update both together)."""
    import nbformat

    from grader.lessons import load_lesson

    nb = nbformat.read(load_lesson("07_many_devices").notebook, as_version=4)
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for figure in ["17,000", "7,000", "1,900", "78%", "8,192 of the 10,452",
                   "172 GB", "35 GB", "13 GB", "(16%)", "43%", "7,700", "5B, 14.5B, 21.3B or 40B"]:
        assert figure in text, figure
    assert not re.search(r"\btens of µs\b|laptop", text)
