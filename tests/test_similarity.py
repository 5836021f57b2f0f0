"""``python -m grader similarity``: fingerprints that do not depend on names, layout or the
process, the starter code left out, and end to end on a graded class of lesson 01: a renamed
copy found, identical notebooks flagged outright, honest work not listed, an inert page."""

from __future__ import annotations

import copy
import csv
import html
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.content.lessons import load_lesson
from grader.outputs.similarity import (
    Exercise,
    Submission,
    answer_cells,
    compare,
    fingerprint,
    highlighted,
    identical_groups,
    kgram_hashes,
)
from tests.grading_helpers import (
    BEGIN_SOLUTION,
    at_solution_top,
    cell,
    grader,
    read_notebook,
    released_course,
    submit,
)
from tests.test_review import command

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
ENCODE = answer_cells(LESSON.notebook)["encode"]


def test_fingerprints_ignore_names_comments_and_blank_lines() -> None:
    renamed = re.sub(r"\bx\b", "value_in", ENCODE).replace("fmt", "layout")
    reflowed = "\n\n".join(f"{line}  # mine" if line.strip() else line
                           for line in renamed.splitlines())
    assert fingerprint(ENCODE).fingerprints
    assert fingerprint(reflowed).fingerprints == fingerprint(ENCODE).fingerprints


def test_fingerprints_are_the_same_in_every_process() -> None:
    """Python's own str hash changes with PYTHONHASHSEED; ours must not, or the figures of one
    class would change from run to run."""
    script = ("from grader.content.lessons import load_lesson; "
              "from grader.outputs.similarity import answer_cells, fingerprint; "
              "print(sorted(fingerprint(answer_cells("
              "load_lesson('01_float_formats').notebook)['encode']).fingerprints)[:20])")
    seen = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": seed, "PATH": ""},
                           cwd=Path(__file__).parent.parent).stdout
            for seed in ("1", "2")}
    assert len(seen) == 1 and "[]" not in seen


@given(st.text(min_size=0, max_size=80))
def test_kgram_hashes_equal_windows_hash_equal(text: str) -> None:
    hashes = kgram_hashes(text + text, 5)
    assert len(hashes) == max(0, 2 * len(text) - 4)
    if len(text) >= 5:
        assert hashes[0] == hashes[len(text)]
        assert (hashes >= 0).all() and (hashes < 2**53).all()


def test_starter_fingerprints_are_removed() -> None:
    starter = fingerprint(ENCODE)
    assert not fingerprint(ENCODE, starter.fingerprints).fingerprints
    extra = ENCODE + "\n    total_of_mine = 12345 * 67890 + len(str(13579)) - 24680\n"
    left = fingerprint(extra, starter.fingerprints).fingerprints
    assert left and left < fingerprint(extra).fingerprints


@given(st.text(alphabet="abcxyz019 +*=()\n", max_size=200),
       st.text(alphabet="abcxyz019 +*=()\n", max_size=200))
def test_similarity_is_a_fraction_and_the_pair_is_symmetric(left: str, right: str) -> None:
    a = Submission("a", "1", {"e": fingerprint(left).values})
    b = Submission("b", "2", {"e": fingerprint(right).values})
    forward, backward = compare([a, b], ["e"]), compare([b, a], ["e"])
    assert len(forward) == len(backward) <= 1
    for one, other in zip(forward, backward, strict=True):
        assert 0 < one.similarity_a <= 1 and 0 < one.similarity_b <= 1
        assert (one.similarity_a, one.similarity_b) == (other.similarity_b, other.similarity_a)
        assert one.shared == len(fingerprint(left).fingerprints & fingerprint(right).fingerprints)


@given(st.lists(st.dictionaries(st.sampled_from(["e", "f"]),
                                st.sets(st.integers(0, 12), max_size=8)), min_size=2,
                max_size=7),
       st.floats(0, 1), st.integers(1, 4), st.integers(1, 5))
