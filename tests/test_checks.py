"""The check helper students meet, and the pieces `grader sync` generates notebooks from."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.content import notebook_checks
from grader.content.cases import Case, raises
from grader.content.notebook_checks import _difference, check, check_raises
from grader.content.sync import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    hidden_check_lines,
    render_literal,
    solution_cell_source,
)
from grader.grading.probe import (
    Check,
    Exercise,
    Raises,
    _visible_checks,
    judge,
    parse_replies,
    probe_source,
)
from solutions import floats


class AlwaysEqual(float):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = float.__hash__


def same(got: object, expected: object, **tolerances: float) -> bool:
    return _difference(got, expected, tolerances.get("rel_tol", 0.0),
                       tolerances.get("abs_tol", 0.0)) is None


def test_types_are_compared_before_values() -> None:
    assert not same(AlwaysEqual(1.0), 1.0)  # a float subclass with a forged __eq__
    assert not same(1, 1.0) and not same(1.0, 1) and not same(True, 1)
    assert not same((1, 2), [1, 2]) and not same(torch.tensor(1.0).item, 1.0)
    assert not same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not same(torch.tensor([1.0]), torch.tensor([[1.0]]))
    assert not same(torch.nn.Parameter(torch.ones(2)), torch.ones(2))


def test_floats_are_exact_with_nan_equal_and_signed_zeros() -> None:
    assert same(math.nan, math.nan) and same(-0.0, -0.0) and same(math.inf, math.inf)
    assert not same(0.0, -0.0) and not same(1.0, 1.0 + 2**-52) and not same(math.nan, 1.0)
    assert same(1.0, 1.0 + 1e-12, rel_tol=1e-9) and not same(1.0, 1.1, rel_tol=1e-9)


def test_tensors_compare_values_nan_aware_and_report_the_first_difference() -> None:
    nan = math.nan
    assert same(torch.tensor([1.0, nan, -0.0, math.inf]), torch.tensor([1.0, nan, -0.0, math.inf]))
    problem = _difference(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0]), 0, 0)
    assert problem == "1 of 3 values differ; at index (1,) expected 2.5, got 2.0"
    assert same(torch.tensor([1.0, math.inf]), torch.tensor([1.0 + 1e-7, math.inf]), rel_tol=1e-6)


def test_check_reports_expected_and_got_in_one_line() -> None:
    decode = floats.decode  # noqa: F841  # check() evaluates in this function's globals
    namespace = {"decode": floats.decode, "FP16": floats.FP16, "check": check}
    exec("check('decode(0x3C00, FP16)', 1.0)", namespace)
    with pytest.raises(AssertionError, match=r"^decode\(0x3C00, FP16\): expected 2\.0, got 1\.0$"):
        exec("check('decode(0x3C00, FP16)', 2.0)", namespace)
    namespace["todo"] = lambda: (_ for _ in ()).throw(NotImplementedError())
    with pytest.raises(AssertionError, match=r"^todo\(\): not implemented yet$"):
        exec("check('todo()', 1)", namespace)
    with pytest.raises(AssertionError, match=r"raised ZeroDivisionError"):
        exec("check('1 / 0', 1.0)", namespace)


def test_check_raises_passes_only_for_the_named_error_or_a_subclass() -> None:
    def refuse(error):
        raise error("bad input")

    namespace = {"refuse": refuse, "check_raises": check_raises,
                 "todo": lambda: (_ for _ in ()).throw(NotImplementedError())}
    exec("check_raises('refuse(ValueError)', ValueError)", namespace)
    exec("check_raises('refuse(IndexError)', LookupError)", namespace)
    with pytest.raises(AssertionError, match=r"^refuse\(TypeError\): expected ValueError, "
                                             r"got TypeError: bad input$"):
        exec("check_raises('refuse(TypeError)', ValueError)", namespace)
    with pytest.raises(AssertionError, match=r"^abs\(-2\): expected ValueError, got a result 2$"):
        exec("check_raises('abs(-2)', ValueError)", namespace)
    with pytest.raises(AssertionError, match=r"^todo\(\): not implemented yet$"):
        exec("check_raises('todo()', RuntimeError)", namespace)  # NotImplementedError's base


def test_hidden_raises_cases_are_checked_against_the_reference() -> None:
    assert hidden_check_lines(floats, [raises("split_bits(-1, FP16)", "ValueError")]) == [
        "check_raises('split_bits(-1, FP16)', ValueError)"]
    with pytest.raises(CourseError, match="reference raises ValueError"):
        hidden_check_lines(floats, [raises("split_bits(-1, FP16)", "TypeError")])
    with pytest.raises(CourseError, match=r"reference returns 1\.0"):
        hidden_check_lines(floats, [raises("decode(0x3C00, FP16)", "ValueError")])
    with pytest.raises(ValueError, match="built-in exception"):
        raises("decode(0, FP16)", "TypeCheckError")
    with pytest.raises(ValueError, match="built-in exception"):
        raises("decode(0, FP16)", "print")


def test_the_grader_judges_raised_errors_by_their_built_in_class(tmp_path) -> None:
    class ShapeError(ValueError):
        pass

    class AnyError(TypeError, ValueError, IndexError):  # a hedge: counts as a TypeError only
        pass

    class Forged(Exception):  # claims to be a built-in that does not exist
        __module__ = "builtins"

    def student(kind: str):
        if kind == "todo":
            raise NotImplementedError
        if kind == "value":
            return 0.0
        raise {"sub": ShapeError, "type": TypeError, "any": AnyError, "forged": Forged}[kind]("no")

    # Expected outcome per call: does it count as raising ValueError? As raising TypeError?
    calls = {"student('sub')": (True, False), "student('type')": (False, True),
             "student('any')": (False, True), "student('forged')": (False, False),
             "student('value')": (False, False), "student('todo')": (False, False)}
    reply = tmp_path / "reply"
    exec(probe_source(list(calls), str(reply), "NONCE"), {"student": student})
    [results] = parse_replies(reply.read_text(), "NONCE", len(calls))
    for (expression, passes), got in zip(calls.items(), results, strict=True):
        for wanted, should_pass in zip(("ValueError", "TypeError"), passes, strict=True):
            exercise = Exercise("student", 1.0, [Check(expression, Raises(wanted), 0, 0, False)])
            verdict = judge(exercise, [got])
            assert (verdict.points == 1.0) is should_pass, (wanted, verdict.summary())
    assert judge(Exercise("student", 1.0, [Check("x", Raises("ValueError"), 0, 0, False)]),
                 [0.0]).visible_failures == ["x: expected ValueError, got a result"]


def test_a_check_that_exits_or_is_interrupted_costs_that_check_and_the_probe_still_answers(
        tmp_path) -> None:
    """exit(), sys.exit() or a KeyboardInterrupt inside a student's function is that check's
    failure: the probe still writes its reply, so the other checks keep what they earned."""
    def student(kind: str) -> float:
        if kind == "exit":
            raise SystemExit(3)
        if kind == "interrupt":
            raise KeyboardInterrupt
        return 0.5

    calls = ["student('exit')", "student('ok')", "student('interrupt')", "student('ok')"]
    reply = tmp_path / "reply"
    exec(probe_source(calls, str(reply), "NONCE"), {"student": student})
    [results] = parse_replies(reply.read_text(), "NONCE", len(calls))
    assert [type(r).__name__ for r in results] == ["Failure", "float", "Failure", "float"]
    assert results[0].raised == "SystemExit" and results[2].raised == "KeyboardInterrupt"
    checks = [Check(c, 0.5, 0, 0, True) for c in calls]
    verdict = judge(Exercise("student", 2.0, checks), results, partial=True)
    assert (verdict.points, verdict.hidden_failed) == (1.0, 2)
    assert verdict.hidden_failures[0].startswith("student('exit'): SystemExit")


@pytest.mark.parametrize("raised", [["ValueError"], {"v": 1}, None, "open", "type", "x" * 10**4])
def test_odd_raised_fields_from_the_kernel_score_zero(raised) -> None:
    item = {"t": "error", "v": "ValueError: no", "raised": raised}
    [[got]] = parse_replies("N" + json.dumps({"r": [item], "t": []}) + "N", "N", 1)
    verdict = judge(Exercise("f", 1.0, [Check("f()", Raises("ValueError"), 0, 0, True)]), [got])
    assert verdict.points == 0.0 and verdict.hidden_failed == 1


def test_a_visible_check_raises_must_name_a_built_in_exception() -> None:
    for call in ('check_raises("f(-1)", torch.OutOfMemoryError)',
                 'check_raises("f(-1)", error=ValueError)', 'check_raises("f(-1)", ShapeError)'):
        with pytest.raises(CourseError, match="must name a built-in exception"):
            _visible_checks(call)
    assert _visible_checks('check_raises("f(-1)", IndexError)')[0].raises == "IndexError"


scalars = st.one_of(
    st.floats(allow_nan=True), st.integers(), st.booleans(), st.none(), st.text(max_size=5))
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                     st.lists(inner, max_size=3).map(tuple)), max_leaves=8)


@given(values)
def test_render_literal_round_trips_exactly(value: object) -> None:
    rebuilt = eval(render_literal(value), {"math": math, "torch": torch})
    assert same(rebuilt, value)


@given(st.lists(st.floats(width=32), min_size=1, max_size=8),
       st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
def test_render_literal_round_trips_small_tensors(items: list[float], dtype: torch.dtype) -> None:
    tensor = torch.tensor(items).to(dtype).reshape(-1, 1)
    assert same(eval(render_literal(tensor), {"math": math, "torch": torch}), tensor)


def test_large_tensors_need_an_oracle_expression() -> None:
    with pytest.raises(CourseError, match="oracle expression"):
        render_literal(torch.zeros(65))


def test_hidden_checks_carry_reference_values_and_reject_a_wrong_oracle() -> None:
    lines = hidden_check_lines(floats, ["decode(0x7C00, FP16)", "split_bits(0xC000, FP16)"])
    assert lines == ["check('decode(0x7C00, FP16)', math.inf)",
                     "check('split_bits(0xC000, FP16)', (1, 16, 0))"]
    with pytest.raises(CourseError, match="disagree"):
        hidden_check_lines(floats, [Case("decode_tensor(torch.arange(4), FP16)",
                                         expected="torch.zeros(4)")])


def test_solution_cells_wrap_each_function_body_after_its_docstring() -> None:
    source = solution_cell_source(floats, ["FloatFormat", "FP16", "BF16", "machine_epsilon"])
    lines = source.splitlines()
    assert lines[0] == "@dataclass(frozen=True)"
    assert source.count(BEGIN_SOLUTION) == 3 and source.count(END_SOLUTION) == 3  # 2 props + fn
    begin = lines.index("        " + BEGIN_SOLUTION)  # the bias property
    assert lines[begin - 1].strip().endswith('"""') and "return 2 **" in lines[begin + 1]
    assert 'FP16 = FloatFormat("fp16"' in source and "\nBF16 = " in source  # constants together
    namespace: dict = {}
    exec("from dataclasses import dataclass\nimport math\n" + source, namespace)
    assert namespace["machine_epsilon"](namespace["BF16"]) == 2.0**-7


