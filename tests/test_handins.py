"""Hand-ins as each LMS delivers them: recognised, one grade per student, grades and feedback
back in the files the LMS's own importers read.

The downloads are built as each LMS's code names them (the source is cited beside each
builder), and the files we write back are read by models of the importers that follow their
source (Canvas ``lib/gradebook_importer.rb``, Moodle ``grade/import/csv/classes/load_data.php``
and ``mod/assign/feedback/file/importziplib.php``).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grader.handins import LAYOUTS, recognise
from grader.lessons import CourseError, load_lesson
from tests.grading_helpers import grader, points, read_export

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
FULL = sum(points(nbformat.read(LESSON.notebook, as_version=4)).values())


# ------------------------------------------------------------------ downloads, as LMSs name them

def canvas_file_name(sortable_name: str, user_id: int | str, attachment_id: int, file_name: str,
                     late: bool = False) -> str:
    """Canvas's name for a member of "Download Submissions" (lib/content_zipper.rb): the
    sortable name with "_<digits>_" made plain digits, lowercased, every non-word character
    removed; "LATE" after it when late; the user id (``anon_<id>`` under anonymous grading),
    the attachment id, the file's display name."""
    name = re.sub(r"_(\d+)_", r"\1", sortable_name).lower()
    prefix = "_".join(x for x in (name, "LATE" if late else None, str(user_id)) if x is not None)
    prefix = re.sub(r"[^\w]", "", prefix)
    return f"{prefix}_{attachment_id}_{file_name}"


def moodle_prefix(full_name: str, participant_id: int) -> str:
    """Moodle's prefix (mod/assign/classes/downloader.php): the full name with "_" made spaces,
    then "_<participant id>", through clean_filename (which drops what a file name cannot
    hold; the names drawn here hold none of it)."""
    return f"{full_name.replace('_', ' ')}_{participant_id}"


