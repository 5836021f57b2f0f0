"""Portable truth: nothing the course checks depends on how a machine rounds the last bits.

Another CPU, BLAS, thread count or torch version computes the reference's rounded floats a few
units in the last place (ulps) away from ours, and an honest student's correct code, written in
another order, does the same. Three things must hold:

- every check compares a rounded float within a tolerance; exact comparison is kept for values
  that every correct implementation produces bit for bit (grader/content/cases/__init__.py);
- with every rounded reference value moved by a few ulps, as another machine would compute
  it, ``sync --check``, ``release`` and grading the instructor version (full marks) still pass,
  while a real change to a reference function is still caught;
- another correct implementation of each float-valued exercise scores full marks.
"""

from __future__ import annotations

import importlib
import math
import shutil
from collections.abc import Callable, Iterator

import nbformat
import pytest
import torch

from grader.content import sync
from grader.content.cases import Case, reference_value
from grader.content.lessons import all_lessons, load_lesson
from grader.grading import probe
from grader.grading.probe import Exercise, Raises, judge
from grader.grading.sandbox import bwrap_path
from tests.grading_helpers import released_course
from tests.test_budget import (
    chinchilla_loss_by_exp,
    compute_optimal_by_logs,
    isoflop_minimum_by_lstsq,
    lifetime_optimal_by_ternary_search,
    offload_seconds_other_order,
    run_cost_other_order,
)
from tests.test_experts import (
    expected_experts_touched_by_logs,
    expected_experts_touched_by_missing,
    expert_parallel_bytes_by_share,
    moe_decode_bytes_layer_by_layer,
)
from tests.test_inference import (
    decode_intensity_in_steps,
    decode_intensity_per_sequence,
    decode_tokens_per_second_as_min,
    decode_tokens_per_second_by_roofline,
)
from tests.test_memory import TextbookAdamW, dequantize_other_order, quantize_other_order
from tests.test_parallel import (
    allreduce_seconds_per_step,
    bubble_as_one_minus,
    min_tokens_by_times,
    ring_by_one_sum,
    ring_the_other_way,
)
from tests.test_serving import (
    prefill_seconds_as_tokens,
    prefill_seconds_by_roofline,
    simulate_in_fractions,
)
from tests.test_training import _loss_scale_in_float64, _loss_scale_with_torch

LESSONS = all_lessons()
by_name = pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)

# A float with at most this many significant bits, or a whole number below 2**53, is taken as
# untouched by rounding: the course's exact inputs are small integers and halves, and a rounded
# result almost never is either.
SHORT_BITS = 12
# How far the perturbation moves each rounded value: a few ulps, as a different summation
# order or FMA contraction does. Every tolerance in grader/cases is at least 8 ulps of its dtype.
ULPS = 3


def floats_in(value: object) -> Iterator[float]:
    """Every float in a (nested) expected value, tensors' elements included."""
    if type(value) is float:
        yield value
    elif type(value) in (tuple, list):
        for item in value:
            yield from floats_in(item)
    elif type(value) is dict:
        for item in value.values():
            yield from floats_in(item)
    elif type(value) is torch.Tensor and value.is_floating_point():
        yield from value.detach().to(torch.float64).reshape(-1).tolist()


def significant_bits(x: float) -> int:
    """Bits of ``x``'s significand that matter (0 for whole numbers below 2**53)."""
    if not math.isfinite(x) or (x == int(x) and abs(x) < 2**53):
        return 0
    mantissa, _ = math.frexp(abs(x))
    bits = 0
    while mantissa != int(mantissa):
        mantissa *= 2
        bits += 1
    return bits