def test_the_notebook_check_cell_is_a_module_of_its_own() -> None:
    # The notebook's `checks` cell is this file verbatim, so it may import only what a
    # student's environment has, and must not import anything from this repository.
    text = Path(notebook_checks.__file__).read_text()
    assert "solutions" not in text and "grader" not in text


def test_render_literal_round_trips_a_zero_dim_tensor() -> None:
    scalar = torch.tensor(4.5, dtype=torch.bfloat16)
    assert same(eval(render_literal(scalar), {"math": math, "torch": torch}), scalar)


def test_feedback_redacts_the_hidden_region_and_errors_raised_by_hidden_checks() -> None:
    from nbformat.v4 import new_code_cell, new_output

    from grader.outputs.preprocessors import RedactHiddenTests

    source = ("check('decode(1, FP16)', 5.96e-08)\nprint('ok')\n### BEGIN HIDDEN TESTS\n"
              "check('decode(0x7BFF, FP16)', 65504.0)\n### END HIDDEN TESTS")
    cell = new_code_cell(source, outputs=[new_output(
        "error", ename="AssertionError", evalue="decode(0x7BFF, FP16): expected 65504.0, got 1.0",
        traceback=["...check('decode(0x7BFF, FP16)', 65504.0)..."])])
    redacted, _ = RedactHiddenTests().preprocess_cell(cell, {}, 0)
    assert "0x7BFF" not in redacted.source and "decode(1, FP16)" in redacted.source
    assert redacted.outputs[0].evalue == "a hidden check failed"
    assert "0x7BFF" not in "".join(redacted.outputs[0].traceback)
    visible = new_code_cell(source, outputs=[new_output(
        "error", ename="AssertionError", evalue="decode(1, FP16): expected 5.96e-08, got 0.0")])
    assert RedactHiddenTests().preprocess_cell(visible, {}, 0)[0].outputs[0].evalue.startswith(
        "decode(1, FP16)")  # visible failures keep their message