def test_every_pair_is_counted_as_its_fingerprints_say(answers, threshold, min_shared,
                                                        at_once) -> None:
    """compare's pairs against sets intersected pair by pair, whatever the number of pairs
    counted at once (PAIRS_AT_ONCE, some millions in a real class, merged in turn)."""
    from grader.outputs import similarity

    submissions = [Submission(str(i), str(i), {name: np.array(sorted(values), dtype=np.int64)
                                               for name, values in answer.items()})
                   for i, answer in enumerate(answers)]
    expected = set()
    for i, a in enumerate(submissions):
        for b in submissions[i + 1:]:
            both = {n: set(a.exercises[n].tolist()) & set(b.exercises[n].tolist())
                    for n in a.exercises if n in b.exercises}
            shared = sum(len(v) for v in both.values())
            to_a, to_b = shared / max(a.size, 1), shared / max(b.size, 1)
            if shared >= min_shared and max(to_a, to_b) >= threshold:
                expected.add((a.student_id, b.student_id, shared, to_a, to_b,
                              tuple(n for n in ("e", "f") if both.get(n))))
    default = similarity.PAIRS_AT_ONCE
    try:
        similarity.PAIRS_AT_ONCE = at_once
        found = compare(submissions, ["e", "f"], threshold, min_shared)
    finally:
        similarity.PAIRS_AT_ONCE = default
    assert {(p.a, p.b, p.shared, p.similarity_a, p.similarity_b, tuple(p.exercises))
            for p in found} == expected and len(found) == len(expected)


def test_exercises_are_compared_only_with_the_same_exercise() -> None:
    code = fingerprint(ENCODE)
    a = Submission("a", "1", {"encode": code.values})
    b = Submission("b", "2", {"decode": fingerprint(ENCODE).values})
    assert compare([a, b], ["encode", "decode"]) == []
    c = Submission("c", "3", {"encode": fingerprint(ENCODE).values})
    [pair] = compare([a, c], ["encode"])
    assert (pair.similarity_a, pair.similarity_b, pair.exercises) == (1.0, 1.0, ["encode"])
    assert compare([a, c], ["encode"], 0.8, len(code.fingerprints) + 1) == []  # too little shared


def test_the_untouched_student_version_is_no_identical_group() -> None:
    subs = [Submission(s, d, {}) for s, d in (("a", "x"), ("b", "x"), ("c", "stub"),
                                                ("d", "stub"), ("e", "y"))]
    assert identical_groups(subs, "stub") == [["a", "b"]]


def test_highlighted_code_is_escaped_and_marks_the_shared_text() -> None:
    hostile = "</pre><script>alert(1)</script>\n" + ENCODE
    left: Exercise = fingerprint(hostile)
    page = highlighted(left, fingerprint(ENCODE))
    assert "<script>" not in page and "&lt;/pre&gt;&lt;script&gt;" in page
    marked = re.findall(r"<mark>(.*?)</mark>", page, re.DOTALL)
    assert marked and all(html.unescape(m) in hostile for m in marked)
    assert sum(len(html.unescape(m)) for m in marked) > len(ENCODE) // 2


# ------------------------------------------------------------------ end to end

PLANTED = "    scratch_total = 918273 * 5647382 + len(str(1029384)) - 5647\n"


def own_work(nb, marker: int):
    """The reference solution with a line of the student's own in every answer cell that
    defines something, at the top of its solution (so the code still runs and earns its
    points: a class's cell too, whose first line is a decorator)."""
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("solution") and "def " in c.source \
                and BEGIN_SOLUTION in c.source:
            c.source = at_solution_top(c.source,
                                       f"mine_{marker} = {marker} * 7919 + {marker * 31} - 1")
    return nb


