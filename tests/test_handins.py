"""Hand-ins as each LMS delivers them: recognised, one grade per student, grades and feedback
back in the files the LMS's own importers read.

The downloads are built as each LMS's code names them (the source is cited beside each
builder), and the files we write back are read by models of the importers that follow their
source (Canvas ``lib/gradebook_importer.rb``, Moodle ``grade/import/csv/classes/load_data.php``
and ``mod/assign/feedback/file/importziplib.php``).
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.content.lessons import load_lesson
from grader.intake.handins import recognise
from tests.grading_helpers import grader, points, read_export, released_course
from tests.test_export_lms import canvas_import, canvas_reupload, moodle_feedback_import

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


def test_a_late_canvas_hand_in_alone_reads_as_one_user(tmp_path) -> None:
    """Canvas lowercases the name and writes its own "LATE" after it (content_zipper.rb), so
    ``roerick_LATE_103_904_x`` cannot be a user "roerick_LATE": it is user 103, late, and no
    cause for a look."""
    root = tmp_path / "submissions"
    write(root / canvas_file_name("Roe, Rick", 103, 904, NOTEBOOK, late=True))
    write(root / canvas_file_name("Lee, Ann", 105, 906, "01_" + NOTEBOOK, late=True))
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK, "canvas")
    rick, ann = handins
    assert (rick.student_id, rick.late, rick.reasons, rick.name) == ("103", True, [], "roerick")
    assert rick.lms_file_id == "904" and rick.record("canvas")["file_id"] == "904"
    assert (ann.student_id, ann.late, ann.lms_file_id) == ("105", True, "906")
    assert ann.reasons == [f"graded 01_{NOTEBOOK} in place of {NOTEBOOK}"]


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


# ------------------------------------------------------------------ end to end, every layout



def zip_folder(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                handle.write(path, path.relative_to(folder.parent))
    return archive


@pytest.fixture(scope="module")
def classroom(tmp_path_factory, shared_tmp):
    """One course; a class of two in each LMS's download (one finished notebook, one
    untouched), graded as it came, one command per download."""
    tmp = tmp_path_factory.mktemp("classroom")
    course = released_course([LESSON], shared_tmp, tmp / "course")
    done_nb = LESSON.notebook.read_bytes()
    blank = (course / "release" / LESSON.name / NOTEBOOK).read_bytes()
    downloads = tmp / "downloads"
    canvas = downloads / "canvas" / "submissions"
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 901, NOTEBOOK, late=True), blank)
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 905,
                                    NOTEBOOK.replace(".ipynb", "-1.ipynb"), late=True), done_nb)
    write(canvas / canvas_file_name("Lovelace, Ada", 101, 902, "plot.png"), b"\x89PNG")
    write(canvas / canvas_file_name("Lovelace, Ada", 102, 903, NOTEBOOK), blank)  # same name
    write(canvas / canvas_file_name("Roe, Rick", 103, 904, NOTEBOOK, late=True), done_nb)  # alone
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
    # Canvas's and Moodle's ids are no id a student knows: the course roster maps them to the
    # ids the students worked under (their logins, their e-mails), as the instructor gives it.
    (tmp / "gradebook.csv").write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section\n    Points Possible,,,,\n"
        "\"Lovelace, Ada\",101,S101,ada,A\n\"Lovelace, Ada\",102,S102,ada2,A\n"
        "\"Roe, Rick\",103,S103,rick,A\n")
    (tmp / "worksheet.csv").write_text(
        "Identifier,Full name,Email address,Status,Grade,Maximum Grade\n"
        "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted,,50.00\n"
        "Participant 5002,Jean Dupont,jean@uni.fr,Submitted,,50.00\n", encoding="utf-8")
    grader("roster", tmp / "gradebook.csv", "--course-dir", course)
    grader("roster", tmp / "worksheet.csv", "--lesson", LESSON.name, "--course-dir", course)
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
    "canvas": {"101": (FULL, True), "102": (0.0, False), "103": (FULL, True)},
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
    # the roster's names, not the download's squashed ones ("lovelaceada")
    assert "101 (Lovelace, Ada, LATE): graded" in canvas and "the latest of 2" in canvas
    assert "103 (Roe, Rick, LATE): graded" in canvas and "reads as" not in canvas
    assert classroom["grades"][("101", LESSON.name)]["name"] == "Lovelace, Ada"
    assert "plot.png" in canvas
    grades = classroom["grades"]
    assert grades[("5001", LESSON.name)]["name"] == "Adélaïde Lovelace"
    assert grades[("jdoe", LESSON.name)]["name"] == "Jane Doe"
    assert "marked late by the LMS: 2" in classroom["report"].stdout
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
    assert canvas_reupload(zips / "canvas-reupload.zip", {  # each user's submitted files
        "101": ["901", "902", "905"], "102": ["903"], "103": ["904"]}) == {
        "101": [f"lovelaceada_LATE_101_905_{page}"], "102": [f"lovelaceada_102_903_{page}"],
        "103": [f"roerick_LATE_103_904_{page}"]}
    assert "Re-Upload Submissions" in classroom["feedback"].stdout
    assert {p.name for p in zips.glob("*.zip")} >= {"alice.zip", "jdoe.zip", "06758214.zip"}


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_the_grades_of_a_canvas_class_import_as_they_are(classroom) -> None:
    tmp = classroom["tmp"]
    (tmp / "a.csv").write_text("lesson,title,id,points\n01_float_formats,Float formats,4242,\n")
    grader("export", "--course-dir", classroom["course"], "--format", "canvas",
           "--assignments", tmp / "a.csv", "--csv", tmp / "canvas.csv")
    users = {"101": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""},
             "102": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""},
             "103": {"name": "Roe, Rick", "sis_user_id": "", "sis_login_id": ""},
             "104": {"name": "Excused, Eve", "sis_user_id": "", "sis_login_id": ""}}
    written = (tmp / "canvas-01_float_formats.csv").read_text()  # a file per lesson, always
    matched, new, scores, unknown = canvas_import(written,
                                                  {4242: "Float formats"}, users,
                                                  {"104": {"Float formats": "EX"}})
    assert new == [] and unknown == [] and list(matched.values()) == ["Float formats"]
    assert scores == {"101": {"Float formats": FULL}, "102": {"Float formats": 0.0},
                      "103": {"Float formats": FULL},  # LATE_ alone: one user, not flagged
                      "104": {"Float formats": "EX"}}  # not in the download: untouched
    held = (tmp / "canvas-not-exported.csv").read_text()
    assert "5001" in held and "no identifier from the LMS" in held  # Moodle's: no Canvas id


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_the_grades_of_a_moodle_class_go_back_in_its_own_worksheet(classroom) -> None:
    from tests.test_export_lms import moodle_worksheet_import

    tmp, course = classroom["tmp"], classroom["course"]
    none = grader("export", "--course-dir", course, "--format", "moodle", check=False)
    assert none.returncode == 2 and "grading worksheet" in none.stderr  # says why, fails
    (tmp / "worksheet.csv").write_text(
        "Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be changed,"
        "Last modified (submission),Last modified (grade),Feedback comments\n"
        "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted,,50.00,Yes,-,-,\n"
        "Participant 5002,Jean Dupont,jean@uni.fr,Submitted,,50.00,Yes,-,-,\n")
    grader("export", "--course-dir", course, "--format", "moodle-worksheet", "--roster",
           tmp / "worksheet.csv", "--lesson", LESSON.name, "--csv", tmp / "filled.csv")
    grades, feedback = moodle_worksheet_import((tmp / "filled.csv").read_text(),
                                               {"5001": "ada", "5002": "jean"}, {}, 50.0, 0.0)
    assert grades == {"ada": 50.0, "jean": 0.0} and feedback == []


@pytest.mark.slow
@pytest.mark.xdist_group("handins")
def test_hostile_members_of_lms_zips_cost_only_their_own_student(tmp_path, shared_tmp) -> None:
    """Links, traversal, overlong names, AppleDouble junk and escape codes, each built in an
    LMS's pattern: refused or escaped, charged to the student whose name they carry."""
    import stat

    done_nb = LESSON.notebook.read_bytes()
    course = released_course([LESSON], shared_tmp, tmp_path / "course")
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
    (tmp_path / "gradebook.csv").write_text(  # Canvas's ids mapped to the students' own
        "Student,ID,SIS User ID,SIS Login ID,Section\n"
        + "".join(f"S{n},{n},,s{n},A\n" for n in range(101, 106)))
    (tmp_path / "worksheet.csv").write_text(
        "Identifier,Full name,Email address\nParticipant 7,.Dot Com,dot@uni.fr\n"
        "Participant 8,Eve,eve@uni.fr\n")
    grader("roster", tmp_path / "gradebook.csv", "--course-dir", course)
    grader("roster", tmp_path / "worksheet.csv", "--lesson", LESSON.name, "--course-dir", course)
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