def test_export_quotes_fields_and_defuses_spreadsheet_formulas(tmp_path) -> None:
    import csv

    from grader.course import Course
    from grader.outputs.export import export

    course = Course(tmp_path / "course", log=lambda _: None)
    course.grades = lambda: [{"student_id": "ann", "lesson": "01_float_formats", "score": 3.0,
                              "max_score": 14.0, "status": "needs_review",
                              "reason": '=HYPERLINK("http://x", "click"), "quoted"'}]
    export(course, tmp_path / "grades.csv")
    text = (tmp_path / "grades.csv").read_text()
    row = next(csv.DictReader(text.splitlines()))
    assert row["reason"].startswith("'=HYPERLINK")  # shown as text, never run as a formula
    assert '"ann"' in text and row["score"] == "3.0"


def test_zip_links_are_refused_and_zip_bombs_refused_whole(tmp_path, monkeypatch) -> None:
    import stat
    import zipfile

    from grader.common.errors import CourseError
    from grader.gradebook.received import unpacked
    from grader.intake import zips as intake
    from grader.intake.handins import recognise

    monkeypatch.setattr(intake, "MAX_ZIP_BYTES", 1000)  # stands for 2 GiB
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as archive:
        member = zipfile.ZipInfo("alice/float_formats.ipynb")
        member.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(member, "/etc/passwd")
        archive.writestr("alice/notes.txt", "hello")
    with unpacked(link, tmp_path) as received:
        layout, handins, _ = recognise(received.root, "01_float_formats", "float_formats.ipynb",
                                       refused=received.refused_members)
        assert layout == "folders" and [h.student_id for h in handins] == ["alice"]
        assert handins[0].notebook is None and "is a link" in handins[0].reasons[-1]
        assert not (received.root / "alice" / "float_formats.ipynb").exists()
    huge = tmp_path / "huge.zip"  # a zip bomb in small: 1 MB of zeros packs into 1 kB
    with zipfile.ZipFile(huge, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bob/float_formats.ipynb", b"\0" * 2**20)
    with pytest.raises(CourseError, match="GiB"), unpacked(huge, tmp_path):
        pass


def test_a_zip_member_whose_header_lies_about_its_size_is_refused(tmp_path) -> None:
    import zipfile

    from grader.intake.zips import unpack_zip

    lying = tmp_path / "lying.zip"
    with zipfile.ZipFile(lying, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bob/float_formats.ipynb", b"\0" * 2**20)
        archive.writestr("carl/float_formats.ipynb", b"{}")
    data = bytearray(lying.read_bytes())
    # Make both headers of bob's member claim 100 bytes (local header offset 22, central 24).
    for at in (i for i in range(len(data)) if data[i:i + 4] in (b"PK\x03\x04", b"PK\x01\x02")):
        if b"bob/" in data[at:at + 80]:
            offset = 22 if data[at:at + 4] == b"PK\x03\x04" else 24
            data[at + offset:at + offset + 4] = (100).to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    (tmp_path / "out").mkdir()
    received = unpack_zip(lying, tmp_path / "out")
    assert any("bob" in why for _, why in received.refused_members)
    assert (tmp_path / "out" / "carl" / "float_formats.ipynb").read_bytes() == b"{}"


def test_a_zip_names_utf8_without_its_flag_as_its_maker_meant(tmp_path) -> None:
    """Info-ZIP's zip on Linux writes "Anna Müller" in UTF-8 without the zip's UTF-8 flag:
    read as cp437, it was "Anna M├╝ller" in every folder, progress line, export and feedback
    zip after. A name without the flag whose bytes are UTF-8 is read as UTF-8; one in cp437
    (bytes that are no UTF-8) stays cp437; a flagged one is as it says."""
    import zipfile

    from grader.intake.zips import unpack_zip

    archive = tmp_path / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as out:  # ASCII names of the right lengths, then bytes
        out.writestr("Anna MXXller_7001_assignsubmission_file_/float_formats.ipynb", b"{}")
        out.writestr("CafX_7002_assignsubmission_file_/float_formats.ipynb", b"{}")
        out.writestr("Zoë_7003_assignsubmission_file_/float_formats.ipynb", b"{}")  # flagged
    data = archive.read_bytes()
    data = data.replace(b"Anna MXXller", "Anna Müller".encode())
    data = data.replace(b"CafX", "Café".encode("cp437"))
    archive.write_bytes(data)
    (tmp_path / "out").mkdir()
    received = unpack_zip(archive, tmp_path / "out")
    assert received.refused_members == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Anna Müller_7001_assignsubmission_file_", "Café_7002_assignsubmission_file_",
        "Zoë_7003_assignsubmission_file_"]


def run_cells(*sources: str, env: dict[str, str] | None = None) -> list[list[dict]]:
    """Outputs of each cell after the checks cell, run in a real kernel (with ``env`` added to
    its environment)."""
    import os

    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(Path(notebook_checks.__file__).read_text()),
                             *map(new_code_cell, sources)])
    environment = {k: v for k, v in os.environ.items() if k != "CTC_VARIANTS"}
    NotebookClient(nb, allow_errors=True, kernel_name="python3", timeout=120).execute(
        env={**environment, **(env or {})})
    return [cell.outputs for cell in nb.cells[1:]]