def write(path: Path, data: bytes | str = b"{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def ids(handins) -> list[str]:
    return [h.student_id for h in handins]


def test_a_canvas_download_is_one_student_per_user_id_with_the_latest_notebook(tmp_path) -> None:
    root = tmp_path / "submissions"
    write(root / canvas_file_name("Lovelace, Ada", 101, 9001, NOTEBOOK, late=True), "old")
    newest = write(root / canvas_file_name("Lovelace, Ada", 101, 9007,
                                           NOTEBOOK.replace(".ipynb", "-1.ipynb"), late=True))
    write(root / canvas_file_name("Lovelace, Ada", 101, 9002, "plot.png"))
    write(root / canvas_file_name("Smith, John", 102, 9003, NOTEBOOK))
    write(root / canvas_file_name("Smith, John", 103, 9004, "homework.ipynb"))  # same name
    write(root / canvas_file_name("", "anon_x1Y2z", 9005, NOTEBOOK))
    write(root / "smithjohn_104_text.html", "<p>see attached</p>")
    layout, handins, notes = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "canvas" and notes == []
    assert ids(handins) == ["101", "102", "103", "104", "anon_x1Y2z"]
    ada, john, other_john, text_only, anonymous = handins
    assert ada.notebook == newest and ada.late and ada.reasons == []
    assert ada.name == "lovelaceada" and ada.download_name == "lovelaceada_LATE_101"
    assert any("the latest of 2" in r for r in ada.remarks)
    assert any("plot.png" in r for r in ada.remarks)  # beside the notebook: ignored, said
    assert not john.late and john.reasons == [] and john.name == other_john.name
    assert other_john.notebook.name.endswith("homework.ipynb")
    assert other_john.reasons == [f"graded homework.ipynb in place of {NOTEBOOK}"]
    assert text_only.notebook is None and "no notebook" in text_only.reasons[0]
    assert anonymous.notebook is not None and anonymous.name == ""


@pytest.mark.parametrize("trailing", ["_", ""])  # Moodle before 4.1 ended the folder with "_"
def test_a_moodle_download_in_folders_is_one_student_per_participant(tmp_path, trailing) -> None:
    root = tmp_path / "course-assignment-42"
    ada = moodle_prefix("Adélaïde Lovelace", 5001)
    write(root / f"{ada}_assignsubmission_file{trailing}" / NOTEBOOK)
    write(root / f"{ada}_assignsubmission_file{trailing}" / "notes.txt", "x")
    write(root / f"{ada}_assignsubmission_onlinetext{trailing}" / "onlinetext.html", "hi")
    write(root / f"{moodle_prefix('Jean Dupont', 5002)}_assignsubmission_file{trailing}"
          / "sub" / NOTEBOOK)
    write(root / f"{moodle_prefix('Jean Dupont', 5003)}_assignsubmission_file{trailing}"
          / "other.ipynb")
    layout, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "moodle" and ids(handins) == ["5001", "5002", "5003"]
    first, second, third = handins
    assert first.name == "Adélaïde Lovelace" and first.reasons == []
    assert first.download_name == "Adélaïde Lovelace_5001"
    assert any("notes.txt" in r for r in first.remarks)
    assert second.name == third.name == "Jean Dupont"  # one name, two students
    assert second.notebook.parent.name == "sub" and second.reasons
    assert third.reasons == [f"graded other.ipynb in place of {NOTEBOOK}"]


def test_a_moodle_download_without_folders_is_read_from_the_file_names(tmp_path) -> None:
    root = tmp_path / "flat"
    write(root / f"{moodle_prefix('Ann Lee', 7)}_assignsubmission_file_{NOTEBOOK}")
    write(root / f"{moodle_prefix('Ann Lee', 7)}_assignsubmission_file_data.csv")
    write(root / f"{moodle_prefix('Participant', 8)}_assignsubmission_file_{NOTEBOOK}")  # blind
    layout, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "moodle" and ids(handins) == ["7", "8"]
    assert handins[0].notebook.name.endswith(NOTEBOOK) and handins[0].reasons == []
    assert any("data.csv" in r for r in handins[0].remarks)


BLACKBOARD_TXT = """Name: {name} ({user})
Assignment: Float formats
Date Submitted: Monday, March 3, 2025 11:58:02 PM CET
Current Grade: Needs Grading

Submission Field:
There is no student submission text data for this assignment.

Comments:
There are no student comments for this assignment.

Files:
\tOriginal filename: {file}
\tFilename: {stored}
"""


def blackboard_attempt(root: Path, assignment: str, user: str, name: str, date: str,
                       files: dict[str, bytes | str]) -> None:
    """Blackboard Learn's "Download Assignment": ``<assignment>_<username>_attempt_<date>``,
    a file per attachment after it and a ``.txt`` of the attempt's metadata."""
    prefix = f"{assignment}_{user}_attempt_{date}"
    for original, data in files.items():
        write(root / f"{prefix}_{original}", data)
    write(root / f"{prefix}.txt", BLACKBOARD_TXT.format(
        name=name, user=user, file=", ".join(files), stored=f"{prefix}_{next(iter(files))}"))


def test_a_blackboard_download_grades_each_username_once_from_its_latest_attempt(
        tmp_path) -> None:
    root = tmp_path / "gradebook_CS101_Float_formats_2025-03-04-09-00-00"
    blackboard_attempt(root, "Float_formats", "jdoe", "Jane Doe", "2025-03-01-10-00-00",
                       {NOTEBOOK: "first"})
    blackboard_attempt(root, "Float_formats", "jdoe", "Jane Doe", "2025-03-03-23-58-02",
                       {NOTEBOOK: "second", "scratch.py": "x"})
    blackboard_attempt(root, "Float_formats", "m_lee", "Min Lee", "2025-03-02-08-00-00",
                       {NOTEBOOK: "{}"})  # a username with "_": the metadata says where it ends
    layout, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "blackboard" and ids(handins) == ["jdoe", "m_lee"]
    jane, min_lee = handins
    assert jane.notebook.read_text() == "second" and jane.name == "Jane Doe"
    assert any("2025-03-03-23-58-02, the latest of 2" in r for r in jane.remarks)
    assert any("scratch.py" in r for r in jane.remarks)
    assert not any(".txt" in r for r in jane.remarks)  # the metadata is not a hand-in
    assert min_lee.name == "Min Lee" and min_lee.reasons == []


GRADESCOPE_METADATA = """\
submission_217362225:
  :submitters:
  - :name: Bo Cheng
    :sid: '06758214'
    :email: bo@example.edu
  :created_at: 2025-12-04 05:26:26.899837000 Z
  :score: 0.0
  :status: processed
  :history:
  - :submitters: []
    :created_at: 2025-12-03 05:26:26.000000000 Z
    :id: 217300000
submission_217362300:
  :submitters:
  - :name: Ana Ruiz
    :sid: ''
    :email: ana@example.edu
  - :name: Kai Moe
    :sid: 5551
    :email: kai@example.edu
  :created_at: 2025-12-04 06:00:00.000000000 -08:00
  :score: 0.0
  :status: processed
submission_217362999:
  :submitters:
  - :name: Gone Away
    :sid: '999'
  :created_at: 2025-12-04 07:00:00.000000000 Z
"""


def test_a_gradescope_export_names_students_from_its_metadata(tmp_path) -> None:
    """Gradescope's "Export Submissions": ``submission_<id>/`` folders and
    ``submission_metadata.yml`` (Ruby's YAML: keys ``:submitters``, ``:sid``, ...)."""
    root = tmp_path / "assignment_123_export"
    write(root / "submission_metadata.yml", GRADESCOPE_METADATA)
    write(root / "submission_217362225" / NOTEBOOK)
    write(root / "submission_217362300" / NOTEBOOK)
    write(root / "submission_217362300" / "README.md", "ours")
    write(root / "submission_1" / NOTEBOOK)  # not in the metadata
    layout, handins, notes = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "gradescope"
    assert ids(handins) == ["06758214", "5551", "999", "ana@example.edu"]
    bo, kai, gone, ana = handins
    assert bo.name == "Bo Cheng" and bo.email == "bo@example.edu" and bo.reasons == []
    assert kai.notebook == ana.notebook  # a group submission: each of its students graded
    assert gone.notebook is None and "not in the export" in gone.reasons[0]
    assert any("submission_1" in n for n in notes)


def test_nbgrader_collect_layout_is_graded_without_a_note(tmp_path) -> None:
    root = tmp_path / "course"
    write(root / "submitted" / "alice" / LESSON.name / NOTEBOOK)
    write(root / "submitted" / "alice" / LESSON.name / "timestamp.txt", "2025-01-01 10:00")
    write(root / "submitted" / "bob" / LESSON.name / NOTEBOOK)
    layout, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    assert layout == "nbgrader" and ids(handins) == ["alice", "bob"]
    assert all(h.reasons == [] and h.notebook.parent.name == LESSON.name for h in handins)


def test_nbgrader_layout_skips_students_who_handed_in_only_other_lessons(tmp_path) -> None:
    """collected/ (and nbgrader's submitted/) hold every lesson: a student who has not handed
    in this one is not graded for it, least of all on another lesson's notebook."""
    root = tmp_path / "collected"
    write(root / "alice" / LESSON.name / NOTEBOOK)
    write(root / "bob" / "02_tensor_storage" / "tensor_storage.ipynb")
    write(root / "carol" / NOTEBOOK)  # a notebook of its own: a hand-in, graded as before
    for layout in (None, "nbgrader"):
        found, handins, notes = recognise(root, LESSON.name, NOTEBOOK, layout)
        assert found == "nbgrader" and ids(handins) == ["alice", "carol"]
        assert any("hold no 01_float_formats folder" in n and "bob" in n for n in notes)


def test_student_folders_stay_as_they_were(tmp_path) -> None:
    write(tmp_path / "class" / "s1" / NOTEBOOK)
    write(tmp_path / "class" / "s2" / "mine.ipynb")
    layout, handins, _ = recognise(tmp_path / "class", LESSON.name, NOTEBOOK)
    assert layout == "folders" and ids(handins) == ["s1", "s2"]
    assert handins[0].reasons == [] and "in place of" in handins[1].reasons[0]


def test_a_wrapping_folder_is_stepped_into_and_a_named_layout_overrides(tmp_path) -> None:
    root = tmp_path / "unzipped"
    write(root / "submissions" / canvas_file_name("Doe, Jane", 1, 2, NOTEBOOK))
    write(root / "submissions" / canvas_file_name("Roe, Rick", 3, 4, NOTEBOOK))
    assert recognise(root, LESSON.name, NOTEBOOK)[0] == "canvas"
    layout, handins, notes = recognise(root / "submissions", LESSON.name, NOTEBOOK, "moodle")
    assert layout == "moodle" and handins == []
    assert notes == ["ignored 2 file(s) or folder(s) not named as a hand-in in a Moodle "
                     "download: doejane_1_2_float_formats.ipynb, roerick_3_4_float_formats.ipynb"]
    with pytest.raises(CourseError, match="unknown layout"):
        recognise(root, LESSON.name, NOTEBOOK, "sakai")


def test_files_no_lms_names_so_ask_for_the_layout(tmp_path) -> None:
    write(tmp_path / "x" / "a.ipynb")
    write(tmp_path / "x" / "b.ipynb")
    with pytest.raises(CourseError, match="--from"):
        recognise(tmp_path / "x", LESSON.name, NOTEBOOK)


# Names as students choose them: any letters, spaces, accents, "_", digits, punctuation.
NAMES = st.text(st.characters(categories=("L", "Nd", "Zs", "P", "M"), exclude_characters="/\0"),
                min_size=0, max_size=40)
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(people=st.lists(st.tuples(NAMES, st.integers(1, 10**9), st.booleans()), min_size=1,
                       max_size=6, unique_by=lambda p: p[1]))
@example(people=[("Smith, John", 12, False), ("Smith, John", 13, True)])
@example(people=[("Dr_4_Who", 4, False), ("_7_", 5, True)])
def test_any_canvas_names_give_one_hand_in_per_user_id(tmp_path_factory, people) -> None:
    root = tmp_path_factory.mktemp("canvas")
    for attachment, (name, user, late) in enumerate(people, start=1):
        write(root / canvas_file_name(name, user, attachment, NOTEBOOK, late))
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK, "canvas")
    assert sorted(ids(handins)) == sorted(str(p[1]) for p in people)
    lateness = {str(user): late for _, user, late in people}
    assert all(h.late == lateness[h.student_id] and h.notebook is not None for h in handins)
    shutil.rmtree(root)


