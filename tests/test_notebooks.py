"""Lesson notebooks: in step with their sources, committed clean, and running end to end."""

from __future__ import annotations

import ast
import importlib
import math
import re

import nbformat
import pytest

from grader.common import syntax
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
    "10_budget": ["chinchilla_loss", "predicted_model_growth", "compute_optimal",
                  "isoflop_minimum", "lifetime_optimal", "run_cost", "offload_seconds"],
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

# Bad input the reference refuses though its exercise's text does not ask it to (no check may
# then try it): (exercise, words of the `raise` statement, or "helper: Error").
REFUSED_BEYOND_THE_TEXT = {
    ("flat_offset", "storage_offset must be >= 0"),
    ("slice_dim", "offset must be >= 0"),
    ("broadcast_shapes", "sizes must be >= 0"),
    ("einsum_flops", "ellipsis"),
    ("einsum_flops", "shapes were given"),
    ("einsum_flops", "indices must be letters"),
    ("einsum_flops", "is negative"),
    ("einsum_flops", "is in neither operand"),
    ("einsum_flops", "repeats an index"),
    ("two_layer_flops", "input_requires_grad must be True or False"),
    ("transformer_params", "tied_embeddings must be True or False"),
    # a layout torch cannot have: transpose's text asks for it (with `_layout`), these do not
    ("permute", "_layout: ValueError"),
    ("slice_dim", "_layout: ValueError"),
    ("view_strides", "_layout: ValueError"),
}


def _functions(reference: object) -> list:
    """A graded function, or the methods of a graded class."""
    import inspect

    if inspect.isclass(reference):
        return [inspect.unwrap(f) for f in vars(reference).values() if inspect.isfunction(f)]
    return [reference]


def _syntax_tree(function) -> tuple[ast.AST, list[str], int]:
    import inspect
    import textwrap

    lines, start = inspect.getsourcelines(function)
    return ast.parse(textwrap.dedent("".join(lines))), lines, start