@pytest.mark.slow
def test_a_failed_check_is_one_line_that_names_the_field_and_where_the_code_raised() -> None:
    named, raised, tensor, bits, said = run_cells(
        "def split_bits(bits, fmt):\n    return (0, 14, 0)\ncheck('split_bits(1, 2)', (0, 15, 0))",
        "def encode(x):\n    y = x + 1\n    return [y][x]\ncheck('encode(3)', 1)",
        "import torch\ncheck('torch.ones(2)', torch.zeros(2))",
        "def encode(x, fmt):\n    return 0x3F81\ncheck('encode(1 + 2**-8, 2)', 0x3F80)",
        "check('(lambda w: (w.append(2), w)[-1])([1])', [1, 3], tried='[1] after append(2)')")
    for outputs in (named, raised, tensor, bits, said):
        [error] = [o for o in outputs if o.output_type == "error"]
        assert error.ename == "CheckFailed" and len(error.traceback) == 1, error.traceback
    # a bit pattern in hex, as the lesson writes it; what was tried in words, not as a lambda
    assert bits[0].evalue == ("encode(1 + 2**-8, 2): expected 0x3F80 (16256), got 0x3F81 "
                              "(16257)")
    assert said[0].evalue == "[1] after append(2): item 1: expected 3, got 2"
    assert named[0].evalue == "split_bits(1, 2): item 1 (exponent): expected 15, got 14"
    assert raised[0].evalue == ("encode(3) raised IndexError: list index out of range "
                                "(in encode, line 3 of its cell)")
    assert tensor[0].evalue.startswith("torch.ones(2): 2 of 2 values differ")