@PROPERTY
@given(people=st.lists(st.tuples(NAMES, st.integers(1, 10**9)), min_size=1, max_size=6,
                       unique_by=lambda p: p[1]),
       folders=st.booleans())
@example(people=[("Jean_Dupont", 1), ("Jean Dupont", 2)], folders=True)
@example(people=[(".Dot", 3), ("", 4)], folders=False)  # "." first: not a hidden file here
def test_any_moodle_names_give_one_hand_in_per_participant(tmp_path_factory, people,
                                                             folders) -> None:
    root = tmp_path_factory.mktemp("moodle")
    for name, participant in people:
        prefix = moodle_prefix(name, participant)
        if folders:
            write(root / f"{prefix}_assignsubmission_file" / NOTEBOOK)
        else:
            write(root / f"{prefix}_assignsubmission_file_{NOTEBOOK}")
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK, "moodle")
    assert sorted(ids(handins)) == sorted(str(p[1]) for p in people)
    names = {str(p): n.replace("_", " ") for n, p in people}
    assert all(h.name == names[h.student_id] and h.reasons == [] for h in handins)
    shutil.rmtree(root)


def test_hostile_names_in_each_lms_pattern_stay_names(tmp_path) -> None:
    """Escape codes, bidirectional overrides and bytes that are not UTF-8 where each LMS puts
    the student's name: the id still comes from where the LMS puts it, the name is escaped."""
    evil = b"\x1b[2J\xe2\x80\xae\xff"
    cases = {
        "canvas": [b"evil" + b"_77_1_" + evil + NOTEBOOK.encode(),  # the student's file name
                   "\u00e9l\u00e8ve_78_2_x.ipynb".encode()],  # a name Canvas writes: letters
        "moodle": [evil + b"_78_assignsubmission_file_" + NOTEBOOK.encode()],
        "blackboard": [b"Float" + evil + b"_u79_attempt_2025-01-01-00-00-00_"
                       + NOTEBOOK.encode()],
    }
    for layout, names in cases.items():
        root = tmp_path / layout
        root.mkdir()
        for name in names:
            with open(os.path.join(os.fsencode(root), name), "wb") as handle:
                handle.write(b"{}")
        found, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
        assert found == layout
        handin = handins[0]
        assert handin.student_id in ("77", "78", "u79") and handin.notebook is not None
        for text in (handin.name, *handin.remarks, *handin.reasons):
            assert "\x1b" not in text and "\u202e" not in text
    # Canvas removes every character of a name that is not a letter, digit or "_": a name with
    # others is not Canvas's, and is ignored with an escaped note.
    root = tmp_path / "forged"
    root.mkdir()
    with open(os.path.join(os.fsencode(root), b"evil" + evil + b"_7_1_x.ipynb"), "wb") as out:
        out.write(b"{}")
    write(root / canvas_file_name("Real, One", 8, 2, NOTEBOOK))
    write(root / canvas_file_name("Real, Two", 9, 3, NOTEBOOK))
    _, handins, notes = recognise(root, LESSON.name, NOTEBOOK, "canvas")
    assert ids(handins) == ["8", "9"] and "\x1b" not in " ".join(notes) and "evil" in notes[0]


def test_a_forged_gradescope_metadata_file_is_refused_or_read_safely(tmp_path) -> None:
    root = tmp_path / "gs"
    write(root / "submission_1" / NOTEBOOK)
    write(root / "submission_metadata.yml", "!!python/object/apply:os.system ['touch pwned']")
    with pytest.raises(CourseError, match="not readable YAML"):
        recognise(root, LESSON.name, NOTEBOOK)
    laughs = "a: &a ['x','x']\n" + "".join(f"{c}: &{c} [*{p},*{p},*{p},*{p}]\n" for p, c in
                                             zip("abcdefgh", "bcdefghi", strict=True))
    write(root / "submission_metadata.yml", laughs + "submission_1:\n  :submitters: *i\n")
    with pytest.raises(CourseError, match="alias"):  # a few lines could name millions
        recognise(root, LESSON.name, NOTEBOOK)
    write(root / "submission_metadata.yml", "submission_1:\n  :submitters:\n  - :name: \"\u202e"
          "\u200b\"\n  x: [unclosed\n")
    with pytest.raises(CourseError) as refused:
        recognise(root, LESSON.name, NOTEBOOK)
    assert "\u202e" not in str(refused.value) and "\u200b" not in str(refused.value)
    assert not (Path.cwd() / "pwned").exists()


