"""Lesson 07's plan and explorer (solutions/parallel_plan.py, solutions/parallel_explorer.py)
against the lesson's functions and against a real block's saved tensors, and every number
lesson 07's text states, computed again."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from solutions.backprop import model_params
from solutions.memory import activation_bytes_per_layer
from solutions.parallel import (
    accumulation_comm_bytes,
    collective_bytes,
    min_tokens_to_hide_allreduce,
    pipeline_bubble_fraction,
    tensor_parallel_bytes,
    zero_bytes_per_device,
    zero_comm_bytes,
)
from solutions.parallel_demos import fit_alpha_beta, largest_fitting
from solutions.parallel_explorer import parallel_explorer, plan_html
from solutions.parallel_plan import block_activation_bytes, parallel_plan

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
H100 = json.loads((DATA / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((DATA / "interconnects.json").read_text())["H100 SXM node"]
PEAK, GPU_BYTES = H100["peak_flops"]["bf16"], H100["memory_bytes"]
LLAMA = MODELS["Llama 3 70B"]


def plan(dp=32, tp=8, pp=4, stage=1, micro=64, size=1, seq=8192, mfu=0.4, checkpointing=False,
         model=LLAMA, **options):
    """``parallel_plan`` with the explorer's first settings, changed."""
    return parallel_plan(model, dp, tp, pp, stage, micro, size, seq, mfu, checkpointing, PEAK,
                         GPU_BYTES, NODE, **options)


@given(st.sampled_from([1, 2, 8, 64, 1024]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4, 16]), st.integers(0, 3), st.sampled_from([1, 4, 16]),
       st.booleans(), st.booleans(), st.sampled_from([2, 4]), st.booleans())