@pytest.mark.slow
def test_a_cell_that_uses_an_unfinished_exercise_says_which_to_finish() -> None:
    stub, method, mine, other = run_cells(
        "def decode(bits):\n    raise NotImplementedError()\n\nx = decode(3)",
        "class Format:\n    @property\n    def bias(self):\n        raise NotImplementedError()"
        "\n\nFormat().bias",
        "# YOUR CODE HERE\nraise NotImplementedError()",
        "raise NotImplementedError('not an exercise of ours')")
    [error] = stub
    assert len(error.traceback) == 1 and "`decode` is an exercise not done yet" in \
        error.traceback[0]
    [error] = method
    assert "`Format.bias` is an exercise not done yet" in error.traceback[0]
    [error] = mine  # a cell for the student's own answer (a prediction)
    assert len(error.traceback) == 1 and "this cell is yours to fill in" in error.traceback[0]
    [error] = other  # someone else's NotImplementedError keeps its usual traceback
    assert len(error.traceback) > 1 and error.evalue == "not an exercise of ours"


@pytest.mark.slow
def test_running_ahead_and_interrupting_say_one_line_each() -> None:
    ahead, typo_inside, interrupted, interrupted_in_cell, undefined_check, in_method = \
        run_cells(
            "decode_tensor(3)",  # a cell run before the one that defines decode_tensor
            "def f():\n    return undefined_name\n\nf()",
            "def spin():\n    raise KeyboardInterrupt\n\nspin()",
            "x = 1\nraise KeyboardInterrupt",
            "check('not_defined_here(1)', 1)",
            "class Layer:\n    def forward(self):\n        raise KeyboardInterrupt\n\n\n"
            "Layer().forward()")
    # where: the function (a method with its class), its line, and the cell by the number
    # Jupyter shows beside it (the checks cell ran first, as [1]); a Run All stops there
    stopped = ("; a Run All stops here, and the cells below have not run (Run > Run Selected "
               "Cell and All Below goes on from this one)")
    [error] = ahead
    assert len(error.traceback) == 1 and "`decode_tensor` is not defined yet" in \
        error.traceback[0] and "Run All Above" in error.traceback[0]
    [error] = typo_inside  # raised inside a function: where, and what to run or check
    assert error.traceback == ["\x1b[0;31mNameError\x1b[0m: `undefined_name` is not defined "
                               "(in f, line 2 of cell [3]): if a cell above defines it, run "
                               "them first (Run > Run All Above Selected Cell); if not, check "
                               "its spelling"]
    [error] = interrupted
    assert error.traceback == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted "
                               "(in spin, line 2 of cell [4])" + stopped]
    [error] = interrupted_in_cell
    assert error.traceback == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted "
                               "(line 2 of this cell)" + stopped]
    [error] = in_method
    assert error.traceback == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted "
                               "(in Layer.forward, line 3 of cell [7])" + stopped]
    [error] = undefined_check
    assert error.ename == "CheckFailed" and "`not_defined_here` is not defined" in error.evalue