def test_a_blackboard_file_name_cannot_speak_for_another_student(tmp_path) -> None:
    """The student names the file after "_attempt_<date>_", and may write another username and
    date into it: the first "_attempt_<date>" is Blackboard's, the rest is the file's name."""
    root = tmp_path / "board"
    blackboard_attempt(root, "Floats", "asmith", "Ann Smith", "2025-03-01-10-00-00",
                       {NOTEBOOK: "ann's"})
    forged = f"asmith_attempt_2099-01-01-00-00-00_{NOTEBOOK}"
    blackboard_attempt(root, "Floats", "jdoe", "Jane Doe", "2025-03-01-11-00-00",
                       {NOTEBOOK: "jane's", forged: "blank"})
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    ann, jane = handins
    assert (ann.student_id, ann.notebook.read_text()) == ("asmith", "ann's")
    assert (jane.student_id, jane.notebook.read_text()) == ("jdoe", "jane's")
    too_long = ("Floats_jdoe_attempt_2025-03-01-11-00-00_asmith_attempt_2025-01-01-00-00-00_"
                + "x" * 200)
    _, handins, notes = recognise(root, LESSON.name, NOTEBOOK,
                                  refused=[([too_long], "refused: too long")])
    assert [h.reasons for h in handins] == [[], ["refused: too long"]] and notes == []


def test_a_canvas_name_that_reads_two_ways_is_decided_by_the_others_or_flagged(tmp_path) -> None:
    """A sortable name may end in "_<digits>" (a self-chosen name "alex_2005"): "alex_2005_123_
    77_x" reads as user 2005 or user 123. Another file of the same student decides; alone, the
    file is flagged, and never displaces a file surely another student's."""
    root = tmp_path / "canvas"
    write(root / canvas_file_name("alex_2005", 123, 77, NOTEBOOK), "alex's")
    write(root / canvas_file_name("Real, Student", 2005, 50, NOTEBOOK), "real's")
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK, "canvas")
    by_id = {h.student_id: h for h in handins}
    assert by_id["2005"].notebook.read_text() == "real's" and by_id["2005"].reasons == []
    assert by_id["123"].notebook.read_text() == "alex's"
    assert "reads as 2 users" in by_id["123"].reasons[0]  # flagged: the instructor looks
    write(root / "alex_2005_123_text.html", "<p>hi</p>")  # reads one way: it confirms 123
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK, "canvas")
    by_id = {h.student_id: h for h in handins}
    assert set(by_id) == {"123", "2005"} and by_id["123"].reasons == []
    assert by_id["123"].notebook.read_text() == "alex's"
    honest = tmp_path / "honest"  # a file name that begins with digits reads one way only
    write(honest / canvas_file_name("Lee, Ann", 101, 9001, "01_" + NOTEBOOK))
    write(honest / canvas_file_name("Roe, Rick", 102, 9002, NOTEBOOK))
    _, handins, _ = recognise(honest, LESSON.name, NOTEBOOK, "canvas")
    assert (handins[0].student_id, handins[0].reasons) == (
        "101", [f"graded 01_{NOTEBOOK} in place of {NOTEBOOK}"])


def test_gradescope_ids_that_cannot_be_gradebook_ids_are_kept_for_display(tmp_path) -> None:
    root = tmp_path / "gs"
    write(root / "submission_metadata.yml", """\
submission_1:
  :submitters:
  - :name: Ana Ruiz
    :sid: 'A 1234'
    :email: ana@uni.es
submission_2:
  :submitters:
  - :name: Pat O'Brien
    :sid: ''
    :email: o'brien@uni.edu
""")
    write(root / "submission_1" / NOTEBOOK)
    write(root / "submission_2" / NOTEBOOK)
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    ana, pat = sorted(handins, key=lambda h: h.name)
    assert (ana.student_id, ana.lms_id) == ("ana@uni.es", "A 1234") and ana.reasons == []
    assert pat.student_id.startswith("gradescope-") and pat.lms_id == "o'brien@uni.edu"
    again = recognise(root, LESSON.name, NOTEBOOK)[1]
    assert {h.student_id for h in again} == {h.student_id for h in handins}  # stable ids


def test_one_folder_around_a_class_is_stepped_into_and_around_one_student_is_not(
        tmp_path) -> None:
    """A folder of several folders and no notebook is a class, even where some students handed
    in nothing; a student's folder holds its notebook at the top (README)."""
    write(tmp_path / "one" / "alice" / NOTEBOOK)
    write(tmp_path / "one" / "alice" / "data" / "x.csv", "1,2")
    layout, handins, _ = recognise(tmp_path / "one", LESSON.name, NOTEBOOK)
    assert (layout, ids(handins)) == ("folders", ["alice"])
    write(tmp_path / "class" / "wrap" / "bob" / NOTEBOOK)
    (tmp_path / "class" / "wrap" / "carol").mkdir()
    assert ids(recognise(tmp_path / "class", LESSON.name, NOTEBOOK)[1]) == ["bob", "carol"]


def test_a_named_layout_steps_into_its_wrapping_folder_and_follows_no_link(tmp_path) -> None:
    write(tmp_path / "zip" / "submissions" / canvas_file_name("Doe, Jane", 1, 2, NOTEBOOK))
    assert ids(recognise(tmp_path / "zip", LESSON.name, NOTEBOOK, "canvas")[1]) == ["1"]
    secret = write(tmp_path / "elsewhere" / LESSON.name / NOTEBOOK, "not a student's")
    write(tmp_path / "course" / "submitted" / "mallory" / "readme.txt", "x")
    os.symlink(secret.parent, tmp_path / "course" / "submitted" / "mallory" / LESSON.name)
    _, handins, _ = recognise(tmp_path / "course", LESSON.name, NOTEBOOK, "nbgrader")
    assert handins[0].notebook is None  # the link is not followed


# ------------------------------------------------------------------ the importers, modelled

CANVAS_TITLE_ID = re.compile(r"\A(.*)\s\((\d+)\)\Z")  # lib/gradebook_importer.rb
CANVAS_IGNORED = re.compile(r"Current Score|Current Points|Current Grade|Final Score|"
                            r"Final Points|Final Grade|Override Score|Override Grade")