def _helper_errors(module, name: str, seen: frozenset = frozenset()) -> set[str]:
    """The errors a given helper of ``module`` (``_positive_ints``, ``_layout``, ...) raises:
    those its docstring names, its `raise` statements', and those of the helpers it calls."""
    import inspect

    helper = getattr(module, name, None)
    if not (name.startswith("_") and inspect.isfunction(helper)) or name in seen:
        return set()
    errors = set(re.findall(r"\b(\w+Error)\b", helper.__doc__ or ""))
    for node in ast.walk(_syntax_tree(helper)[0]):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and isinstance(node.exc.func, ast.Name):
            errors.add(node.exc.func.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            errors |= _helper_errors(module, node.func.id, seen | {name})
    return errors


def refusals(module, reference: object) -> list[tuple[object, str, str]]:
    """Where a graded function (or class) refuses bad input, as (where, error, words): each
    `raise SomeError(...)` of its own code (where: its line in the module's file; words: its
    source), and each error of each given helper it calls (where and words: "helper: Error")."""
    found = []
    for function in _functions(reference):
        tree, lines, start = _syntax_tree(function)
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and isinstance(node.exc.func, ast.Name):
                found.append((node.lineno + start - 1, node.exc.func.id,
                              " ".join(lines[node.lineno - 1:node.end_lineno]).strip()))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                for error in _helper_errors(module, node.func.id):
                    found.append((f"{node.func.id}: {error}", error, f"{node.func.id}: {error}"))
    return found


def refusals_reached(reference: object, expressions: list[str], namespace: dict) -> set[object]:
    """The refusals (as ``refusals`` names their places) that the expressions, evaluated on
    the reference, end in: the line of its own code (nested code included) that the error
    left it from, and each given helper the error passed through, with the error."""
    import inspect

    codes, stack = set(), [f.__code__ for f in _functions(reference)]
    while stack:
        code = stack.pop()
        codes.add(code)
        stack += [c for c in code.co_consts if inspect.iscode(c)]
    reached = set()
    for expression in expressions:
        try:
            syntax.evaluate(expression, dict(namespace))
        except Exception as error:
            builtin = next(c for c in type(error).__mro__ if c.__module__ == "builtins")
            traceback, line = error.__traceback__, None
            while traceback is not None:
                code = traceback.tb_frame.f_code
                if code in codes:
                    line = traceback.tb_lineno
                reached.add(f"{code.co_name}: {builtin.__name__}")
                traceback = traceback.tb_next
            reached.add(line)
    return reached


@by_name
def test_every_error_an_exercise_asks_for_is_checked(lesson) -> None:
    """Every error that the text before a test cell names ("raise `ValueError` when ...") is
    tested by a check, and every bad input a hidden check tries is tried by a visible one too:
    students are graded on what the exercise says, and Validate never counts as passing an
    exercise that grading fails on bad input (lesson 05's `dequantize_blockwise` once asked for
    three errors its visible checks never tried). Case by case where the reference tells cases
    apart: every `raise` of an asked error in its code, and every asked error of a given helper
    it calls (`_positive_ints`, `_integer`, ...), is reached by a visible check. (Cases that
    share one `raise`, or one helper, are not told apart: issue 42's audit read the texts for
    those.)"""
    import torch

    nb = nbformat.read(lesson.notebook, as_version=4)
    exercises = {e.name: e for e in probe.exercises(lesson)}
    module = importlib.import_module(lesson.module)
    namespace = {**vars(module), "math": math, "torch": torch}
    text = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text += " " + cell.source
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.cell_type != "code" or not grade_id.startswith("test-"):
            continue
        name = grade_id.removeprefix("test-")
        asked = set(re.findall(r"`(\w+Error)`", text))  # every error the text names
        for helper in re.findall(r"`(_\w+)", text):  # "check the sizes with `_positive_ints`"
            asked |= _helper_errors(module, helper)
        asked -= {error for exercise, error in DESCRIBED_NOT_ASKED if exercise == name}
        raises = [c for c in exercises[name].checks if isinstance(c.expected, probe.Raises)]
        missing = asked - {c.expected.name for c in raises}
        assert not missing, f"{name}: the text asks for {sorted(missing)}; no check tests it"
        assert not asked or any(not c.hidden for c in raises), f"{name}: no visible check_raises"
        visible = {c.expression for c in raises if not c.hidden}
        unseen = [c.expression for c in raises if c.hidden and c.expression not in visible]
        assert unseen == [], f"{name}: bad input only hidden checks try: {unseen}"
        # Case by case, as far as the reference's code tells them apart: each of its `raise`
        # statements of an error the text asks for, and each such error of a given helper it
        # calls, is reached by a visible check.
        reference = getattr(module, name, None)
        if asked and callable(reference):
            places = [(where, words) for where, error, words in refusals(module, reference)
                      if error in asked]
            beyond = [words for exercise, words in REFUSED_BEYOND_THE_TEXT if exercise == name]
            assert all(any(w in words for _, words in places) for w in beyond), beyond
            reached = refusals_reached(reference, sorted(visible), namespace)
            untried = sorted({words for where, words in places if where not in reached
                              and not any(w in words for w in beyond)})
            assert untried == [], f"{name}: no visible check reaches {untried}"
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
    said = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                    for o in c.get("outputs", [])) for c in nb.cells]
    passed = [text for text in said if "all visible checks passed" in text]
    recorded = [text for text in said if "recorded; graded when you hand in" in text]
    assert len(recorded) == 1  # the graded prediction: recorded, never said to pass
    assert len(passed) + len(recorded) == len(EXERCISES[lesson.name])
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


# ---------------------------------------------------------------- a student's own answer, unseen


# A number as a cell may print it: 52,608, 52608, 52608.0, 5.26e+04, 5.26e4, 51.4 KiB, 0.0526 MB.
PRINTED_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?"
                            r"(?:\s?(KiB|MiB|GiB|kB|KB|MB|GB|%))?(?!\w)")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def printed_numbers(text: str) -> list[tuple[float, float, str]]:
    """(value, half a unit of its last digit, as printed) of every number in ``text`` that says
    enough to be told from the lesson's other numbers: three significant digits or more, a
    decimal point, an exponent or a unit of bytes (not a bare 4 or 16, which any lesson prints).
    Percentages are shares, not the quantities predicted, and are left out."""
    found = []
    for match in PRINTED_NUMBER.finditer(text):
        whole, fraction, exponent, unit = match.groups()
        if unit == "%":
            continue
        digits = (whole + (fraction or "")).replace(",", "").replace(".", "").lstrip("0")
        if len(digits) < 3 and not (fraction or exponent or unit):
            continue
        power = int((exponent or "e0")[1:]) - (len(fraction) - 1 if fraction else 0)
        value = float(whole.replace(",", "") + (fraction or "") + (exponent or ""))
        half_unit = 0.5 * float(f"1e{power}")  # inf or 0 beyond float's range: no match
        value, half_unit = value * UNITS.get(unit, 1), half_unit * UNITS.get(unit, 1)
        if not math.isfinite(value * half_unit):  # an id such as 653e845, not a quantity
            continue
        found.append((value, half_unit, match.group(0)))
    return found


def shows(text: str, answer: float) -> list[str]:
    """The numbers of ``text`` that are ``answer`` as a cell prints it: rounded to the last
    digit it shows (206.1 for 206.125, 5.26e+04 or 51.4 KiB for 52,608)."""
    return [printed for value, half_unit, printed in printed_numbers(text)
            if abs(value - answer) <= half_unit * (1 + 1e-9)]