def _run_in(client, code: str) -> list[dict]:
    """The iopub messages' contents of running ``code`` in a kernel ``client`` talks to."""
    outputs = []
    client.execute_interactive(code, timeout=120, output_hook=lambda message: outputs.append(
        message) if message["msg_type"] in ("error", "stream", "display_data") else None)
    return [{"msg_type": m["msg_type"], **m["content"]} for m in outputs]


@pytest.mark.slow
def test_a_cell_run_after_a_kernel_restart_says_so_in_one_line() -> None:
    """The lab's kernels run grader/lab/kernel_startup.py (PYTHONSTARTUP) at their start and
    at each restart: before the checks cell has run again, a cell that reads a name from above
    says in one line that the kernel restarted; after it, a name missing in a generator
    expression of the cell, or in a function defined in it, is one line too, saying where."""
    import os

    from jupyter_client.manager import start_new_kernel

    from grader.lab.server import KERNEL_STARTUP

    environment = {k: v for k, v in os.environ.items() if k != "CTC_VARIANTS"}
    manager, client = start_new_kernel(
        kernel_name="python3", env={**environment, "PYTHONSTARTUP": str(KERNEL_STARTUP)})
    try:
        checks = Path(notebook_checks.__file__).read_text()
        [said] = _run_in(client, checks)
        assert said["text"].startswith("No student id is set") and "make lab STUDENT=" in \
            said["text"]
        manager.restart_kernel(now=True)
        client.wait_for_ready(timeout=120)
        [error] = _run_in(client, "check('decode(0x3C00, FP16)', 1.0)")
        assert error["traceback"] == [
            "\x1b[0;31mNameError\x1b[0m: `check` is not defined: the kernel restarted (or has "
            "just started), so the cells above have not run in it. Run the cells above first "
            "(Run > Run All Above Selected Cell), then this one"]
        [names] = _run_in(client, "print(sorted(dir()))")
        assert "_install_course_messages" not in names["text"]  # the startup leaves no name
        _run_in(client, checks)
        [error] = _run_in(client, "shown = list(gpu_name(n) for n in (1, 2))")
        assert error["traceback"] == [
            "\x1b[0;31mNameError\x1b[0m: `gpu_name` is not defined yet: it comes from a cell "
            "above this one. Run the cells above first (Run > Run All Above Selected Cell), then "
            "this one"]
        [error] = _run_in(client, "def make():\n    return widths\n\n\nmake()")
        assert len(error["traceback"]) == 1 and "(in make, line 2 of cell [" in \
            error["traceback"][0]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.mark.slow
def test_a_prediction_is_told_how_close_it_is_without_the_answer_in_the_cell() -> None:
    from grader.content.notebook_checks import seal

    near, far, missing, untouched, choice, no_choice, word = run_cells(
        f"guess = 300.0\ncheck_prediction('guess', {seal(295.3)!r})",
        f"guess = 30\ncheck_prediction('guess', {seal(295.3)!r})",
        f"check_prediction('never_set', {seal(295.3)!r})",
        f"guess = None\ncheck_prediction('guess', {seal(295.3)!r})",
        f"pick = 'B'\ncheck_choice('pick', {seal('b')!r})",
        f"pick = None\ncheck_choice('pick', {seal('b')!r})",
        f"guess = 'lots'\ncheck_prediction('guess', {seal(295.3)!r})")
    assert near[0].text.startswith("guess = 300: within 25% of the answer")
    assert "below the answer by more than 25%" in far[0].text and "295" not in far[0].text
    for outputs in (missing, untouched, no_choice):  # an ungraded prediction not made yet
        assert outputs[0].text.startswith("No prediction yet"), outputs
    assert choice[0].text.startswith("pick = 'B': right")
    assert word[0].ename == "CheckFailed" and "as a number" in word[0].evalue
    assert "295" not in seal(295.3)