@by_name
def test_every_rounded_float_is_compared_within_a_tolerance(lesson) -> None:
    """A check without tolerance holds only floats that no rounding touched, or belongs to an
    exercise its cases module declares exact by construction (with the reason). So do the
    checks of a few students' own plans: their numbers, and hidden inputs drawn for them."""
    from grader.content.variants import lesson_draw
    from grader.grading.plans import plan_for

    exact = getattr(importlib.import_module(lesson.cases), "EXACT", {})
    assert all(isinstance(why, str) and why for why in exact.values())
    loose = []
    plans = [probe.exercises(lesson), *(plan_for(lesson, lesson_draw(bytes(32), lesson, f"s{i}"))
                                        for i in range(3))]
    for exercise in (e for plan in plans for e in plan):
        for check in exercise.checks:
            if isinstance(check.expected, Raises) or check.rel_tol or check.abs_tol:
                continue
            longest = max(map(significant_bits, floats_in(check.expected)), default=0)
            if longest > SHORT_BITS and exercise.name not in exact:
                loose.append(f"{check.expression} ({longest} significant bits)")
    assert loose == [], ("give these checks a tolerance (grader/content/cases/__init__.py): "
                         + str(loose))


# ------------------------------------------------------------------ another machine's rounding


def nudge(value: object, steps: int, zeros: bool) -> object:
    """``value`` with every float moved ``steps`` ulps up (zeros too when ``zeros``)."""
    if type(value) is float:
        if not math.isfinite(value) or (value == 0 and not zeros):
            return value
        for _ in range(steps):
            value = math.nextafter(value, math.inf)
        return value
    if type(value) in (tuple, list):
        return type(value)(nudge(item, steps, zeros) for item in value)
    if type(value) is dict:
        return {key: nudge(item, steps, zeros) for key, item in value.items()}
    if type(value) is torch.Tensor and value.is_floating_point():
        moved = value.detach().clone()
        up = torch.full_like(moved, math.inf)
        for _ in range(steps):
            step = torch.nextafter(moved, up)
            keep = ~torch.isfinite(moved) | ((moved == 0) & (not zeros))
            moved = torch.where(keep, moved, step)
        return moved
    return value


def rounded_like_another_machine(steps: int) -> Callable[[Case, dict], object]:
    """``reference_value`` as another machine computes it: every value of a case with a
    tolerance (a rounded one) moved ``steps`` ulps; exact cases unchanged."""
    def reference(case: Case, namespace: dict) -> object:
        value = reference_value(case, namespace)
        if not (case.rel_tol or case.abs_tol):
            return value
        return nudge(value, steps, zeros=case.abs_tol > 0)
    return reference


@pytest.fixture
def another_machine(monkeypatch):
    """The grader and sync see reference values as another machine would compute them."""
    monkeypatch.setattr(sync, "reference_value", rounded_like_another_machine(ULPS))
    monkeypatch.setattr(probe, "reference_value", rounded_like_another_machine(ULPS))
    probe.exercises.cache_clear()
    yield
    probe.exercises.cache_clear()


def fresh_lines(lesson) -> list[str]:
    """The hidden-check lines of ``lesson`` as sync writes them with no notebook to keep."""
    module = importlib.import_module(lesson.module)
    cases = importlib.import_module(lesson.cases).CASES
    return [line for group in cases.values() for line in sync.hidden_check_lines(module, group)]


def test_another_machines_rounding_moves_many_literals(another_machine, monkeypatch) -> None:
    """The perturbation is real: a sync that compared literals as text would see these
    lines change."""
    elsewhere = {lesson.name: fresh_lines(lesson) for lesson in LESSONS}
    monkeypatch.setattr(sync, "reference_value", reference_value)
    here = {lesson.name: fresh_lines(lesson) for lesson in LESSONS}
    moved = {name: sum(a != b for a, b in zip(here[name], elsewhere[name], strict=True))
             for name in here}
    assert moved["04_backprop_flops"] >= 5 and moved["05_adamw_memory"] >= 10, moved


def test_sync_check_passes_on_another_machine(another_machine) -> None:
    assert sync.sync(LESSONS, check_only=True, log=lambda _: None) == 0


def test_sync_keeps_the_committed_literals_on_another_machine(another_machine) -> None:
    """``sync`` on another machine rewrites nothing: no churn between two authors' CPUs."""
    for lesson in LESSONS:
        want = nbformat.writes(sync.expected_notebook(lesson)) + "\n"
        assert want == lesson.notebook.read_text(), lesson.name