def shown_text(nb: nbformat.NotebookNode, skip: set[int]) -> str:
    """Everything the run shows: each cell's outputs (but the cells of ``skip``, and those of
    the cells that read a clock: a measurement, another on every run) and the state of its
    widgets (what an explorer displays)."""
    import json

    parts = [json.dumps(nb.metadata.get("widgets", {}))]
    skip = skip | clocked_cells(nb)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if index not in skip else []:
            parts += [output.get("text", ""), output.get("evalue", ""),
                      *output.get("traceback", []),
                      *(str(v) for k, v in output.get("data", {}).items() if k.startswith("text/"))]
    return "\n".join(parts)


@pytest.mark.slow
@by_name
def test_no_output_shows_a_student_their_own_graded_answer(lesson, shared_tmp) -> None:
    """The lecture run (tests/lecture_run.py) is a student's with an id, whose variant is not
    the default: the variant cell shows their numbers, and nothing the lesson prints, top to
    bottom, but the prediction's own cells (where their number goes in) holds the answer for
    their numbers, or for any other student's, in any form a number may be printed. The cells
    after a prediction measure the course's default; no student with an id draws it."""
    from grader.content.variants import variants_of
    from grader.grading.plans import variant_answer
    from tests.lecture_run import LECTURE_STUDENT, lecture_variant

    nb, _, _ = lecture_run(lesson, shared_tmp)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]
    for name, spec in variants_of(lesson).items():
        index = lecture_variant(lesson)[name]
        [shown] = nb.cells[ids.index(f"variant-{name}")].outputs
        assert f"drawn for {LECTURE_STUDENT}): {spec.said(index)}" in shown.data["text/plain"]
        text = shown_text(nb, {ids.index(name), ids.index(f"test-{name}")})
        for other in range(1, len(spec.choices)):
            answer = float(variant_answer(lesson, name, other))
            assert shows(text, answer) == [], (name, other, answer)


PERCENTAGE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?%")
LATEX_POWER = re.compile(r"(\d(?:\.\d+)?)\s*\\times\s*10\^\{?(-?\d+)\}?")  # 6.10 \times 10^{-5}
# What a graded prediction's answer is a share of, where it is one (a percentage of it would
# give the answer away): the experts a decode step reads, of the layer's experts.
SHARE_OF = {"predicted_experts_touched": "layer_experts"}


def given_before(text: str, answer: float, band: float, whole: float | None) -> list[str]:
    """The numbers of ``text`` that give ``answer`` within ``band`` (relative): a number as
    ``printed_numbers`` reads it (bytes in any unit, LaTeX's powers of ten; a bare 4 or 16,
    which every lesson prints, tells nothing), or a percentage of ``whole``, where the answer is
    a share of one of the variant's numbers ("87% of DeepSeek-V3's 256" gives 221.5 experts)."""
    text = LATEX_POWER.sub(r"\1e\2", text)
    found = [printed for value, _, printed in printed_numbers(text)
             if abs(value - answer) <= band * abs(answer)]
    if whole is not None:
        found += [match.group(0) for match in PERCENTAGE.finditer(text)
                  if abs(float(match.group(1)) / 100 * whole - answer) <= band * abs(answer)]
    return found


# A cell that reads a clock: what it prints is a measurement, another on every run and machine
# (lesson 09's dense layer ran at 89.55 µs a token once inside one variant's band, lesson 03's
# unfused GELU 19.1 ms once, another's answer to the digit shown). The clocks, and the
# course's helpers that read one; a function a notebook defines in a cell that calls a clock
# reads one too (lesson 03's ``measure``), and so on.
CLOCKS = ("perf_counter", "perf_counter_ns", "seconds_per_call", "run_demo", "timeit",
          "monotonic")


def _called(node: ast.AST) -> set[str]:
    """The names ``node`` calls (``f(...)``, ``time.f(...)``), not counting inside the
    functions it defines."""
    found: set[str] = set()
    stack = [node]
    while stack:
        here = stack.pop()
        if isinstance(here, ast.Call):
            function = here.func
            found.add(function.id if isinstance(function, ast.Name) else
                      function.attr if isinstance(function, ast.Attribute) else "")
        stack += [child for child in ast.iter_child_nodes(here)
                  if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]
    return found