def test_names_stand_beside_ids_and_no_student_text_reaches_the_terminal_or_a_formula(
        tmp_path, shared_tmp) -> None:
    """Two copies under ids a spreadsheet reads as formulas, names with escape codes, and an
    answer cell of the student's own whose grade_id holds escape sequences: the summary is
    inert, names stand beside ids, a grade_id that is no exercise of the lesson is never
    compared nor shown, and no cell of similarity.csv starts a formula. (No grading needed:
    similarity reads the stored notebooks.)"""
    from types import SimpleNamespace

    import nbformat

    from grader.common.text import FORMULA_START
    from grader.outputs.similarity import similarity
    from tests.grading_helpers import released

    root = tmp_path / "course"
    (root / "release" / LESSON.name).mkdir(parents=True)
    (root / "release" / LESSON.name / NOTEBOOK).write_bytes(
        (released(LESSON, shared_tmp) / NOTEBOOK).read_bytes())
    honest = own_work(read_notebook(LESSON.notebook), 1)
    decode = cell(honest, "decode")
    decode.source = decode.source.replace("\n", "\n" + PLANTED, 1)
    evil = "\x1b]0;owned\x07\x1b[2Jsteal"
    honest.cells.append(nbformat.v4.new_code_cell(
        decode.source.replace("def decode", "def other"),
        metadata={"nbgrader": {"grade_id": evil, "solution": True, "grade": False,
                               "locked": False, "schema_version": 3}}))
    copier = copy.deepcopy(honest)
    for c in copier.cells:
        c.source = c.source.replace("mine_1", "my_own")
    names = {"-5": "Ada \x1b[31mLovelace", "@x": "=HYPERLINK(\"evil\")"}
    for student, nb in (("-5", honest), ("@x", copier)):
        folder = root / "submitted" / student / LESSON.name
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / NOTEBOOK)
    said: list[str] = []
    course = SimpleNamespace(root=root, log=said.append, statuses=lambda lesson: {lesson: {
        s: {"status": "graded", "handin": {"name": n}} for s, n in names.items()}})
    similarity(course, LESSON, 0.8, 5, 10)
    summary = said[-1]
    assert "\x1b" not in summary and "\x07" not in summary and "steal" not in summary
    assert "-5 (Ada \\x1b[31mLovelace) ~ @x (=HYPERLINK(\"evil\"))" in summary, summary
    folder = root / "reports" / LESSON.name
    with (folder / "similarity.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[1][:2] == ["'-5", "'@x"] and rows[1][-1].startswith("'=HYPERLINK")
    assert not any(c.startswith(FORMULA_START) for line in rows for c in line)
    assert "steal" not in "".join(c for line in rows for c in line)
    page = (folder / "similarity.html").read_text()
    assert "Ada \\x1b[31mLovelace" in page and "steal" not in page and "\x1b" not in page


@pytest.fixture(scope="module")
def course(tmp_path_factory, shared_tmp):
    """Lesson 01 graded for six: two honest, a copy of one of them with its names changed,
    two with the same notebook, the untouched student version."""
    tmp = tmp_path_factory.mktemp("similarity")
    root = released_course([LESSON], shared_tmp, tmp / "course")
    instructor = read_notebook(LESSON.notebook)
    honest = own_work(copy.deepcopy(instructor), 1)
    decode = cell(honest, "decode")
    decode.source = decode.source.replace("\n", "\n" + PLANTED, 1)
    decode.source += "\n# </pre><script>alert('x')</script>\n"
    copier = copy.deepcopy(honest)
    for c in copier.cells:
        if c.metadata.get("nbgrader", {}).get("solution"):
            c.source = re.sub(r"\bmine_1\b", "my_own", c.source).replace("scratch_total",
                                                                          "tally")
    folder = tmp / "class"
    for student, nb in [("honest", honest), ("copier", copier),
                        ("other", own_work(copy.deepcopy(instructor), 2)),
                        ("twin_a", instructor), ("twin_b", instructor),
                        ("untouched", read_notebook(root / "release" / LESSON.name / NOTEBOOK))]:
        submit(folder, student, nb, NOTEBOOK)
    grader("autograde", LESSON.name, folder, "--course-dir", root)
    return root


def similar(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict], str]:
    done = command("similarity", LESSON.name, "--course-dir", root, *args)
    folder = root / "reports" / LESSON.name
    with (folder / "similarity.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return done, rows, (folder / "similarity.html").read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_a_renamed_copy_is_listed_and_honest_work_is_not(course) -> None:
    # Fragments in more than two of the six (the reference solution) are left out.
    done, rows, page = similar(course, "--ignore-common", "2")
    pairs = {(r["student_a"], r["student_b"]): r for r in rows if not r["identical"]}
    assert set(pairs) == {("copier", "honest")}, rows
    assert float(pairs[("copier", "honest")]["similarity_a"]) >= 0.8
    assert "decode" in pairs[("copier", "honest")]["exercises"].split()
    assert "hints for a human, not findings" in done.stdout
    assert "A hint for a human, not a finding" in page
    assert "<mark>" in page and "tally" in page and "scratch_total" in page


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_the_class_is_graded_as_written(course) -> None:
    """Each own-work notebook runs and earns every point (a line of one's own that broke the
    code once cost them all and half a minute of replays each), the untouched one none."""
    import json

    from tests.grading_helpers import points

    status = json.loads((course / "grading_status.json").read_text())[LESSON.name]
    full = sum(points(read_notebook(LESSON.notebook)).values())
    earned = {s: sum(e["points"] for e in v["exercises"].values()) for s, v in status.items()}
    assert earned == {"honest": full, "copier": full, "other": full, "twin_a": full,
                      "twin_b": full, "untouched": 0.0}, earned


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_identical_notebooks_are_flagged_outright_but_not_the_untouched_version(course) -> None:
    _, rows, page = similar(course, "--ignore-common", "2")
    identical = [(r["student_a"], r["student_b"]) for r in rows if r["identical"] == "yes"]
    assert identical == [("twin_a", "twin_b")]
    assert "twin_a, twin_b" in page and "untouched" not in page


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_with_every_fragment_kept_the_reference_solution_makes_everyone_alike(course) -> None:
    """Why --ignore-common exists: six correct notebooks share most of their code."""
    _, rows, _ = similar(course, "--ignore-common", "0")
    listed = {s for r in rows if not r["identical"] for s in (r["student_a"], r["student_b"])}
    assert {"honest", "copier", "other"} <= listed and "untouched" not in listed
    assert ("twin_a", "twin_b") in {(r["student_a"], r["student_b"]) for r in rows
                                    if r["identical"] == "yes"}  # listed once, as identical


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_the_page_is_inert(course) -> None:
    _, _, page = similar(course, "--ignore-common", "2")
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"\son\w+\s*=", page)


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_bad_options_are_refused(course) -> None:
    for args in (("--threshold", "0"), ("--threshold", "1.5"), ("--min-shared", "0")):
        done = command("similarity", LESSON.name, "--course-dir", course, *args, check=False)
        assert done.returncode == 2 and "error:" in done.stderr, args