@pytest.mark.parametrize(("module", "function", "factor"), [
    ("solutions.backprop", "training_days", 1 + 1e-9),  # a tolerance of 1e-12 relative
    ("solutions.memory", "dequantize_blockwise", 1 + 1e-4),  # a tolerance of 1e-6 relative
    ("solutions.floats", "machine_epsilon", 1 + 2**-40),  # compared exactly
])
def test_a_real_change_to_a_reference_function_is_still_drift(another_machine, monkeypatch,
                                                              module, function, factor) -> None:
    solutions = importlib.import_module(module)
    original = getattr(solutions, function)
    monkeypatch.setattr(solutions, function, lambda *a, **k: original(*a, **k) * factor)
    lesson = next(lesson for lesson in LESSONS if lesson.module == module)
    drift = sync.sync_lesson(lesson, write=False, log=lambda _: None)
    assert drift and "differs from what solutions/" in drift[0]


@pytest.mark.slow
@pytest.mark.skipif(bwrap_path() is None, reason="grading needs bubblewrap")
@by_name
def test_release_and_grading_on_another_machine_give_full_marks(another_machine, lesson,
                                                                tmp_path, shared_tmp) -> None:
    """The lesson released here (the session's release) is what a release on another machine
    writes (test_sync_keeps_the_committed_literals_on_another_machine), and grading there gives
    the instructor version full marks."""
    from grader.course import Course

    assert sync.sync_lesson(lesson, write=False, log=lambda _: None) == []  # release's check
    course = Course(released_course([lesson], shared_tmp, tmp_path / "course"),
                    log=lambda _: None)
    submissions = tmp_path / "submissions" / "instructor"
    submissions.mkdir(parents=True)
    shutil.copyfile(lesson.notebook, submissions / lesson.notebook.name)
    statuses = course.autograde(lesson, submissions.parent, jobs=1)
    assert statuses["instructor"]["status"] == "graded", statuses
    [row] = course.grades()
    assert row["score"] == row["max_score"] > 0, row


# ------------------------------------------------------------------ students who round otherwise


def _decode(bits: int, fmt) -> float:
    """decode by powers of two instead of ldexp: (-1)^s (1 + m / 2^M) 2^(e - bias)."""
    sign, exponent, mantissa = floats.split_bits(bits, fmt)
    if exponent == 2**fmt.exponent_bits - 1:
        if fmt.ieee_specials:
            return math.nan if mantissa else (-math.inf if sign else math.inf)
        if mantissa == 2**fmt.mantissa_bits - 1:  # E4M3: only S.1111.111 is special
            return math.nan
    if exponent == 0:
        magnitude = mantissa / 2**fmt.mantissa_bits * 2.0 ** (1 - fmt.bias)
    else:
        magnitude = (1 + mantissa / 2**fmt.mantissa_bits) * 2.0 ** (exponent - fmt.bias)
    return -magnitude if sign else magnitude


def _decode_tensor(bits: torch.Tensor, fmt) -> torch.Tensor:
    codes = (bits.to(torch.int64) & (2**fmt.total_bits - 1)).reshape(-1).tolist()
    return torch.tensor([_decode(c, fmt) for c in codes], dtype=torch.float32).reshape(bits.shape)


def _max_finite(fmt) -> float:
    top = 2**fmt.exponent_bits - (2 if fmt.ieee_specials else 1)
    mantissa = 2**fmt.mantissa_bits - (1 if fmt.ieee_specials else 2)
    return (1 + mantissa / 2**fmt.mantissa_bits) * 2.0 ** (top - fmt.bias)


def _two_layer_in_float64(x, w1, w2):
    """Computed in float64, then rounded once to x's dtype."""
    loss, g1, g2 = backprop.two_layer_forward_backward(x.double(), w1.double(), w2.double())
    return loss.to(x.dtype), g1.to(x.dtype), g2.to(x.dtype)


def _two_layer_by_autograd(x, w1, w2):
    w1, w2 = w1.detach().requires_grad_(), w2.detach().requires_grad_()
    loss = ((x @ w1 @ w2) ** 2).mean()
    loss.backward()
    return loss.detach(), w1.grad, w2.grad