@pytest.mark.slow
def test_a_graded_prediction_says_in_and_holds_no_answer() -> None:
    """Its check takes no answer, sealed or not: a number is in, and Validate reads the mark;
    no number, or not a number, is to do or wrong, as grading scores it."""
    from grader.lab.validate import MARK

    inside, missing, word, big = run_cells(
        "guess = 300.0\ncheck_prediction('guess', rel_tol=0.1, graded=True)",
        "check_prediction('guess2', rel_tol=0.1, graded=True)",
        "guess = '300'\ncheck_prediction('guess', rel_tol=0.1, graded=True)",
        "guess = 18874368.0\ncheck_prediction('guess', graded=True)")
    [shown] = inside
    assert shown.output_type == "display_data" and shown.metadata[MARK] == {"verdict": "in"}
    line = shown.data["text/plain"]
    # what is true, whatever the number: recorded, not judged (review 5: a number far off was
    # said to be "in, and all visible checks passed")
    assert line.startswith("guess = 300: recorded; graded when you hand in")
    assert "passed" not in line
    assert "within 10% of the answer for your numbers" in line
    [error] = missing  # the test cell of a prediction not made: to do, as grading scores it
    assert error.ename == "CheckFailed" and ": not done yet" in error.evalue
    [error] = word
    assert error.ename == "CheckFailed" and "as a number" in error.evalue
    assert big[0].data["text/plain"].startswith("guess = 18,874,368:")  # as people write it


@pytest.mark.slow
def test_a_variant_cell_binds_the_students_own_numbers_and_records_whose_they_are() -> None:
    """The lab (or the grading kernel) gives the draws in CTC_VARIANTS, which the cell reads
    when it runs; without them, the default, said once; a value that is not a draw of this
    exercise is the default too. One kernel: each cell sets the variable it tests."""
    import json

    from grader.content.variants import kernel_variants
    from grader.lab.validate import MARK

    cell = ("w = your_variant('05_x/p', ('w',), [((1, 2),), ((3, 4),), ((5, 6),)], "
            "'the widths {w[0]} and {w[1]}')\nprint(w)")

    def given(value: str | None) -> str:
        return ("import os\nos.environ.pop('CTC_VARIANTS', None)\n" if value is None else
                f"import os\nos.environ['CTC_VARIANTS'] = {value!r}\n") + cell

    bad = ("not json", '{"student": "s", "draws": {"05_x/p": 7}}', "[1]",
           '{"student": 5, "draws": {"05_x/p": 1}}')
    drawn, first, again, *refused = run_cells(
        given(kernel_variants("s-001", {"05_x": {"p": 2}}, "c0ffee")), given(None), given(None),
        *map(given, bad))
    shown, printed = drawn
    assert shown.data["text/plain"] == "Your numbers (drawn for s-001): the widths 5 and 6"
    assert shown.metadata[MARK] == {"variant": {"exercise": "05_x/p", "student": "s-001",
                                                "index": 2, "course": "c0ffee"}}
    assert printed.text == "(5, 6)\n"
    assert first[0].data["text/plain"].startswith("Your numbers: the widths 1 and 2\n(No "
                                                  "student id is set")
    assert again[0].data["text/plain"] == "Your numbers: the widths 1 and 2"  # said once
    assert first[0].metadata[MARK]["variant"] == {"exercise": "05_x/p", "student": None,
                                                  "index": 0, "course": ""}
    for value, (shown, _) in zip(bad, refused, strict=True):
        assert shown.metadata[MARK]["variant"]["index"] == 0, value
    assert json.loads(kernel_variants("s", {}, ""))["draws"] == {}


@pytest.mark.slow
def test_a_measured_prediction_is_set_beside_the_measurement() -> None:
    close, far, missing = run_cells(
        "guess = 2.1\ncompare_prediction('guess', 2.0)",
        "guess = 8\ncompare_prediction('guess', 2.0, unit=' x')",
        "guess = None\ncompare_prediction('guess', 2.0)")
    assert close[0].text.startswith("measured 2; your prediction, 2.1, is within 10% of it")
    assert far[0].text.startswith("measured 2 x; your prediction, 8 x, is 4 times")
    assert "no prediction yet" in missing[0].text


def test_numbers_are_printed_as_people_write_them() -> None:
    from grader.content.notebook_checks import readable

    assert [readable(x) for x in (18874368, 18874368.0, 295.343, 0.0123, 1.5e-8, 2.0,
                                  123456.7, -0.5, 0)] == [
        "18,874,368", "18,874,368", "295.3", "0.0123", "1.5e-08", "2", "123,457", "-0.5", "0"]