def clocked_cells(nb: nbformat.NotebookNode) -> set[int]:
    """The indexes of the code cells whose run reads a clock: a cell that calls one, or a
    function of the notebook's whose body calls one (lesson 03's ``measure``), and so on."""
    trees = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            try:  # an IPython magic's line is no Python: left out
                trees[index] = ast.parse("\n".join(
                    line for line in cell.source.splitlines()
                    if not line.lstrip().startswith(("%", "!"))))
            except SyntaxError:
                continue
    functions = {node.name: _called(ast.Module(body=node.body, type_ignores=[]))
                 for tree in trees.values() for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    clocks = set(CLOCKS)
    while True:
        more = {name for name, calls in functions.items() if calls & clocks} - clocks
        if not more:
            return {index for index, tree in trees.items() if _called(tree) & clocks}
        clocks |= more


def read_before(nb: nbformat.NotebookNode, index: int, measured: bool = True) -> str:
    """What a student reads above cell ``index`` of a run notebook: the markdown, and what each
    cell printed (its streams, errors and text results); ``measured=False`` leaves out what the
    cells that read a clock printed (``clocked_cells``)."""
    parts = []
    clocked = set() if measured else clocked_cells(nb)
    for number, cell in enumerate(nb.cells[:index]):
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        if number in clocked:
            continue
        for output in cell.get("outputs", []):
            parts += [output.get("text", ""), output.get("evalue", ""),
                      *(str(v) for k, v in output.get("data", {}).items()
                        if k.startswith("text/"))]
    return "\n".join(parts)


@pytest.mark.slow
@by_name
def test_no_text_or_output_before_a_prediction_gives_any_variants_answer(lesson,
                                                                        shared_tmp) -> None:
    """Predict, then measure: nothing a student reads above a graded prediction's cell (the
    markdown, and every cell's output in the lecture run, the variant cell's included) gives
    the answer of any variant a student with an id draws, within the graded band: not as a
    number, nor as a percentage of what the answer is a share of. Lesson 09's first cell said
    "87% of DeepSeek-V3's 256", one variant's answer to 0.1% (review 5): a student who drew it
    wrote 0.87 * 256 and earned the point. (The default, which no one with an id draws, is the
    text's own example: lesson 03's answer in bf16 is the ridge point it teaches first. What a
    cell that reads a clock prints is left out: a time measured here is another elsewhere, and
    gives no one an answer; the cell's source, and the text, are read.) Below
    a prediction the lesson measures the default, and the test above keeps every other
    answer out of what it prints."""
    from grader.content.cases import as_case
    from grader.content.variants import variants_of
    from grader.grading.plans import variant_answer

    nb, _, _ = lecture_run(lesson, shared_tmp)
    cases = importlib.import_module(lesson.cases).CASES
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]
    for name, spec in variants_of(lesson).items():
        text = read_before(nb, ids.index(name), measured=False)
        [case] = map(as_case, cases[name])
        for index in range(1, len(spec.choices)):
            answer = float(variant_answer(lesson, name, index))
            whole = spec.bound(index)[SHARE_OF[name]] if name in SHARE_OF else None
            leaks = given_before(text, answer, case.rel_tol, whole)
            assert leaks == [], (name, index, answer, leaks)


def test_given_before_reads_numbers_powers_and_shares() -> None:
    """The forms the test above looks for: a number within the band in any unit or as LaTeX
    writes a power of ten, and a percentage of the whole the answer is a share of; a bare
    small number, or one outside the band, is not one."""
    text = "87% of 256; 221.0 or 0.22 kB; $2.2 \\times 10^{2}$; 22; 300; 0.2 kB and 95%"
    assert given_before(text, 221.5, 0.05, 256) == ["221.0", "0.22 kB", "2.2e2", "87%"]
    assert given_before(text, 221.5, 0.05, None) == ["221.0", "0.22 kB", "2.2e2"]
    assert given_before("22 and 8", 22.5, 0.05, None) == []


def test_printed_numbers_reads_each_form_a_cell_may_print() -> None:
    """The forms the test above looks for: 52,608 bytes printed every way a lesson prints a
    number, each read back as that number to the digits it shows; a number one digit off, or a
    close one printed to more digits, is another; the lesson's small numbers are left out."""
    text = ("52,608 | 52608 | 52608.0 | 5.26e+04 | 5.261e4 | 51.4 KiB | 51.38 KiB | 0.0526 MB "
            "| 52.6 kB | 5.26e+04% | 8 | 16 bits | 4.0 | 52,609 | 5.27e+04 | 51.3 KiB")
    assert shows(text, 52_608) == ["52,608", "52608", "52608.0", "5.26e+04", "5.261e4",
                                   "51.4 KiB", "51.38 KiB", "0.0526 MB", "52.6 kB"]
    assert shows("8,409,088 bytes, 206.1 tokens, 378.0", 8_388_608) == []
    assert shows("8,409,088 bytes, 206.1 tokens, 378.0", 206.125) == ["206.1"]
    assert [printed for _, _, printed in printed_numbers(text)][-4] == "4.0"