def canvas_import(text: str, assignments: dict[int, str], users: dict[str, dict[str, str]]):
    """What Canvas's gradebook importer makes of a file: the header must start ``Student``,
    ``ID`` and end the student columns with ``Section``; an assignment column is matched by
    ``Title (id)``'s id, then by its exact title, else it is a new assignment; a student by
    ID, then SIS User ID, then SIS Login ID, then name, else unknown; a blank cell or ``-`` is
    no score. Returns (columns matched, new columns, {user id: {title: score}}, unknown)."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    assert "Student" in header[0] and "ID" in header[1]
    section = header.index("Section")
    matched, new, scores, unknown = {}, [], {}, []
    for column, title in enumerate(header[section + 1:], start=section + 1):
        if CANVAS_IGNORED.search(title):
            continue
        found = CANVAS_TITLE_ID.match(title)
        if found and int(found[2]) in assignments:
            matched[column] = assignments[int(found[2])]
        elif title in assignments.values():
            matched[column] = title
        else:
            new.append(title)
    for row in rows[1:]:
        if "Points Possible" in row[0]:
            continue
        user = next((uid for uid, u in users.items() if row[1] and row[1] == uid), None) \
            or next((uid for uid, u in users.items() if row[2] and row[2] == u["sis_user_id"]),
                    None) \
            or next((uid for uid, u in users.items() if row[3] and row[3] == u["sis_login_id"]),
                    None) \
            or next((uid for uid, u in users.items() if row[0] == u["name"]), None)
        if user is None:
            unknown.append(row[:4])
            continue
        scores[user] = {title: (None if row[c] in ("", "-") else float(row[c]))
                        for c, title in matched.items()}
    return matched, new, scores, unknown


def moodle_import(text: str, mapped: str, users: dict[str, dict[str, str]]):
    """Moodle's grade/import/csv load_data.php: the mapped column names the user (username,
    email or idnumber); an unknown user aborts the whole import; a blank identifier keeps the
    previous row's user (or aborts on the first row); a blank or ``-`` grade is no grade.
    Returns {username: {column: grade}}."""
    rows = list(csv.reader(io.StringIO(text)))
    header, column = rows[0], rows[0].index(mapped)
    field = {"Username": "username", "Email address": "email", "ID number": "id_number"}[mapped]
    grades, student = {}, None
    for row in rows[1:]:
        if row[column]:
            student = next((u for u, known in users.items() if known[field] == row[column]),
                           None)
            if student is None:
                raise AssertionError(f"User not found, abort whole import: {row[column]}")
        elif student is None:
            raise AssertionError("no user on the first row: import aborted")
        grades[student] = {title: (None if row[i] in ("", "-") else float(row[i]))
                           for i, title in enumerate(header) if i > 1}
    return grades


def moodle_feedback_import(archive: Path) -> dict[str, list[str]]:
    """Moodle's importziplib.php: each path component split on "_" into at most five parts; the
    second is the participant id, the third and fourth the plugin (assignfeedback, file).
    Returns {participant id: [file names]}."""
    found: dict[str, list[str]] = {}
    with zipfile.ZipFile(archive) as handle:
        for name in handle.namelist():
            first, *rest = name.split("/")
            info = first.split("_", 4)
            assert len(info) >= 4 and info[1].isdigit(), name
            assert (info[2], info[3]) == ("assignfeedback", "file"), name
            found.setdefault(info[1], []).append("/".join([info[4], *rest]).lstrip("/"))
    return found


# ------------------------------------------------------------------ grades back

def fake_course(tmp_path, rows):
    from grader.course import Course

    course = Course(tmp_path / "course", log=lambda _: None)
    said: list[str] = []
    course.log = said.append
    course.grades = lambda: [dict(r) for r in rows]
    return course, said


def row(student, lesson, score, status="graded", source="", name="", reason="", maximum=15.0):
    return {"student_id": student, "lesson": lesson, "score": score, "max_score": maximum,
            "status": status, "reason": reason, "name": name, "late": False, "from": source,
            "email": "", "remarks": []}


ASSIGNMENTS = "lesson,title,id,points\n01_float_formats,Float formats,4242,10\n" \
              "04_backprop_flops,Backprop (6ND),4250,\n"


def test_canvas_export_matches_assignments_by_id_and_never_overwrites(tmp_path) -> None:
    from grader.export import export

    course, said = fake_course(tmp_path, [
        row("101", "01_float_formats", 12.0, source="canvas", name="lovelaceada"),
        row("102", "01_float_formats", 3.0, "needs_review", "canvas", "smithjohn", "=cmd|x"),
        row("103", "01_float_formats", 0.0, "invalid", "canvas", "=HYPERLINK(\"x\")"),
        row("101", "04_backprop_flops", 7.5, source="canvas", maximum=9.0),
        row("s9", "01_float_formats", 15.0, source="folders"),  # no Canvas id known
        row("-5", "01_float_formats", 15.0, source="folders"),
    ])
    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,name,lms_id,sis_user_id,sis_login_id,section\n"
                      "-5,Minus Five,=1+1,,,\n104,\"Cyd, Carl\",104,S4,ccyd,A\n")
    export(course, tmp_path / "canvas.csv", "canvas", roster, tmp_path / "a.csv")
    text = (tmp_path / "canvas.csv").read_text()
    users = {"101": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""},
             "102": {"name": "Smith, John", "sis_user_id": "", "sis_login_id": ""},
             "103": {"name": "Smith, Jo", "sis_user_id": "", "sis_login_id": ""},
             "104": {"name": "Cyd, Carl", "sis_user_id": "S4", "sis_login_id": "ccyd"}}
    matched, new, scores, unknown = canvas_import(
        text, {4242: "Float formats", 4250: "Backprop (6ND)"}, users)
    assert new == [] and unknown == []  # every column an assignment, every row a student
    assert sorted(matched.values()) == ["Backprop (6ND)", "Float formats"]
    assert scores["101"] == {"Float formats": 8.0, "Backprop (6ND)": 7.5}  # 12/15 of 10; raw
    assert scores["102"] == {"Float formats": None, "Backprop (6ND)": None}  # needs_review
    assert scores["103"]["Float formats"] is None  # invalid: blank, not 0
    assert scores["104"] == {"Float formats": None, "Backprop (6ND)": None}  # no submission
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert table[0][5:] == ["Float formats (4242)", "Backprop (6ND) (4250)"]
    assert not any(r[0] == "Points Possible" for r in table)  # one lesson gives no points
    assert {r[1] for r in table[1:]} == {"101", "102", "103", "104"}  # nothing invented
    assert next(r for r in table if r[1] == "103")[0].startswith("'=")  # a name, quoted
    held = {(r["student_id"], r["lesson"]): r for r in csv.DictReader(
        (tmp_path / "canvas-not-exported.csv").open())}
    assert held[("102", "01_float_formats")]["status"] == "needs_review"
    assert held[("103", "01_float_formats")]["status"] == "invalid"
    assert "no identifier from the LMS" in held[("s9", "01_float_formats")]["why"]
    assert "formula" in held[("-5", "01_float_formats")]["why"]
    assert held[("104", "01_float_formats")]["status"] == "missing"
    assert any("raw points" in s for s in said)
    export(course, tmp_path / "flagged.csv", "canvas", None, tmp_path / "a.csv",
           include_flagged=True)
    _, _, scores, _ = canvas_import((tmp_path / "flagged.csv").read_text(),
                                    {4242: "Float formats", 4250: "Backprop (6ND)"}, users)
    assert scores["102"]["Float formats"] == 2.0  # needs_review, computed: 3 of 15, of 10
    assert scores["103"]["Float formats"] is None  # invalid has no computed score: blank


def test_canvas_export_without_assignments_refuses_and_shows_the_file_to_write(tmp_path) -> None:
    from grader.export import export

    course, _ = fake_course(tmp_path, [row("101", "01_float_formats", 12.0, source="canvas")])
    with pytest.raises(CourseError, match=r"(?s)Title \(id\).*lesson,title,id,points"):
        export(course, tmp_path / "canvas.csv", "canvas")


def test_a_points_possible_row_only_when_every_lesson_gives_its_points(tmp_path) -> None:
    from grader.export import export

    course, _ = fake_course(tmp_path, [row("101", "01_float_formats", 15.0, source="canvas")])
    (tmp_path / "a.csv").write_text("lesson,title,id,points\n01_float_formats,Floats,1,20\n")
    export(course, tmp_path / "c.csv", "canvas", None, tmp_path / "a.csv")
    table = list(csv.reader((tmp_path / "c.csv").open()))
    assert table[1] == ["Points Possible", "", "", "", "", "20"] and table[2][-1] == "20"


def test_moodle_export_writes_one_identifier_the_roster_gives_and_no_blank_one(tmp_path) -> None:
    from grader.export import export

    course, said = fake_course(tmp_path, [
        row("5001", "01_float_formats", 15.0, source="moodle", name="Adélaïde Lovelace"),
        row("5002", "01_float_formats", 6.0, source="moodle", name="Jean Dupont"),
        row("5003", "01_float_formats", 6.0, source="moodle", name="Jean Dupont"),
    ])
    worksheet = tmp_path / "worksheet.csv"  # Moodle's "Download grading worksheet"
    worksheet.write_text("Identifier,Full name,Email address,Status,Grade,Maximum Grade\n"
                         "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted,,100\n"
                         "Participant 5002,Jean Dupont,jean@uni.fr,Submitted,,100\n")
    export(course, tmp_path / "moodle.csv", "moodle", worksheet)
    text = (tmp_path / "moodle.csv").read_text()
    assert next(csv.reader(io.StringIO(text))) == ["Email address", "Full name",
                                                   "01_float_formats"]
    users = {"ada": {"email": "ada@uni.fr", "username": "ada", "id_number": ""},
             "jean": {"email": "jean@uni.fr", "username": "jean", "id_number": ""},
             "jean2": {"email": "jean2@uni.fr", "username": "jean2", "id_number": ""}}
    grades = moodle_import(text, "Email address", users)
    assert grades == {"ada": {"01_float_formats": 15.0}, "jean": {"01_float_formats": 6.0}}
    held = list(csv.DictReader((tmp_path / "moodle-not-exported.csv").open()))
    assert [(r["student_id"], r["status"]) for r in held] == [("5003", "not written")]
    assert any("map 'Email address'" in s for s in said)


def test_moodle_worksheets_of_two_lessons_make_one_row_per_person(tmp_path) -> None:
    """Moodle gives each assignment its own participant ids: Ada is 11 in lesson 01 and 57 in
    lesson 02. Her two worksheets' e-mail joins them into one row."""
    from grader.export import export

    course, _ = fake_course(tmp_path, [
        row("11", "01_float_formats", 15.0, source="moodle", name="Ada"),
        row("57", "02_tensors_and_strides", 6.0, source="moodle", name="Ada", maximum=9.0)])
    first, second = tmp_path / "w1.csv", tmp_path / "w2.csv"
    first.write_text("Identifier,Full name,Email address\nParticipant 11,Ada,ada@uni.fr\n")
    second.write_text("Identifier,Full name,Email address\nParticipant 57,Ada,ada@uni.fr\n")
    export(course, tmp_path / "m.csv", "moodle", [first, second])
    grades = moodle_import((tmp_path / "m.csv").read_text(), "Email address",
                           {"ada": {"email": "ada@uni.fr", "username": "ada", "id_number": ""}})
    assert grades == {"ada": {"01_float_formats": 15.0, "02_tensors_and_strides": 6.0}}
    assert len((tmp_path / "m.csv").read_text().splitlines()) == 2  # header and one row