@pytest.mark.slow
@pytest.mark.xdist_group("similarity")
def test_a_large_class_is_fingerprinted_on_every_core_as_in_one_process(course,
                                                                        monkeypatch) -> None:
    """From PARALLEL_FROM hand-ins on, fingerprints are made in worker processes (spawned, one
    a core): the same submissions, in the same order, with the same fingerprints and the same
    fragments left out as common, as this process makes alone."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from grader.outputs import similarity

    notebooks = {path.parent.parent.name: path
                 for path in (course / "submitted").glob(f"*/{LESSON.name}/{NOTEBOOK}")}
    starter = course / "release" / LESSON.name / NOTEBOOK
    alone = similarity.load(notebooks, starter, 2)
    pools = []

    class Counted(ProcessPoolExecutor):
        def __init__(self, *args, **kwargs) -> None:
            pools.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(similarity, "ProcessPoolExecutor", Counted)
    monkeypatch.setattr(similarity, "PARALLEL_FROM", 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    shared = similarity.load(notebooks, starter, 2)
    assert pools == [(2,)]
    assert len(alone[0]) == len(notebooks) == 6
    assert [(s.student_id, s.sha256) for s in shared[0]] == \
        [(s.student_id, s.sha256) for s in alone[0]]
    for one, other in zip(shared[0], alone[0], strict=True):
        assert {n: v.tolist() for n, v in one.exercises.items()} == \
            {n: v.tolist() for n, v in other.exercises.items()}
    assert shared[1] == alone[1] and shared[2] == alone[2]
