"""Lesson notebooks: in step with their sources, committed clean, and running end to end."""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest

from grader.content.lessons import all_lessons
from grader.content.sync import sync_lesson
from grader.grading import probe
from tests.lecture_run import lecture_run

LESSONS = all_lessons()
by_name = pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)

# The graded functions of each lesson (COURSE.md fixes their names and signatures).
EXERCISES = {
    "01_float_formats": ["FloatFormat", "split_bits", "decode", "encode", "max_finite",
                         "smallest_normal", "smallest_subnormal", "machine_epsilon",
                         "decode_tensor", "tensor_bytes", "predicted_bf16_stall"],
    "02_tensors_and_strides": ["contiguous_strides", "flat_offset", "transpose", "permute",
                               "slice_dim", "is_contiguous", "view_strides", "as_strided",
                               "broadcast_shapes", "split_heads", "merge_heads",
                               "attention_scores", "project",
                               "predicted_transpose_reshape_bytes"],
    "03_matmul_flops": ["matmul_flops", "einsum_flops", "matmul_bytes", "arithmetic_intensity",
                        "ridge_point", "roofline", "predicted_critical_batch_h100", "mfu"],
    "04_backprop_flops": ["two_layer_forward_backward", "two_layer_flops", "transformer_params",
                          "transformer_forward_flops", "training_flops", "training_days",
                          "predicted_days_70b"],
    "05_adamw_memory": ["AdamW", "training_memory", "quantize_blockwise", "dequantize_blockwise",
                        "largest_trainable_params", "predicted_mlp_training_bytes"],
    "06_training_step": ["train_step_flops", "saved_activation_bytes", "loss_scale_update",
                         "checkpoint_bytes", "predicted_step_bytes"],
    "07_many_devices": ["collective_bytes", "ring_all_reduce", "predicted_ring_bytes_per_rank",
                        "allreduce_seconds", "min_tokens_to_hide_allreduce",
                        "zero_bytes_per_device", "zero_comm_bytes", "accumulation_comm_bytes",
                        "tensor_parallel_bytes",
                        "pipeline_bubble_fraction"],
    "08_inference": ["kv_cache_bytes", "generate_flops", "predicted_cache_bytes_after_generation",
                     "decode_intensity", "max_batch_size", "decode_tokens_per_second",
                     "prefill_seconds", "simulate_serving"],
    "09_experts": ["moe_params", "moe_layer_flops", "expert_parallel_bytes", "dropped_tokens",
                   "predicted_experts_touched", "expected_experts_touched", "moe_decode_bytes"],
}


def grade_ids(nb: nbformat.NotebookNode, **flags: bool) -> list[str]:
    return [c.metadata.nbgrader["grade_id"] for c in nb.cells
            if "nbgrader" in c.metadata
            and all(c.metadata.nbgrader.get(k, False) == v for k, v in flags.items())]


@by_name
def test_notebook_is_in_step_with_solutions_cases_and_data(lesson) -> None:
    assert sync_lesson(lesson, write=False, log=lambda _: None) == []


@by_name
def test_notebook_is_committed_without_outputs(lesson) -> None:
    nb = nbformat.read(lesson.notebook, as_version=4)
    nbformat.validate(nb)
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None


@by_name
def test_no_text_cell_says_a_sentence_twice(lesson) -> None:
    """A sentence written twice in one cell is an editing slip (issue 44: lesson 08's section
    5 said its last sentence twice)."""
    nb = nbformat.read(lesson.notebook, as_version=4)
    for c in nb.cells:
        if c.cell_type == "markdown":
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(c.source.split()))
                         if len(s) > 30]
            assert len(sentences) == len(set(sentences)), c.source


@by_name
def test_every_graded_function_has_an_exercise_and_a_test_cell(lesson) -> None:
    nb = nbformat.read(lesson.notebook, as_version=4)
    solutions = grade_ids(nb, solution=True)
    tests = grade_ids(nb, grade=True)
    assert solutions == EXERCISES[lesson.name]
    assert tests == [f"test-{name}" for name in solutions]
    module = importlib.import_module(lesson.module)
    # A graded function, or a graded prediction: a number (or letter) the student commits to.
    assert all(callable(getattr(module, name)) or name.startswith(("predicted_", "choice_"))
               for name in solutions)
    assert len(set(grade_ids(nb))) == len(grade_ids(nb))  # nbgrader needs unique ids


# Errors that an exercise's text names without asking for them (it describes torch's behaviour).
DESCRIBED_NOT_ASKED = {("as_strided", "RuntimeError")}


@by_name
def test_every_error_an_exercise_asks_for_is_checked(lesson) -> None:
    """Every error that the text before a test cell names ("raise `ValueError` when ...") is
    tested by a check, and at least one of them by a visible check: students are graded on what
    the exercise says, and see that they are."""
    nb = nbformat.read(lesson.notebook, as_version=4)
    exercises = {e.name: e for e in probe.exercises(lesson)}
    text = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text += " " + cell.source
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.cell_type != "code" or not grade_id.startswith("test-"):
            continue
        name = grade_id.removeprefix("test-")
        asked = set(re.findall(r"`(\w+Error)`", text))  # every error the text names
        asked -= {error for exercise, error in DESCRIBED_NOT_ASKED if exercise == name}
        raises = [c for c in exercises[name].checks if isinstance(c.expected, probe.Raises)]
        missing = asked - {c.expected.name for c in raises}
        assert not missing, f"{name}: the text asks for {sorted(missing)}; no check tests it"
        assert not asked or any(not c.hidden for c in raises), f"{name}: no visible check_raises"
        text = ""


@pytest.mark.slow
@by_name
def test_instructor_notebook_runs_end_to_end_with_every_check_passing(lesson, shared_tmp) -> None:
    """In lecture mode (as `make demo` runs it). The autograde mode's run is the grader's own:
    tests/test_grading.py reads it from the graded instructor version."""
    mode = "lecture"
    nb, _, seconds = lecture_run(lesson, shared_tmp)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    passed = [c for c in nb.cells if "all visible checks passed" in
              "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                      for o in c.get("outputs", []))]
    assert len(passed) == len(EXERCISES[lesson.name])
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 2  # the lesson's plots rendered
    print(f"{lesson.name} ({mode}): {seconds:.1f} s")


def sealed_answers(nb: nbformat.NotebookNode) -> list[tuple[str, object]]:
    """(name, answer) of every check_prediction / check_choice call in the notebook; a graded
    prediction's check holds no answer (it is graded against the student's own numbers)."""
    import ast

    from grader.content.notebook_checks import _unseal

    found = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        try:
            tree = ast.parse(c.source.split("### BEGIN HIDDEN TESTS")[0])
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("check_prediction", "check_choice")):
                graded = any(k.arg == "graded" and ast.literal_eval(k.value) for k in node.keywords)
                assert (len(node.args) == 1) == graded, ast.unparse(node)  # graded: no answer
                if not graded:
                    name, sealed = (ast.literal_eval(a) for a in node.args[:2])
                    found.append((name, _unseal(sealed)))
    return found


@by_name
def test_every_sealed_answer_is_the_reference_value(lesson) -> None:
    """A prediction's answer is computed, not typed: the sealed value in the notebook is the
    reference module's constant of the same name (solutions/<module>.py)."""
    module = importlib.import_module(lesson.module)
    for name, answer in sealed_answers(nbformat.read(lesson.notebook, as_version=4)):
        reference = getattr(module, name, None)
        assert reference is not None, f"{lesson.module} defines no {name}"
        if isinstance(answer, str):
            assert answer == reference, name
        else:
            assert answer == pytest.approx(reference, rel=1e-9), name