def _two_layer_other_order(x, w1, w2):
    """The gradient of y passed down as (2 / n) * y, and w2's gradient as (y^T h)^T."""
    h = x @ w1
    y = h @ w2
    grad_y = (2 / y.numel()) * y
    return (y * y).sum() / y.numel(), x.T @ (grad_y @ w2.T), (grad_y.T @ h).T


floats = importlib.import_module("solutions.floats")
backprop = importlib.import_module("solutions.backprop")

# For each float-valued exercise: other correct implementations, as an honest student might
# write them. Each must score full marks on every value check, visible and hidden.
ALTERNATIVES: dict[str, dict[str, list[Callable]]] = {
    "01_float_formats": {
        "decode": [_decode],
        "decode_tensor": [_decode_tensor],
        "max_finite": [_max_finite],
        "smallest_normal": [lambda fmt: 2.0 ** (1 - fmt.bias)],
        "smallest_subnormal": [lambda fmt: 2.0 ** (1 - fmt.bias) / 2**fmt.mantissa_bits],
        "machine_epsilon": [lambda fmt: 1.0 / 2**fmt.mantissa_bits],
        # a prediction: other answers within its band of 25% (and an int, as a student writes it)
        "predicted_bf16_stall": [floats.predicted_bf16_stall * 1.1, 4],
    },
    "02_tensors_and_strides": {
        "attention_scores": [lambda q, k: (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1),
                             lambda q, k: q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5],
        "project": [lambda x, w: x @ w, lambda x, w: torch.nn.functional.linear(x, w.T)],
        # a prediction: other answers within its band of 10%: 4 MB in decimal units, as an int
        "predicted_transpose_reshape_bytes": [4.0e6, 4_194_304],
    },
    "03_matmul_flops": {
        "arithmetic_intensity": [lambda flops, bytes: flops * (1.0 / bytes)],
        "ridge_point": [lambda peak, bandwidth: peak * (1.0 / bandwidth)],
        "roofline": [lambda i, peak, bw: float(peak if i >= peak / bw else i * bw)],
        "mfu": [lambda flops, seconds, peak: flops / (seconds * peak),
                lambda flops, seconds, peak: (flops / peak) / seconds],
        # a prediction: another answer within its band of 10% (the exact crossing of a wide
        # layer, 3% above the ridge point, or a rounder number)
        "predicted_critical_batch_h100": [305.0, 300],
    },
    "04_backprop_flops": {
        "two_layer_forward_backward": [_two_layer_in_float64, _two_layer_by_autograd,
                                       _two_layer_other_order],
        "training_flops": [lambda n, d: 6.0 * n * d, lambda n, d: n * (d * 6.0)],
        "training_days": [lambda f, g, p, m: f / 86_400 / g / p / m,
                          lambda f, g, p, m: f / (86_400.0 * g * p * m)],
        # a prediction: other answers within its band of 10% (rounded, or with a peak of
        # 1000 TFLOP/s)
        "predicted_days_70b": [144, 6 * 70e9 * 15e12 / (1024 * 1000e12 * 0.5) / 86_400],
    },
    "05_adamw_memory": {
        "AdamW": [TextbookAdamW],
        "quantize_blockwise": [quantize_other_order],
        "dequantize_blockwise": [dequantize_other_order],
        # a prediction, graded within 10%: 5% above the answer, and 16 bytes per parameter
        # with the biases forgotten (3200 parameters: 2.7% low), written as an int
        "predicted_mlp_training_bytes": [52_608 * 1.05, 51_200],
    },
    "06_training_step": {
        "loss_scale_update": [_loss_scale_in_float64, _loss_scale_with_torch],
        # a prediction, graded within 5%: 3% above the answer, and the answer without the
        # causal masks and the token ids (16,384 bytes fewer), written as an int
        "predicted_step_bytes": [8_153_092 * 1.03, 8_136_708],
    },
    "07_many_devices": {
        "ring_all_reduce": [ring_the_other_way, ring_by_one_sum],
        "allreduce_seconds": [allreduce_seconds_per_step],
        "min_tokens_to_hide_allreduce": [min_tokens_by_times],
        "pipeline_bubble_fraction": [bubble_as_one_minus],
        # a prediction, graded within 5%: 4% below the answer, and 18 MB read as 18e6 bytes
        # (4.6% below 18 MiB)
        "predicted_ring_bytes_per_rank": [18_874_368 * 0.96, 18_000_000],
    },
    "08_inference": {
        "decode_intensity": [decode_intensity_per_sequence, decode_intensity_in_steps],
        "decode_tokens_per_second": [decode_tokens_per_second_as_min,
                                     decode_tokens_per_second_by_roofline],
        # a prediction, graded within 1%: 0.8% above, and the answer rounded to 385,000
        "predicted_cache_bytes_after_generation": [385_024 * 1.008, 385_000],
        "prefill_seconds": [prefill_seconds_by_roofline, prefill_seconds_as_tokens],
        "simulate_serving": [simulate_in_fractions],
    },
    "09_experts": {
        "expert_parallel_bytes": [expert_parallel_bytes_by_share],
        "expected_experts_touched": [expected_experts_touched_by_logs,
                                     expected_experts_touched_by_missing],
        "moe_decode_bytes": [moe_decode_bytes_layer_by_layer],
        # a prediction, graded within 5%: 4% above the answer, and e^(-Tk/E)'s 55.3 (2% below)
        "predicted_experts_touched": [56.44370643064008 * 1.04, 64 * (1 - math.exp(-2))],
    },
    "10_budget": {
        "chinchilla_loss": [chinchilla_loss_by_exp],
        "compute_optimal": [compute_optimal_by_logs],
        "lifetime_optimal": [lifetime_optimal_by_ternary_search],
        "isoflop_minimum": [isoflop_minimum_by_lstsq],
        "run_cost": [run_cost_other_order],
        "offload_seconds": [offload_seconds_other_order],
        # a prediction, graded within 5%: 4% above the answer, and 8 as a student rounds it
        "predicted_model_growth": [8.00250227816105 * 1.04, 8],
    },
}