def test_anonymous_canvas_ids_are_not_written_as_user_ids(tmp_path) -> None:
    from grader.export import export

    course, _ = fake_course(tmp_path, [
        row("anon_x1Y2z", "01_float_formats", 15.0, source="canvas"),
        row("101", "01_float_formats", 15.0, source="canvas", name="lovelaceada")])
    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    export(course, tmp_path / "c.csv", "canvas", None, tmp_path / "a.csv")
    assert "anon_" not in (tmp_path / "c.csv").read_text()
    held = (tmp_path / "c-not-exported.csv").read_text()
    assert "anon_x1Y2z" in held and "anonymous grading" in held


def test_the_plain_export_keeps_identifiers_and_shows_the_late_mark(tmp_path) -> None:
    from grader.export import export

    late = row("+1", "01_float_formats", 4.0, source="blackboard", name="@Bob")
    late["late"] = True
    course, _ = fake_course(tmp_path, [late])
    export(course, tmp_path / "plain.csv", "csv")
    found = read_export(tmp_path / "plain.csv")[("+1", "01_float_formats")]
    assert found["late"] == "late" and found["name"] == "'@Bob" and found["from"] == "blackboard"


def test_assignments_and_rosters_that_are_wrong_say_what_to_fix(tmp_path) -> None:
    from grader.export import read_assignments, read_roster

    bad = tmp_path / "a.csv"
    for text, message in [("lesson,name\n", "needs a header row lesson,title"),
                          ("lesson,title,id\n01_float_formats,,1\n", "has no title"),
                          ("lesson,title,id\n01_float_formats,X,abc\n", "is not the LMS's number"),
                          ("lesson,title,points\n01_float_formats,X,-3\n", "not a positive")]:
        bad.write_text(text)
        with pytest.raises(CourseError, match=message):
            read_assignments(bad)
    bad.write_text("who,what\nx,y\n")
    with pytest.raises(CourseError, match=r"student_id column.*Canvas.*Moodle"):
        read_roster(bad)
    bad.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Float formats (4242)\n"
                   "    Points Possible,,,,,10\n\"Lovelace, Ada\",101,S1,ada,A,\n")
    assert read_roster(bad) == {"101": {
        "name": "Lovelace, Ada", "lms_id": "101", "sis_user_id": "S1", "sis_login_id": "ada",
        "section": "A", "email": "", "username": "", "id_number": ""}}