def test_validate_sums_up_each_exercise_with_its_points() -> None:
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from grader.lab.validate import HIDDEN_NOTE, summarize

    def test_cell(name: str, points: int, *outputs):
        cell = new_code_cell("...", outputs=list(outputs))
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"test-{name}", "points": points}
        return cell

    nb = new_notebook(cells=[
        test_cell("decode", 2, new_output("stream", name="stdout", text="decode: all passed\n")),
        test_cell("encode", 3, new_output("error", ename="CheckFailed",
                                          evalue="encode(1.0, FP16): expected 15360, got 0",
                                          traceback=["one line"])),
        test_cell("max_finite", 1, new_output("error", ename="CheckFailed",
                                              evalue="max_finite(FP16): not implemented yet",
                                              traceback=["one line"]))])
    failed, summary = summarize(nb)
    assert [f["source"] for f in failed] == ["encode (3 points)", "max_finite (1 point)"]
    assert failed[0]["raw_error"] == "encode(1.0, FP16): expected 15360, got 0"
    assert summary.splitlines()[0] == ("1 of 3 exercises pass their visible checks "
                                       "(2 of 6 points).")
    assert "  to do    max_finite (1 point)" in summary
    assert summary.endswith(HIDDEN_NOTE)


def test_validate_counts_a_graded_prediction_apart_and_never_in_a_total() -> None:
    """A graded prediction's visible check can say only that a number is in (the lab never
    holds the answer, and a number far off is in too): Validate neither counts its point nor
    lists it as passing; the headline says it is graded at the hand-in, and when it is still to
    do. A graded prediction is told from its test cell's source."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from grader.lab.validate import MARK, exercises, headline, nbgrader_answer

    def test_cell(name: str, points: int, *outputs, ran: bool = True):
        source = (f"check_prediction({name!r}, rel_tol=0.1, graded=True)"
                  if name.startswith("predicted_") else "...")
        cell = new_code_cell(source, outputs=list(outputs), execution_count=1 if ran else None)
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"test-{name}", "points": points}
        return cell

    inside = new_output("display_data", data={"text/plain": "x = 3: in, ..."},
                        metadata={MARK: {"verdict": "in"}})
    forged = new_code_cell("print('all passed')", outputs=[inside], execution_count=1)
    forged.metadata["nbgrader"] = {"grade": True, "grade_id": "test-encode", "points": 3}
    nb = new_notebook(cells=[
        test_cell("decode", 2, new_output("stream", name="stdout", text="passed\n")),
        test_cell("predicted_x", 1, inside),
        test_cell("encode", 3, ran=False)])
    found = exercises(nb)
    assert [(e.name, e.status, e.prediction) for e in found] == [
        ("decode", "passes", False), ("predicted_x", "in", True), ("encode", "fails", False)]
    assert "graded when you hand in" in found[1].message and not found[1].counts
    assert headline(found) == ("1 of 2 exercises pass their visible checks (2 of 5 points). "
                               "Your graded prediction, predicted_x, is in: it is graded when "
                               "you hand in (1 point).")
    assert "not run" in found[2].message
    done = [e for e in found if e.name != "encode"]
    assert headline(done) == ("All 1 exercises pass their visible checks (2 of 2 points). Your "
                              "graded prediction, predicted_x, is in: it is graded when you "
                              "hand in (1 point). Hand in the notebook as your course asks.")
    to_do = new_output("error", ename="CheckFailed", traceback=[],
                       evalue="predicted_x: not done yet: write")
    [_, waiting] = exercises(new_notebook(cells=[nb.cells[0], test_cell("predicted_x", 1,
                                                                         to_do)]))
    assert (waiting.status, waiting.prediction) == ("to do", True)
    assert headline([done[0], waiting]).endswith("predicted_x, is still to do (1 point).")
    # an exercise's cell cannot pass as a prediction by printing the mark
    [encode] = exercises(new_notebook(cells=[forged]))
    assert (encode.status, encode.prediction) == ("passes", False)
    # nbgrader's own dialog: never its broken "passed" branch
    answer = {"headline": headline(found), "exercises": [vars(e) for e in found],
              "changed": [], "note": "note"}
    assert list(nbgrader_answer(answer)) == ["failed"]
    answer.update(exercises=[vars(e) for e in done], headline=headline(done))
    assert nbgrader_answer(answer) == {}
    answer["saved_numbers"] = "This notebook was worked on other numbers than yours: ..."
    assert answer["saved_numbers"] in nbgrader_answer(answer)["failed"][0]["raw_error"]