def test_every_number_of_a_plan_is_the_lessons_functions(dp, tp, pp, stage, micro, ckpt, keep,
                                                         grad, overlap) -> None:
    got = plan(dp, tp, pp, stage, micro, 2, 4096, 0.5, ckpt, keep_unsharded=keep,
               bytes_per_grad=grad, overlap_param_gather=overlap)
    n = model_params(LLAMA)
    shard = -(-n // (tp * pp))
    held_as = stage if not (keep and stage >= 2) else (1 if micro > 1 else 2)
    assert sum(got["memory"][p] for p in ("weights", "gradients", "optimizer")) \
        == zero_bytes_per_device(shard, dp, held_as, 2, grad, 12)
    assert got["memory_total"] == sum(got["memory"].values())
    assert got["fits"] == (got["memory_total"] <= GPU_BYTES)
    assert got["traffic"]["data"] == accumulation_comm_bytes(shard, dp, stage, micro, keep, 2,
                                                             grad)
    layers = -(-LLAMA["n_layers"] // pp)
    per_layer = tensor_parallel_bytes(2, 4096, LLAMA["d_model"], tp)
    assert got["traffic"]["tensor"] == per_layer * layers * micro * (3 if ckpt else 2) // 2
    assert got["bubble"] == pipeline_bubble_fraction(pp, micro)
    one_layer = block_activation_bytes(4096, 2, LLAMA["d_model"], LLAMA["n_heads"],
                                       LLAMA["n_kv_heads"], LLAMA["d_ff"], 3)
    if not ckpt:
        assert got["memory"]["activations"] == math.ceil(layers * min(pp, micro) * one_layer / tp)
    assert got["gpus"] == dp * tp * pp and got["nodes"] == math.ceil(dp * tp * pp / 8)
    # hidden exactly when a micro-batch's tokens reach the threshold (which, for weights and
    # gradients of one width, is min_tokens_to_hide_allreduce's for every stage whose
    # collectives all overlap compute); the ratio may round either way at the boundary, so only
    # where the two are apart. ZeRO-1/2's all-gather of the updated weights overlaps nothing
    # unless Megatron's overlap_param_gather puts it behind the next forward pass.
    bandwidth = NODE["nvlink_bytes_per_s"] if tp * dp <= 8 else NODE["nic_bytes_per_s"]
    never = stage in (1, 2) and not overlap and dp > 1
    assert (got["min_tokens_to_hide"] == math.inf) == never
    if grad == 2 and not ckpt and dp > 1 and not never:
        assert math.isclose(got["min_tokens_to_hide"],
                            min_tokens_to_hide_allreduce(0.5 * PEAK, bandwidth, dp),
                            rel_tol=1e-12)
    if never:
        assert not got["hidden"]
    if dp > 1 and shard % dp == 0:
        ratio = got["tokens_per_microbatch"] / got["min_tokens_to_hide"]
        if abs(ratio - 1) > 1e-9:
            assert got["hidden"] == (ratio > 1)
    assert got["step_seconds"] >= got["compute_seconds"] / (1 - got["bubble"])
    assert got["step_seconds"] == pytest.approx(
        (got["compute_seconds"] + got["seconds"]["tensor"]) / (1 - got["bubble"])
        + got["exposed_seconds"], rel=1e-12)


def test_a_reduction_after_the_last_microbatch_overlaps_its_backward_pass_only() -> None:
    """The outside reviewer's example (issue 33): 16 micro-batches of one sequence of 2048 per
    copy, ZeRO-1 over 32 copies on the network cards. 32,768 tokens per copy per step are far
    above the 7,700 or so needed, but the step's reduce-scatter overlaps the last micro-batch's
    backward pass only, 85 ms against 46 ms; and the all-gather of the updated weights, 85 ms,
    follows the optimizer step (issue 44): nothing overlaps it as DeepSpeed runs ZeRO-1/2,
    125 ms exposed; the next step's first forward pass, 23 ms, under Megatron-LM's
    overlap_param_gather, 102 ms exposed. (tests/test_parallel_schedule.py simulates both.)"""
    shard = -(-model_params(LLAMA) // 32)
    rate = 0.4 * PEAK
    last_backward, first_forward = 4 * shard * 2048 / rate, 2 * shard * 2048 / rate
    traffic = accumulation_comm_bytes(shard, 32, 1, 16) / NODE["nic_bytes_per_s"]
    half = traffic / 2  # a reduce-scatter and an all-gather of bf16 values: equal bytes
    assert round(traffic, 3) == 0.171 and round(half, 3) == 0.085
    assert round(last_backward, 3) == 0.046 and round(first_forward, 3) == 0.023
    assert round((half - last_backward) * 1e3) == 40  # of the reduce-scatter, waiting
    deepspeed, megatron = plan(micro=16, seq=2048), plan(micro=16, seq=2048,
                                                         overlap_param_gather=True)
    assert deepspeed["overlapped_seconds"] == pytest.approx(last_backward, rel=1e-12)
    assert deepspeed["exposed_seconds"] == pytest.approx(half - last_backward + half, rel=1e-12)
    assert megatron["overlapped_seconds"] == pytest.approx(last_backward + first_forward,
                                                           rel=1e-12)
    assert megatron["exposed_seconds"] == pytest.approx(
        half - last_backward + half - first_forward, rel=1e-12)
    assert round(deepspeed["exposed_seconds"], 3) == 0.125 and not deepspeed["hidden"]
    assert round(megatron["exposed_seconds"], 3) == 0.102 and not megatron["hidden"]
    assert deepspeed["tokens_per_replica"] == 32_768 > megatron["min_tokens_to_hide"]
    assert round(megatron["min_tokens_to_hide"]) == 7_668
    assert deepspeed["min_tokens_to_hide"] == math.inf
    assert 16 * last_backward > traffic  # what the first count compared, wrongly
    # more micro-batches change nothing; four sequences per micro-batch (8,192 tokens) hide it
    # under Megatron's schedule and leave the all-gather's 85 ms under DeepSpeed's
    for overlap in (False, True):
        assert plan(micro=64, seq=2048, overlap_param_gather=overlap)["exposed_seconds"] \
            == plan(micro=16, seq=2048, overlap_param_gather=overlap)["exposed_seconds"]
    assert plan(micro=16, seq=2048, size=4, overlap_param_gather=True)["hidden"]
    four = plan(micro=16, seq=2048, size=4)
    assert four["exposed_seconds"] == pytest.approx(half, rel=1e-12)
    assert round(four["exposed_seconds"], 3) == 0.085


def test_zero_3_with_microbatches_gathers_again_for_every_pass_unless_it_keeps() -> None:
    """ZeRO-3 over all 1024 GPUs, 2 micro-batches of 8192 per copy: 846 GB per GPU per step
    (2 micro-batches x 3 collectives of the bf16 weights), 16.9 s over the NIC against 17.5 s
    of compute it overlaps (forward all-gathers against forward passes, the rest against
    backward passes); keeping weights and gradients whole: 282 GB, 141 GB more of each."""
    resharding, keeping = plan(1024, 1, 1, 3, 2), plan(1024, 1, 1, 3, 2, keep_unsharded=True)
    n = model_params(LLAMA)
    assert resharding["traffic"]["data"] == 2 * 3 * collective_bytes(
        "all_gather", -(-n // 1024) * 1024 * 2, 1024)
    assert round(resharding["traffic"]["data"] / 1e9) == 846
    assert round(resharding["traffic"]["data"] / (2 * n), 1) == 6.0
    assert round(resharding["seconds"]["data"], 1) == 16.9
    assert round(resharding["overlapped_seconds"], 1) == 17.5
    assert resharding["hidden"]
    margin = resharding["overlapped_seconds"] / resharding["seconds"]["data"] - 1
    assert 0.03 < margin < 0.04  # "3% to spare"
    assert round(keeping["traffic"]["data"] / 1e9) == 282
    extra = keeping["memory_total"] - resharding["memory_total"]
    assert round(keeping["memory"]["weights"] / 1e9) == 141 == round(
        keeping["memory"]["gradients"] / 1e9)
    assert round(extra / 1e9) == 282
    # with one micro-batch, section 6's 1.5 all-reduces
    assert plan(1024, 1, 1, 3, 1)["traffic"]["data"] == zero_comm_bytes(-(-n // 1), 1024, 3)


def test_fp32_gradients_hold_18_bytes_and_leave_the_threshold_where_it_was() -> None:
    """fp32 gradients double the reduce-scatter (171 ms at the first layout) but not the
    all-gather of the bf16 weights (85 ms): the reduce-scatter needs a last backward pass of
    7,668 tokens, as the all-gather needs a first forward pass of as many under Megatron's
    schedule. At 8192 tokens per micro-batch both hide there (183 and 91 ms of compute); under
    DeepSpeed's the all-gather's 85 ms stay in the step, as with bf16 gradients."""
    bf16, fp32 = plan(), plan(bytes_per_grad=4)
    shard = -(-model_params(LLAMA) // 32)
    assert fp32["memory"]["gradients"] == 2 * bf16["memory"]["gradients"] == 4 * shard
    one = plan(1, 1, 1, 0, 1, model=MODELS["Llama 2 7B"], bytes_per_grad=4)
    assert one["memory_total"] - one["memory"]["activations"] == 18 * model_params(
        MODELS["Llama 2 7B"])
    megatron = plan(bytes_per_grad=4, overlap_param_gather=True)
    assert round(fp32["seconds"]["data"], 3) == 0.256 and megatron["hidden"]
    assert round(megatron["overlapped_seconds"], 3) == 0.274  # 183 + 91 ms
    assert round(megatron["min_tokens_to_hide"]) == 7_668
    assert not fp32["hidden"] and not bf16["hidden"]
    assert fp32["exposed_seconds"] == bf16["exposed_seconds"]  # the all-gather alone
    assert round(fp32["exposed_seconds"], 3) == 0.085
    with pytest.raises(ValueError, match="bytes_per_grad must be 2"):
        plan(bytes_per_grad=3)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up as one kernel would run it: keeps its two inputs only."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        return grad * up * sig * (1 + gate * (1 - sig)), grad * gate * sig


class _RMSNorm(torch.autograd.Function):
    """RMSNorm as a fused kernel runs it (Megatron's, Transformer Engine's): keeps its bf16
    input and one fp32 inverse RMS per token. (PyTorch's eager RMSNorm in bf16 computes in fp32
    and keeps fp32 copies instead.)"""

    @staticmethod
    def forward(ctx, x, weight):
        inverse = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)
        ctx.save_for_backward(x, weight, inverse)
        return (x.float() * inverse).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, inverse = ctx.saved_tensors
        normed = x.float() * inverse
        g = grad.float() * weight.float()
        dx = inverse * (g - normed * (g * normed).mean(-1, keepdim=True))
        return dx.to(x.dtype), (grad.float() * normed).sum((0, 1)).to(weight.dtype)


def _saved_bytes(s, b, h, heads, kv, f, fused) -> tuple[int, int, torch.Tensor]:
    """The bytes of the distinct storages a bf16 pre-norm block with grouped-query attention
    (SDPA, which on the CPU runs FlashAttention's algorithm), fused RMSNorms and a SwiGLU MLP
    keeps for its backward pass, parameters left out; and the bytes of its per-token statistics
    among them (each norm's inverse RMS and the attention's log-sum-exp, fp32)."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    head = h // heads
    q, k, v, o = (nn.Linear(h, w, bias=False, dtype=dt)
                  for w in (h, kv * head, kv * head, h))
    o = nn.Linear(h, h, bias=False, dtype=dt)
    gate, up = nn.Linear(h, f, bias=False, dtype=dt), nn.Linear(h, f, bias=False, dtype=dt)
    down = nn.Linear(f, h, bias=False, dtype=dt)
    gains = [torch.ones(h, dtype=dt, requires_grad=True) for _ in range(2)]
    params = {p.untyped_storage().data_ptr() for m in (q, k, v, o, gate, up, down)
              for p in m.parameters()} | {g.untyped_storage().data_ptr() for g in gains}
    x = torch.randn(b, s, h, dtype=dt, requires_grad=True)
    storages: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        n1 = _RMSNorm.apply(x, gains[0])
        split = [z.view(b, s, -1, head).transpose(1, 2) for z in (q(n1), k(n1), v(n1))]
        a = nn.functional.scaled_dot_product_attention(*split, is_causal=True, enable_gqa=True)
        x2 = x + o(a.transpose(1, 2).reshape(b, s, h))
        n2 = _RMSNorm.apply(x2, gains[1])
        g, u = gate(n2), up(n2)
        product = _SwiGLU.apply(g, u) if fused else nn.functional.silu(g) * u
        out = x2 + down(product)
    statistics = 2 * b * s * 4 + b * heads * s * 4
    return sum(storages.values()), statistics, out


@pytest.mark.parametrize("fused", [True, False])
def test_block_activation_bytes_are_what_a_real_block_keeps(fused) -> None:
    s, b, h, heads, kv, f = 64, 2, 128, 8, 2, 352
    saved, statistics, out = _saved_bytes(s, b, h, heads, kv, f, fused)
    out.float().square().mean().backward()  # what was kept is enough for the backward pass
    counted = block_activation_bytes(s, b, h, heads, kv, f, 3, 2, fused)
    # the count leaves out the per-token statistics, as Korthikanti et al. do; nothing else
    assert counted < saved <= counted + statistics


@given(st.integers(1, 64), st.integers(1, 4), st.integers(1, 8), st.integers(1, 16))
def test_for_multi_head_attention_and_gelu_it_is_korthikantis_count(s, b, heads, per_head):
    h = heads * per_head
    assert block_activation_bytes(s, b, h, heads, heads, 4 * h, 2) == activation_bytes_per_layer(
        s, b, h, heads, 2, recompute_attention=True, dropout=False)


def test_llamas_block_keeps_5_or_27_percent_more_than_korthikantis() -> None:
    h, heads = LLAMA["d_model"], LLAMA["n_heads"]
    korthikanti = activation_bytes_per_layer(1, 1, h, heads, 2, True, False)
    fused = block_activation_bytes(1, 1, h, heads, 8, LLAMA["d_ff"], 3)
    unfused = block_activation_bytes(1, 1, h, heads, 8, LLAMA["d_ff"], 3, fused_gate=False)
    assert (korthikanti, fused, unfused) == (32 * h, 33.5 * h, 40.5 * h)
    assert round(fused / korthikanti - 1, 3) == 0.047 and round(unfused / korthikanti - 1, 3) \
        == 0.266
    assert round(80 * block_activation_bytes(8192, 1, h, heads, 8, LLAMA["d_ff"], 3) / 1e9) == 180


def test_one_gpu_holds_lesson_05s_sixteen_bytes_per_parameter() -> None:
    seven = MODELS["Llama 2 7B"]
    got = plan(1, 1, 1, 0, 1, 1, 4096, 0.4, False, seven)
    assert got["memory_total"] - got["memory"]["activations"] == 16 * model_params(seven)
    assert got["traffic"] == {"data": 0, "tensor": 0, "pipeline": 0} and got["bubble"] == 0


def test_bad_layouts_are_named() -> None:
    with pytest.raises(ValueError, match="tp=16: tensor parallelism stays inside one NVLink"):
        plan(tp=16)
    # Megatron splits the key/value heads too: 2 of them do not split over 4 ranks
    two_kv = {**MODELS["Llama 2 7B"], "n_kv_heads": 2}
    with pytest.raises(ValueError, match="n_kv_heads=2 does not split over 4"):
        plan(tp=4, model=two_kv)
    with pytest.raises(ValueError, match="d_ff=11007 does not split over 2"):
        plan(tp=2, model={**MODELS["Llama 2 7B"], "d_ff": 11007})
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
    # the GPU's 80 GB as a dashed line on the memory bar, where 80e9 falls on its scale
    scale = max(got["memory_total"], GPU_BYTES)
    assert f'data-line="{GPU_BYTES!r}"' in html
    assert f"left:{100 * GPU_BYTES / scale:.3f}%" in html and "dashed" in html


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_the_readout_says_traffic_first_and_what_it_overlaps() -> None:
    """Traffic that does not hide is set beside the compute it overlaps, in that order, and the
    threshold is per micro-batch (issue 31: "the backward pass is shorter (171 ms against
    46 ms)" read backwards)."""
    exposed = _text(plan_html(plan(micro=16, seq=2048), "H100 SXM", GPU_BYTES))
    assert ("Data-parallel traffic does not hide: its 171 ms overlap only 46 ms of compute, the "
            "backward pass of the last micro-batch for the reduce-scatter and nothing for the "
            "all-gather of the updated weights, which waits for the optimizer step (DeepSpeed's "
            "ZeRO-1/2, Megatron-LM's default); 125 ms of it add to the step.") in exposed
    assert "No size of micro-batch hides it: nothing overlaps the all-gather." in exposed
    megatron = _text(plan_html(plan(micro=16, seq=2048, overlap_param_gather=True), "H100 SXM",
                               GPU_BYTES))
    assert ("its 171 ms overlap only 68 ms of compute, the backward pass of the last micro-batch "
            "for the reduce-scatter and the next step's first forward pass for the all-gather of "
            "the updated weights (Megatron-LM's overlap_param_gather); 102 ms of it add to the "
            "step.") in megatron
    assert "It hides from 7,668 tokens per micro-batch; this run has 2,048." in megatron
    ddp = _text(plan_html(plan(stage=0, micro=16, seq=2048), "H100 SXM", GPU_BYTES))
    assert "the backward pass of the last micro-batch only; 125 ms" in ddp
    hidden = _text(plan_html(plan(1024, 1, 1, 3, 2), "H100 SXM", GPU_BYTES))
    assert ("hides: its 16.92 s overlap 17.52 s of compute, the forward and backward passes of "
            "every micro-batch") in hidden
    alone = _text(plan_html(plan(1, 1, 1, 0, 1, model=MODELS["Llama 2 7B"]), "H100 SXM",
                            GPU_BYTES))
    assert "Data-parallel traffic: none (one copy)." in alone
    assert alone.startswith("1 GPU in 1 node; ")  # one of each, not "1 GPUs in 1 node(s)"
    assert _text(plan_html(plan(), "H100 SXM", GPU_BYTES)).startswith("1,024 GPUs in 128 nodes; ")


def test_the_explorer_opens_on_the_tables_last_layout() -> None:
    panel = parallel_explorer(MODELS, {"H100 SXM": H100}, NODE)
    shown = panel.children[1].value
    table_row = plan(32, 8, 4, 1, 2048 // 32)  # section 10's "tensor 8, pipeline 4, ZeRO-1"
    assert f'data-bytes="{table_row["memory_total"]}"' in shown
    assert f'data-step="{table_row["step_seconds"]!r}"' in shown


def test_the_panel_shows_the_plan_of_its_controls() -> None:
    panel = parallel_explorer(MODELS, {"H100 SXM": H100}, NODE)
    box, shown = panel.children
    widgets = [w for column in box.children for w in column.children]
    controls = {next(c for c in w._dom_classes if c.startswith("ctc-")): w for w in widgets}
    assert len(controls) == 13
    assert f'data-bytes="{plan()["memory_total"]}"' in shown.value
    controls["ctc-zero"].value = 3
    controls["ctc-pp"].value = 1
    controls["ctc-checkpointing"].value = True
    assert f'data-bytes="{plan(stage=3, pp=1, checkpointing=True)["memory_total"]}"' \
        in shown.value
    controls["ctc-keep"].value = True
    controls["ctc-grads"].value = 4
    expected = plan(stage=3, pp=1, checkpointing=True, keep_unsharded=True, bytes_per_grad=4)
    assert f'data-bytes="{expected["memory_total"]}"' in shown.value
    assert f'data-bytes="{expected["traffic"]["data"]}"' in shown.value
    controls["ctc-zero"].value = 1
    controls["ctc-gather"].value = True
    expected = plan(stage=1, pp=1, checkpointing=True, keep_unsharded=True, bytes_per_grad=4,
                    overlap_param_gather=True)
    assert f'data-step="{expected["step_seconds"]!r}"' in shown.value
    assert expected["step_seconds"] < plan(stage=1, pp=1, checkpointing=True,
                                           bytes_per_grad=4)["step_seconds"]
    # every control's label has the same width, so that they line up
    assert {w.style.description_width for w in widgets} == {"160px"}


# ---------------------------------------------------------------- what lesson 07 says


def test_the_numbers_of_lesson_07s_text() -> None:
    # section 1: per rank, all-reduce 2(n-1)/n B and all-gather (n-1)/n B tend to 2B and B
    assert collective_bytes("all_reduce", 8192 * 10**6, 64) / 8192e6 == 1.96875
    # section 1: what NCCL achieves on 8 H100s (interconnects.json, with its sources): the
    # ring about 370 GB/s, a fifth below the 450 GB/s line rate; NVLS 480 GB/s, above it
    ring, nvls = NODE["nccl_ring_bus_bytes_per_s_measured"], NODE[
        "nccl_nvls_allreduce_bus_bytes_per_s_measured"]
    assert (ring, nvls) == (370e9, 480e9) and round(1 - ring / NODE["nvlink_bytes_per_s"], 1) \
        == 0.2 and nvls > NODE["nvlink_bytes_per_s"]
    # section 5: tokens per micro-batch to hide the bf16 all-reduce
    assert round(min_tokens_to_hide_allreduce(PEAK, NODE["nvlink_bytes_per_s"], 8)) == 1924
    nic = min_tokens_to_hide_allreduce(PEAK, NODE["nic_bytes_per_s"], 8)
    assert round(nic, -3) == 17_000 and round(min_tokens_to_hide_allreduce(
        0.4 * PEAK, NODE["nic_bytes_per_s"], 8), -3) == 7_000
    assert math.isclose(nic / min_tokens_to_hide_allreduce(PEAK, NODE["nvlink_bytes_per_s"], 8),
                        9)
    assert min_tokens_to_hide_allreduce(PEAK, 50e9, 8, 4) == 2 * nic  # fp32: twice the tokens
    # section 4's fit (issue 44): fitted with the ring's model, an NVLS all-reduce on 8 H100s
    # gives its bus bandwidth as beta, 480 GB/s, above the 450 GB/s line rate. nccl-tests
    # defines busbw = algbw x 2 (n-1)/n, with algbw = B / t the bytes per second of the call.
    algbw = nvls * 8 / (2 * 7)
    sizes = [2**k for k in range(20, 35)]
    _, beta = fit_alpha_beta(sizes, [size / algbw for size in sizes], 8)
    assert beta == pytest.approx(nvls, rel=1e-6) and beta > NODE["nvlink_bytes_per_s"]
    # section 6: the ZeRO paper's figure 1 and the 8 H100s
    assert [round(zero_bytes_per_device(7_500_000_000, 64, s) / 1e9, 1) for s in range(4)] \
        == [120.0, 31.4, 16.6, 1.9]
    largest = [largest_fitting(lambda n, s=s: zero_bytes_per_device(n, 8, s), GPU_BYTES)
               for s in range(4)]
    assert [round(n / 1e9, 1) for n in largest] == [5.0, 14.5, 21.3, 40.0]
    assert zero_comm_bytes(7_500_000_000, 64, 3) * 2 == 3 * zero_comm_bytes(7_500_000_000, 64, 2)
    # section 6: 80 GB = 80e9 bytes; CUDA reports 79.11 GiB, some 85e9: 5e9 or so more
    assert GPU_BYTES == 80e9
    reported = H100["memory_reported"]
    cuda_total = reported["cuda_total_gib"] * 2**30
    assert reported["cuda_total_gib"] == 79.11 and reported["nvidia_smi_mib"] == 81_559
    assert round(cuda_total / 1e9) == 85 and round((cuda_total - GPU_BYTES) / 1e9) == 5
    # section 6's choice: the first weight is 78% of the MLP's parameters
    assert round(64 * 128 / (64 * 128 + 128 + 128 * 16 + 16 + 16 * 4 + 4), 2) == 0.78
    # section 7: the measured MLP, and the ratio predicted (6: 12 units against 2)
    n_mlp = 256 * 1024 + 1024 + 1024 * 256 + 256
    assert (n_mlp, 4 * n_mlp) == (525_568, 2_102_272)
    from solutions.parallel import predicted_reshard_traffic_ratio
    assert predicted_reshard_traffic_ratio == 6.0 == accumulation_comm_bytes(
        n_mlp, 2, 3, 4, False, 4, 4) / accumulation_comm_bytes(n_mlp, 2, 3, 4, True, 4, 4)
    # section 7: keeping whole holds ZeRO-1's 31.4 GB instead of ZeRO-3's 1.9 GB
    assert round(zero_bytes_per_device(7_500_000_000, 64, 1) / 1e9, 1) == 31.4
    # section 8: Llama 3 70B, one sequence of 8192, 8 ranks: 0.94 GB per layer per step;
    # over NVLink a fraction of the layer's compute at 40% MFU, over a NIC more than it
    per_layer = tensor_parallel_bytes(1, 8192, LLAMA["d_model"], 8)
    assert round(per_layer / 1e9, 2) == 0.94
    compute = 6 * 8192 * model_params(LLAMA) / LLAMA["n_layers"] / 8 / (0.4 * PEAK)
    assert per_layer / NODE["nvlink_bytes_per_s"] < compute / 5
    assert per_layer / NODE["nic_bytes_per_s"] > compute
    # section 8: per token and block, 8 (t-1)/t d e bytes: 14 d at t = 8 in bf16, 115 KB
    per_token = tensor_parallel_bytes(1, 1, LLAMA["d_model"], 8)
    assert per_token == 14 * LLAMA["d_model"] and round(per_token / 1e3) == 115
    # section 8: Llama 3 70B's 8 key/value heads allow tensor parallelism of 8 at most
    assert LLAMA["n_kv_heads"] == 8
    # section 1: 1.75 B at 8 ranks, 2 B to three digits at 1024
    assert collective_bytes("all_reduce", 8 * 10**6, 8) == 1.75 * 8 * 10**6
    assert round(collective_bytes("all_reduce", 1024 * 10**6, 1024) / (1024 * 10**6), 2) == 2.0
    # section 9: 4 stages, 8 micro-batches
    assert round(pipeline_bubble_fraction(4, 8), 4) == 0.2727


def test_the_layouts_of_section_10_and_the_things_to_try() -> None:
    zero3 = plan(1024, 1, 1, 3, 2)
    tensor = plan(128, 8, 1, 1, 16)
    pipeline = plan(32, 8, 4, 1, 64)
    assert zero3["tokens_per_step"] == tensor["tokens_per_step"] == pipeline["tokens_per_step"] \
        == 16 * 2**20
    state = zero3["memory_total"] - zero3["memory"]["activations"]
    assert round(state / 1e9) == 1 and round(zero3["memory"]["activations"] / 1e9) == 180
    assert not zero3["fits"] and tensor["fits"] and pipeline["fits"]
    assert tensor["traffic"]["tensor"] > 1e12 and tensor["links"]["tensor"] == "NVLink"
    assert pipeline["memory_total"] < tensor["memory_total"]
    assert 0.03 < pipeline["bubble"] < 0.05  # "a few percent with 64 micro-batches"
    assert pipeline == plan()  # the explorer opens on this row
    # things to try: ZeRO-3 without tensor or pipeline parallelism, 32 copies, 64 micro-batches
    flat = plan(32, 1, 1, 3)
    assert round((flat["memory_total"] - flat["memory"]["activations"]) / 1e9) == 35
    assert round(flat["memory"]["activations"] / 1e9) == 180 and not flat["fits"]
    checkpointed = plan(32, 1, 1, 3, checkpointing=True)
    assert round(checkpointed["memory"]["activations"] / 1e9) == 13 and checkpointed["fits"]
    n = model_params(LLAMA)
    assert round(2 * n / 1e9) == 141  # the bf16 weights each pass gathers
    assert round(2 * n / 1e9, 1) == 141.1
    # each gather sends 31/32 of them (issue 44): 136.7 GB; 128 gathers 17.5 TB, and with the
    # 64 reduce-scatters 26.2 TB
    gather = collective_bytes("all_gather", -(-n // 32) * 32 * 2, 32)
    assert math.isclose(gather / (2 * n), 31 / 32, rel_tol=1e-9)
    assert round(gather / 1e9, 1) == 136.7 and round(128 * gather / 1e12, 1) == 17.5
    assert flat["traffic"]["data"] == 192 * gather
    assert round(flat["traffic"]["data"] / 1e12, 1) == 26.2
    kept = plan(32, 1, 1, 3, keep_unsharded=True)
    whole = kept["memory"]["weights"] + kept["memory"]["gradients"]
    assert round(whole / 1e9) == 282 and not kept["fits"]
    # ZeRO-3 at the first layout: state 9.6 GB -> 1 GB, traffic 8.5 GB -> 820 GB; keeping: back
    first, third = plan(), plan(stage=3)

    def state_of(p: dict) -> float:
        return (p["memory_total"] - p["memory"]["activations"]) / 1e9

    assert (round(state_of(first), 1), round(state_of(third))) == (9.6, 1)
    assert (round(first["traffic"]["data"] / 1e9, 1), round(third["traffic"]["data"] / 1e9)) \
        == (8.5, 820)
    third_kept = plan(stage=3, keep_unsharded=True)
    assert third_kept["memory"] == first["memory"] and third_kept["traffic"] == first["traffic"]
    # the first layout's ZeRO-1 collectives: a reduce-scatter of 85 ms behind the last backward
    # pass, 183 ms; the all-gather, 85 ms, exposed, or behind the next first forward pass, 91 ms
    shard, rate = -(-n // 32), 0.4 * PEAK
    reduce_scatter = collective_bytes("reduce_scatter", -(-shard // 32) * 32 * 2, 32) / NODE[
        "nic_bytes_per_s"]
    assert [round(x * 1e3) for x in (reduce_scatter, 4 * shard * 8192 / rate,
                                     2 * shard * 8192 / rate)] == [85, 183, 91]
    assert first["exposed_seconds"] == pytest.approx(reduce_scatter, rel=1e-12)
    assert plan(overlap_param_gather=True)["hidden"]
    assert round(2 * reduce_scatter * 1e3) == 171  # fp32 gradients: twice the bytes
    # pipeline stages 4 -> 1 at 64 micro-batches; 4 micro-batches
    assert plan(pp=1)["memory_total"] > plan()["memory_total"] and plan(pp=1)["bubble"] == 0
    assert round(plan()["bubble"], 3) == 0.045 and round(plan(micro=4)["bubble"], 2) == 0.43


def test_lesson_07_states_no_number_its_tests_do_not() -> None:
    """A coarse guard: the figures in the lesson's markdown that are not examples of a call are
    among those asserted above (update both together)."""
    import nbformat

    from grader.content.lessons import load_lesson

    nb = nbformat.read(load_lesson("07_many_devices").notebook, as_version=4)
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for figure in ["17,000", "7,000", "1,900", "78%", "8,192 of the 10,452", "370 GB/s",
                   "480 GB/s", "79.11 GiB", "85e9", "81,559 MiB", "5e9 bytes", "180 GB", "35 GB",
                   "13 GB",
                   "(4.5%)", "43%", "7,700", "5B, 14.5B, 21.3B or 40B", "846 GB", "16.9 s",
                   "17.5 s", "282 GB", "141 GB", "141.1 GB", "136.7 GB", "17.5 TB", "26.2 TB",
                   "8.5 times", "24 times", "31.4 GB", "525,568", "2,102,272", "171 ms",
                   "46 ms", "125 ms", "102 ms", "40 ms", "23 ms", "85 ms", "91 ms", "7,668",
                   "730 ms", "32,768", "5%", "27%", "183 ms", "9.6 GB", "820 GB", "450 GB/s",
                   "DeepSpeed 0.19.6", "Megatron Core 0.20", "PyTorch 2.13"]:
        assert figure in text, figure
    assert not re.search(r"\btens of µs\b|laptop|NCCL uses for large|the backward pass is shorter",
                         text)
    # issue 44: no all-gather of updated weights counted against a backward pass, and no
    # threshold of the count that did
    assert not re.search(r"11,500|256 ms|hide it again|FSDP2 does exactly this", text)
    # the exercise states every kind of input its hidden checks pass (issue 33): zero-length
    # tensors and integer dtypes for the ring
    ring = next(c.source for c in nb.cells if c.cell_type == "markdown"
                and "### Exercise: `ring_all_reduce`" in c.source)
    assert "A length of\n0" in ring and "integer" in ring and "One rank" in ring