# ------------------------------------------------------------------ end to end, every layout



def zip_folder(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                handle.write(path, path.relative_to(folder.parent))
    return archive


@pytest.fixture(scope="module")
def classroom(tmp_path_factory):
    """One course; a class of two in each LMS's download (one finished notebook, one
    untouched), graded as it came, one command per download."""
    tmp = tmp_path_factory.mktemp("classroom")
    course = tmp / "course"
    grader("release", LESSON.name, "--course-dir", course)
    done_nb = LESSON.notebook.read_bytes()
    blank = (course / "release" / LESSON.name / NOTEBOOK).read_bytes()
    downloads = tmp / "downloads"
    canvas = downloads / "canvas" / "submissions"
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 901, NOTEBOOK, late=True), blank)
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 905,
                                    NOTEBOOK.replace(".ipynb", "-1.ipynb"), late=True), done_nb)
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 902, "plot.png"), b"\x89PNG")
    write(canvas / canvas_file_name("Lovelace, Ada", 102, 903, NOTEBOOK), blank)  # same name
    moodle = downloads / "moodle" / "CS101-Floats-77"
    write(moodle / f"{moodle_prefix('Adélaïde Lovelace', 5001)}_assignsubmission_file_"
          / NOTEBOOK, done_nb)
    write(moodle / f"{moodle_prefix('Jean Dupont', 5002)}_assignsubmission_file_" / NOTEBOOK,
          blank)
    board = downloads / "blackboard" / "gradebook_CS101_Floats"
    blackboard_attempt(board, "Floats", "jdoe", "Jane Doe", "2025-03-01-10-00-00",
                       {NOTEBOOK: blank})
    blackboard_attempt(board, "Floats", "jdoe", "Jane Doe", "2025-03-02-10-00-00",
                       {NOTEBOOK: done_nb})
    blackboard_attempt(board, "Floats", "rroe", "Rick Roe", "2025-03-01-11-00-00",
                       {NOTEBOOK: blank})
    scope = downloads / "gradescope" / "assignment_9_export"
    write(scope / "submission_metadata.yml", GRADESCOPE_METADATA.split("submission_217362999")[0])
    write(scope / "submission_217362225" / NOTEBOOK, done_nb)
    write(scope / "submission_217362300" / NOTEBOOK, blank)
    collected = downloads / "nbgrader" / "submitted"
    write(collected / "alice" / LESSON.name / NOTEBOOK, done_nb)
    write(collected / "bob" / LESSON.name / NOTEBOOK, blank)
    runs = {}
    for layout in ("canvas", "moodle", "blackboard", "gradescope", "nbgrader"):
        source = downloads / layout
        if layout != "nbgrader":  # an LMS's zip as it came; nbgrader's folder as it is
            source = zip_folder(next(source.iterdir()), downloads / f"{layout}.zip")
        runs[layout] = grader("autograde", LESSON.name, source, "--course-dir", course,
                              "--jobs", "2")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    feedback = grader("feedback", LESSON.name, "--course-dir", course, "--zip")
    report = grader("report", LESSON.name, "--course-dir", course)
    return {"course": course, "runs": runs, "grades": read_export(tmp / "grades.csv"),
            "feedback": feedback, "report": report, "tmp": tmp}