def rounds_floats(lesson) -> list[str]:
    """The exercises whose float results may be rounded: those with a check that has a
    tolerance or with a float that is not short, and those declared exact by construction."""
    exact = getattr(importlib.import_module(lesson.cases), "EXACT", {})
    return [e.name for e in probe.exercises(lesson)
            if e.name in exact or any(c.rel_tol or c.abs_tol or significant_bits(x) > SHORT_BITS
                                      for c in e.checks for x in floats_in(c.expected))]


@by_name
def test_every_float_valued_exercise_has_another_correct_implementation(lesson) -> None:
    assert set(rounds_floats(lesson)) <= set(ALTERNATIVES.get(lesson.name, {}))


def alternative_cases() -> list:
    return [pytest.param(lesson, name, i, id=f"{name}-{i}")
            for lesson in LESSONS for name, variants in ALTERNATIVES.get(lesson.name, {}).items()
            for i in range(len(variants))]


@pytest.mark.parametrize(("lesson", "name", "variant"), alternative_cases())
def test_another_correct_implementation_scores_full_marks(lesson, name, variant) -> None:
    """Judged exactly as the grader judges a kernel's results, on every value check."""
    exercise = next(e for e in probe.exercises(lesson) if e.name == name)
    values = Exercise(name, exercise.points,
                      [c for c in exercise.checks if not isinstance(c.expected, Raises)])
    module = importlib.import_module(lesson.module)
    namespace = {**vars(module), "math": math, "torch": torch,
                 name: ALTERNATIVES[lesson.name][name][variant]}
    results = [eval(check.expression, dict(namespace)) for check in values.checks]
    verdict = judge(values, results)
    assert verdict.points == values.points, verdict.summary()


def test_a_wrong_implementation_still_loses_its_points() -> None:
    """The tolerances are narrow: the usual mistakes still fail."""
    lesson = load_lesson("04_backprop_flops")
    exercise = next(e for e in probe.exercises(lesson) if e.name == "training_days")
    namespace = {**vars(backprop), "math": math, "torch": torch,
                 "training_days": lambda f, g, p, m: f / (g * p * m) / 86_164}  # sidereal day
    values = [c for c in exercise.checks if not isinstance(c.expected, Raises)]
    results = [eval(c.expression, dict(namespace)) for c in values]
    assert judge(Exercise("training_days", 1.0, values), results).points == 0