EXPECTED = {  # layout: {student id: (score, late)}
    "canvas": {"101": (FULL, True), "102": (0.0, False)},
    "moodle": {"5001": (FULL, False), "5002": (0.0, False)},
    "blackboard": {"jdoe": (FULL, False), "rroe": (0.0, False)},
    "gradescope": {"06758214": (FULL, False), "5551": (0.0, False),
                   "ana@example.edu": (0.0, False)},
    "nbgrader": {"alice": (FULL, False), "bob": (0.0, False)},
}


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
@pytest.mark.parametrize("layout", list(EXPECTED))
def test_each_download_is_recognised_and_every_student_graded_once(classroom, layout) -> None:
    run = classroom["runs"][layout]
    label = {"canvas": "a Canvas download", "moodle": "a Moodle download",
             "blackboard": "a Blackboard Learn download", "gradescope": "a Gradescope export",
             "nbgrader": "nbgrader's collect layout"}[layout]
    assert f"recognised {label}: {len(EXPECTED[layout])} student(s)" in run.stdout
    assert f"{len(EXPECTED[layout])} graded, 0 needs_review, 0 invalid" in run.stdout
    for student, (score, late) in EXPECTED[layout].items():
        found = classroom["grades"][(student, LESSON.name)]
        assert float(found["score"]) == score, (student, found)
        assert found["from"] == layout and (found["late"] == "late") == late


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_the_graded_attempt_and_the_names_are_reported(classroom) -> None:
    canvas = classroom["runs"]["canvas"].stdout
    assert "101 (lovelaceada, LATE): graded" in canvas and "the latest of 2" in canvas
    assert "plot.png" in canvas
    grades = classroom["grades"]
    assert grades[("5001", LESSON.name)]["name"] == "Adélaïde Lovelace"
    assert grades[("jdoe", LESSON.name)]["name"] == "Jane Doe"
    assert "marked late by the LMS: 1" in classroom["report"].stdout
    handins = (classroom["course"] / "reports" / LESSON.name / "handins.csv").read_text()
    assert "2025-03-02-10-00-00, the latest of 2" in handins
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{classroom['course'] / 'gradebook.db'}",
                   course_id="counting-the-cost") as gb:
        ada = gb.find_student("5001")
        assert (ada.last_name, ada.lms_user_id) == ("Adélaïde Lovelace", "5001")
        assert gb.find_student("06758214").email == "bo@example.edu"


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_feedback_goes_back_as_each_lms_takes_it(classroom) -> None:
    zips = classroom["course"] / "feedback-zips" / LESSON.name
    page = f"{LESSON.notebook_id}.html"
    assert moodle_feedback_import(zips / "moodle-feedback.zip") == {"5001": [page],
                                                                    "5002": [page]}
    with zipfile.ZipFile(zips / "moodle-feedback.zip") as handle:
        assert sorted(handle.namelist())[0] == \
            f"Adélaïde Lovelace_5001_assignfeedback_file_/{page}"
    assert sorted(p.name for p in (zips / "canvas").iterdir()) == \
        ["lovelaceada_102", "lovelaceada_LATE_101"]
    assert (zips / "canvas" / "lovelaceada_LATE_101" / page).exists()
    assert "only one by one" in classroom["feedback"].stdout
    assert {p.name for p in zips.glob("*.zip")} >= {"alice.zip", "jdoe.zip", "06758214.zip"}


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_the_grades_of_a_canvas_class_import_as_they_are(classroom) -> None:
    tmp = classroom["tmp"]
    (tmp / "a.csv").write_text("lesson,title,id,points\n01_float_formats,Float formats,4242,\n")
    grader("export", "--course-dir", classroom["course"], "--format", "canvas",
           "--assignments", tmp / "a.csv", "--csv", tmp / "canvas.csv")
    users = {"101": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""},
             "102": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""}}
    matched, new, scores, unknown = canvas_import((tmp / "canvas.csv").read_text(),
                                                  {4242: "Float formats"}, users)
    assert new == [] and unknown == [] and list(matched.values()) == ["Float formats"]
    assert scores == {"101": {"Float formats": FULL}, "102": {"Float formats": 0.0}}
    held = (tmp / "canvas-not-exported.csv").read_text()
    assert "5001" in held and "no identifier from the LMS" in held  # Moodle's: no Canvas id


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_hostile_members_of_lms_zips_cost_only_their_own_student(tmp_path) -> None:
    """Links, traversal, overlong names, AppleDouble junk and escape codes, each built in an
    LMS's pattern: refused or escaped, charged to the student whose name they carry."""
    import stat

    done_nb = LESSON.notebook.read_bytes()
    course = tmp_path / "course"
    grader("release", LESSON.name, "--course-dir", course)
    blank = (course / "release" / LESSON.name / NOTEBOOK).read_bytes()
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as archive:
        archive.writestr(canvas_file_name("Lovelace, Ada", 101, 1, NOTEBOOK), done_nb)
        archive.writestr(f"._{canvas_file_name('Lovelace, Ada', 101, 1, NOTEBOOK)}", b"junk")
        link = zipfile.ZipInfo(canvas_file_name("Evil, Eve", 102, 2, NOTEBOOK))
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
        archive.writestr("../" + canvas_file_name("Out, Side", 103, 3, NOTEBOOK), blank)
        archive.writestr("x" * 240 + "_104_4_" + NOTEBOOK, blank)
        archive.writestr(f"esc\x1b[31mred\u202e_105_5_{NOTEBOOK}", blank)
    run = grader("autograde", LESSON.name, canvas, "--course-dir", course, "--jobs", "2")
    assert "recognised a Canvas download" in run.stdout
    assert "outside the archive" in run.stdout and "\x1b" not in run.stdout + run.stderr
    assert "\u202e" not in run.stdout  # a name Canvas cannot write is ignored, and escaped:
    assert "esc\\x1b[31mred\\u202e" in run.stdout and "not named as a hand-in" in run.stdout
    assert not (tmp_path / canvas_file_name("Out, Side", 103, 3, NOTEBOOK)).exists()
    moodle = tmp_path / "moodle.zip"
    with zipfile.ZipFile(moodle, "w") as archive:
        archive.writestr(f"{moodle_prefix('.Dot Com', 7)}_assignsubmission_file_/{NOTEBOOK}",
                         blank)  # a full name may begin with "."
        link = zipfile.ZipInfo(f"{moodle_prefix('Evil Eve', 8)}_assignsubmission_file_/"
                               f"{NOTEBOOK}")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/shadow")
        archive.writestr("__MACOSX/._x", b"junk")
    grader("autograde", LESSON.name, moodle, "--course-dir", course, "--jobs", "2")
    board = tmp_path / "blackboard.zip"
    with zipfile.ZipFile(board, "w") as archive:
        prefix = "Floats_jdoe_attempt_2025-03-01-10-00-00"
        link = zipfile.ZipInfo(f"{prefix}_{NOTEBOOK}")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
        archive.writestr(f"{prefix}.txt", "Name: Jane\x1b[2J Doe (jdoe)\n")
    grader("autograde", LESSON.name, board, "--course-dir", course)
    scope = tmp_path / "gradescope.zip"
    with zipfile.ZipFile(scope, "w") as archive:
        archive.writestr("submission_metadata.yml", "submission_1:\n  :submitters:\n"
                         "  - :name: \"Mal\\e[2J\"\n    :sid: '=cmd'\n")
        link = zipfile.ZipInfo(f"submission_1/{NOTEBOOK}")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    grader("autograde", LESSON.name, scope, "--course-dir", course)
    grader("export", "--course-dir", course, "--csv", tmp_path / "g.csv")
    grades = read_export(tmp_path / "g.csv")
    assert float(grades[("101", LESSON.name)]["score"]) == FULL
    assert grades[("101", LESSON.name)]["status"] == "graded"  # the AppleDouble copy ignored
    assert grades[("102", LESSON.name)]["status"] == "invalid"
    assert "is a link" in grades[("102", LESSON.name)]["reason"]
    assert "longer than 255 bytes" in grades[("104", LESSON.name)]["reason"]
    assert ("105", LESSON.name) not in grades
    assert grades[("7", LESSON.name)]["status"] == "graded"
    assert grades[("7", LESSON.name)]["name"] == ".Dot Com"
    assert "is a link" in grades[("8", LESSON.name)]["reason"]
    assert not any(s.startswith(("103", "._", "__MACOSX")) for s, _ in grades)
    jane = grades[("jdoe", LESSON.name)]
    assert jane["status"] == "invalid" and "is a link" in jane["reason"]
    assert "\x1b" not in jane["name"] and "Doe" in jane["name"]
    (malicious,) = [r for (s, _), r in grades.items() if s.startswith("gradescope-")]
    assert malicious["status"] == "invalid"  # graded under an id the grader derived, and the
    assert "=cmd" in malicious["lms_id"] and not malicious["lms_id"].startswith("=")  # LMS's


def test_every_layout_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Collecting hand-ins", 1)[1].split("\n### ", 1)[0]
    for layout in LAYOUTS:
        assert f"--from {layout}" in section or f"`{layout}`" in section, layout
    for lms in ("Canvas", "Moodle", "Blackboard", "Gradescope"):
        assert lms in section
