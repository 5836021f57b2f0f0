"""Grades and feedback back into an LMS, in the files its own importers read.

What each importer does with a file decides what is written (the sources are cited; the tests
read our files with models of them):

- Canvas, Grades > Import (``lib/gradebook_importer.rb``): columns ``Student, ID, SIS User ID,
  SIS Login ID, Section``, then an assignment column headed ``Title (id)`` (matched by that id,
  then by its exact title; any other makes a new assignment), an optional ``Points Possible``
  row, a row per student (matched by ID, SIS User ID, SIS Login ID, then name). A blank cell is
  a change to "no grade": it would remove a score or an excusal entered by hand.
- Moodle, Grades > Import > CSV file (``grade/import/csv``): one identifier column mapped to a
  user field (``Username``, ``Email address`` or ``ID number``), a column per grade item. An
  unknown user aborts the whole import; a blank grade is imported as "no grade", erasing one.
- Moodle's assignment, "Upload grading worksheet" (``mod/assign/feedback/offline``,
  ``process_import_grades``): the worksheet Moodle gave (``Identifier`` "Participant N",
  ``Grade``, ``Maximum Grade``, ``Last modified (grade)``, which must all be there). A row's
  grade is skipped when blank, unchanged, above the maximum, or when the grade in Moodle
  changed after the worksheet was downloaded; its feedback columns are imported too, so we
  leave them out.
- Canvas, the assignment's "Re-Upload Submissions" (``Assignment#generate_comments_from_files``
  and ``infer_comment_context_from_filename``): a zip of files named as "Download Submissions"
  named them; the first two all-digit parts of a name (split at "_") are the user id and the
  id of one of that user's submitted files, and each file becomes a comment on the student's
  submission, "See attached file", shown under the name of the file it answers.

So: a file per lesson, and only rows and cells with a score: a student with nothing to write
is left out (and listed in ``NAME-not-exported.csv``), never written blank. Only identifiers
the LMS gave are written, exactly; one a spreadsheet would run as a formula is listed instead.
"""

from __future__ import annotations

import csv
import re
import zipfile
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.files import written
from grader.common.text import FORMULA_START, display, inert, student_cell
from grader.intake import worksheet
from grader.intake.rosters import Assignment
from grader.outputs.tables import Tables

MOODLE_IDS = {"username": "Username", "email": "Email address", "id_number": "ID number"}
WORKSHEET_NEEDS = ("Identifier", "Grade", "Maximum Grade", "Last modified (grade)")
# The worksheet's columns Moodle writes itself, copied as they are; the others (names, e-mail)
# are shown quoted where a spreadsheet would run them.
WORKSHEET_MOODLE = {"Identifier", "Status", "Grade", "Maximum Grade", "Grade can be changed",
                    "Last modified (submission)", "Last modified (grade)"}


def points_text(value: float) -> str:
    """A score as the LMS reads it: at most two decimals, no trailing zeros."""
    return f"{round(value, 2):.2f}".rstrip("0").rstrip(".")


def unsafe_identifier(value: str) -> str:
    """Why an identifier cannot be written as it is, or ''."""
    if value.startswith(FORMULA_START):
        return f"its identifier {inert(value, 60)!r} would be read as a formula"
    if inert(value, 1000) != value:
        return "its identifier holds control characters"
    return ""


def lesson_file(path: Path, lesson: str) -> Path:
    """Where one lesson's import file goes: ``<stem>-<lesson><suffix>`` beside ``path``,
    however many lessons have grades (a name that changed once a second lesson was graded
    would leave the first file behind, stale)."""
    return path.with_name(f"{path.stem}-{lesson}{path.suffix}")


def _held_file(path: Path, held: list[list[str]], tables: Tables | None = None) -> Path:
    target = path.with_name(f"{path.stem}-not-exported.csv")
    (tables or Tables(print)).side_file(target, [
        ["student_id", "name", "lesson", "status", "why"],
        *([student_cell(row[0]), *(display(v) for v in row[1:])] for row in held)],
        quoting=csv.QUOTE_NONNUMERIC)
    return target


def _held_summary(held: list[list[str]], where: Path, include_flagged: bool) -> str:
    kinds: dict[str, int] = {}
    for row in held:
        kinds[row[3]] = kinds.get(row[3], 0) + 1
    return (f"left out: {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} (listed in "
            f"{where})" + ("" if include_flagged or "needs_review" not in kinds else
                           "; --include-flagged writes the computed scores of needs_review "
                           "submissions"))


def points_out_of(lessons: list[str], rows: list[dict], roster: dict[str, dict[str, str]],
                  assignments: dict[str, Assignment]) -> dict[str, float]:
    """What each lesson's grades are scaled to: the LMS assignment's points, from the
    assignments file or from the Maximum Grade of the Moodle worksheet given as roster (its
    students are the lesson's participants). Two that disagree are refused: one of them is
    wrong, and a grade scaled to it would be too (a worksheet's 100 against a file's 10
    imports a perfect score as 10%)."""
    found: dict[str, float] = {}
    for lesson in lessons:
        maxima = set()
        for row in rows:
            text = roster.get(str(row["student_id"]), {}).get("max_grade", "")
            if row["lesson"] == lesson and text:
                try:
                    maxima.add(float(text.replace(",", ".")))
                except ValueError:
                    continue
        given = assignments[lesson].points if lesson in assignments else None
        if len(maxima) > 1:
            shown = ", ".join(map(points_text, sorted(maxima)))
            raise CourseError(f"the worksheets given with --roster hold {lesson}'s students "
                              f"with different Maximum Grades ({shown}): give the one "
                              "worksheet of the lesson's assignment")
        if maxima and given is not None and abs(next(iter(maxima)) - given) > 1e-9:
            raise CourseError(f"{lesson}: the assignments file says {points_text(given)} points, "
                              f"the Moodle worksheet's Maximum Grade says "
                              f"{points_text(next(iter(maxima)))}: correct the one that is wrong "
                              "(the grades are scaled to it)")
        if given is not None or maxima:
            found[lesson] = given if given is not None else next(iter(maxima))
    return found


def remove_stale(course, path: Path, lesson: str, dry_run: bool, why: str) -> None:
    """Say ``why`` there is no import file of ``lesson``, and remove the one written last time:
    its grades no longer stand (withdrawn, or none left to write), and an LMS must not import
    it again."""
    target = lesson_file(path, lesson)
    if target.is_file() and not target.is_symlink():
        if not dry_run:
            target.unlink()
        why += (f": {'would remove' if dry_run else 'removed'} {target}, written from grades "
                "that no longer stand (clear them in the LMS too: python -m grader withdraw "
                "listed whose)")
    course.log(why)


def write_lms(course, path: Path, kind: str, rows: list[dict], students: list[str],
              lessons: list[str], maxima: dict[str, float], roster: dict[str, dict[str, str]],
              assignments: dict[str, Assignment], include_flagged: bool,
              tables: Tables | None = None) -> int:
    """Canvas's or Moodle's grade import file of each lesson; the number of people written.
    ``tables``: where they go (written whole, or compared for a dry run)."""
    tables = tables or Tables(course.log)
    by_cell = {(str(r["student_id"]), str(r["lesson"])): r for r in rows}
    held: list[list[str]] = []  # student, name, lesson, status, why
    if assignments:
        left_out = [x for x in lessons if x not in assignments]
        if left_out:
            course.log(f"not in the assignments file, so left out: {', '.join(left_out)}")
        unused = sorted(set(assignments) - set(lessons))
        if unused:
            course.log(f"no grades yet for {', '.join(unused)}: not written")
        lessons = [x for x in lessons if x in assignments]
    if not lessons:
        raise CourseError("no lesson to write: none of the graded lessons is in the "
                          "assignments file")
    columns = [assignments[x] if x in assignments else Assignment(x, x) for x in lessons]
    origin = {str(r["student_id"]): r for r in rows if r.get("from")}
    out_of = points_out_of(lessons, rows, roster, assignments)

    def known(student: str) -> dict[str, str]:
        found = dict(roster.get(student, {}))
        came = origin.get(student, {})
        if came.get("from") == "canvas" and not found.get("lms_id") \
                and not student.startswith("anon_"):
            found["lms_id"] = student  # the user id in Canvas's own download
        # Canvas's download names a student by their sortable name squashed ("lovelaceada"):
        # no name to show Canvas, which matches by id and shows its own
        found["name"] = found.get("name") or (came.get("name", "")
                                              if came.get("from") != "canvas" else "")
        found["email"] = found.get("email") or came.get("email", "")
        return found

    def score(student: str, lesson: str, name: str) -> str | None:
        """The cell to write, or None (and the reason kept) where there is nothing to write."""
        row = by_cell.get((student, lesson))
        status = row["status"] if row else "missing"
        if row is None or row["score"] is None or status == "missing":
            held.append([student, name, lesson, "missing", "no submission"])
            return None
        if status == "invalid" or (status != "graded" and not include_flagged):
            held.append([student, name, lesson, status, str(row.get("reason", ""))])
            return None
        value, possible = float(row["score"]), maxima[lesson]
        target = out_of.get(lesson)
        if target is not None and possible > 0:
            value = value / possible * target
        return points_text(value)

    if kind == "canvas":
        id_fields, matched = ("lms_id", "sis_user_id", "sis_login_id"), \
            "ID, SIS User ID or SIS Login ID"
    else:
        counts = {f: sum(bool(known(s).get(f)) for s in students) for f in MOODLE_IDS}
        field = max(MOODLE_IDS, key=lambda f: counts[f])  # ties: the order of MOODLE_IDS
        id_fields, matched = (field,), MOODLE_IDS[field]
    people: dict[tuple[str, ...], list[str]] = {}  # the LMS's identifiers -> our students
    for student in students:
        ids = known(student)
        given = tuple(ids.get(f, "") for f in id_fields)
        problem = next((unsafe_identifier(v) for v in given if unsafe_identifier(v)), "")
        if not any(given) or problem:
            why = problem or (
                "anonymous grading: Canvas's download gives no user id; add it to the roster"
                if student.startswith("anon_") and kind == "canvas"
                else f"no identifier from the LMS ({matched}): add it to the roster")
            # held only where there is a score to write (a Moodle participant of lesson 01 has
            # nothing to write for the Canvas assignment of lesson 02)
            held.extend([student, ids.get("name", ""), x, "not written", why] for x in lessons
                        if by_cell.get((student, x), {}).get("status", "missing") != "missing")
            continue
        people.setdefault(given, []).append(student)
    written: set[tuple[str, ...]] = set()
    files = []
    for column in columns:
        lesson = column.lesson
        if kind == "canvas":
            lines = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                      column.canvas_header]]
            if column.points is not None:  # else Canvas's own points possible stand
                lines.append(["Points Possible", "", "", "", "", points_text(column.points)])
        else:
            lines = [[MOODLE_IDS[id_fields[0]], "Full name", column.title]]
        first = len(lines)
        for given, ours in people.items():
            name = next((known(s)["name"] for s in ours if known(s).get("name")), "")
            having = [s for s in ours if by_cell.get((s, lesson), {}).get("status", "missing")
                      != "missing"]
            if len(having) > 1:  # one person, two hand-ins of one lesson: the instructor decides
                held.extend([s, name, lesson, "not written", "the LMS knows these as one "
                             "student: " + ", ".join(having)] for s in having)
                continue
            cell = score(having[0] if having else ours[0], lesson, name)
            if cell is None:
                continue
            section = display(known(ours[0]).get("section", ""))
            lines.append([display(name or ours[0]), *given, section, cell] if kind == "canvas"
                         else [*given, display(name), cell])
            written.add(given)
        target = lesson_file(path, lesson)
        if len(lines) == first:
            remove_stale(course, path, lesson, tables.dry_run,
                         f"{lesson}: no student has a score to write, so no file")
            continue
        if kind == "canvas":
            tables.write(target, lines, ("ID", "SIS User ID", "SIS Login ID"),
                         (column.canvas_header,), "Student")
        else:
            tables.write(target, lines, (MOODLE_IDS[id_fields[0]],), (column.title,),
                         "Full name")
        files.append((target, len(lines) - first))
    held_path = _held_file(path, held, tables)
    if not files:
        raise CourseError(f"nothing written: no student has both a score and an identifier "
                          f"{'Canvas' if kind == 'canvas' else 'Moodle'} knows. "
                          + _held_summary(held, held_path, include_flagged))
    if tables.dry_run:
        return len(written)
    scaled = [c.lesson for c in columns if out_of.get(c.lesson) is not None]
    course.log(f"wrote {len(written)} student(s) ({kind}), a file per lesson: "
               + ", ".join(f"{target} ({n})" for target, n in files) + "; "
               + (f"scores scaled to the LMS's points for {', '.join(scaled)}, raw points for "
                  "the rest" if scaled else "scores in raw points (give points in the "
                  "assignments file to scale them)"))
    if kind == "moodle":
        course.log(f"in Moodle's import form, map {matched!r} to the user field of that name "
                   "and the lesson's column to its grade item")
    else:
        course.log("in Canvas, Grades > Import each file: Canvas shows every change first")
    if held:
        course.log(_held_summary(held, held_path, include_flagged))
    return len(written)


def _read_worksheet(source: Path) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """Moodle's grading worksheet: its headings, its rows, and each heading by its English
    name."""
    try:
        with source.open(newline="", encoding="utf-8-sig") as handle:
            table = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise CourseError(f"cannot read the grading worksheet {source}: {error}") from None
    header = [c.strip() for c in table[0]] if table else []
    named = worksheet.columns(header)  # English name -> its heading in the worksheet
    missing = [c for c in WORKSHEET_NEEDS if c not in named]
    if missing:
        raise CourseError(f"{source} is not Moodle's grading worksheet as it comes: it lacks "
                          f"{', '.join(missing)} (or their headings in German, French or "
                          "Spanish: download the worksheet again, and give it as it came)")
    return header, table, named


# The comments feedback plugin's column (assignfeedback_comments's pluginname, the heading the
# worksheet gives it and the upload matches, mod/assign/feedback/offline/importgradeslib.php).
# In English; another language's heading is named with --comment-column.
COMMENTS = "Feedback comments"


def write_worksheet_codes(course, source: Path, path: Path, lesson: str,
                          codes: dict[str, str], comment_column: str | None = None) -> int:
    """``variants --worksheet``: Moodle's grading worksheet of ``lesson`` with each mapped
    participant's course id and code in the feedback comment, for the assignment's "Upload
    grading worksheet" (an empty Grade is skipped by that upload; the comment is taken):
    Moodle shows it to the student with their feedback. A participant is mapped by the
    roster (its participant ids for the lesson, else its e-mails), else by an e-mail that is
    a course id of ``codes``. Returns the participants written."""
    from grader.gradebook.identity import read_roster

    header, table, named = _read_worksheet(source)
    column = comment_column or COMMENTS
    if column not in header:
        after = header[header.index(named["Last modified (grade)"]) + 1:]
        raise CourseError(
            f"{source} has no column {column!r} for the feedback comment: turn on 'Feedback "
            "comments' in the assignment's settings and download the worksheet again"
            + (f", or name its heading with --comment-column (the worksheet's feedback columns:"
               f" {', '.join(map(repr, after))})" if after else ""))
    roster = read_roster(course.db_url) if course.has_gradebook() else None
    last = header.index(named.get("Last modified (submission)", named["Maximum Grade"]))
    kept = [i for i, name in enumerate(header)
            if i <= last or name in (named["Last modified (grade)"], column)]
    by_email = {c.casefold(): c for c in codes if "@" in c}
    lines, missing = [[header[i] for i in kept]], []
    for line in table[1:]:
        given = dict(zip(header, line, strict=False))
        participant = worksheet.participant(given.get(named["Identifier"], ""))
        email = given.get(named.get("Email address", ""), "").strip()
        if participant is None:
            continue
        owners: set[str] = set()
        if roster:
            owners = roster.find("moodle", participant, email, lesson)[0] or (
                roster.find("folders", email, email, lesson)[0] if email else set())
        if not owners and email.casefold() in by_email:
            owners = {by_email[email.casefold()]}
        owner = next(iter(owners)) if len(owners) == 1 else None
        if owner not in codes:
            missing.append(f"Participant {participant}")
            continue
        text = (f"Your course id: {owner}. Your code for the course's labs on your own "
                f"machine: {codes[owner]}. Start the lab with: make lab STUDENT={owner} "
                f"CODE={codes[owner]}")
        earlier = given.get(column, "").strip()
        given[column] = earlier if text in earlier else "\n\n".join(filter(None, (earlier, text)))
        lines.append([given.get(header[i], "") if header[i] != column
                      else display(given[column]) for i in kept])
    if len(lines) == 1:
        raise CourseError(f"no participant of {source} is a student of the roster: give the "
                          "roster first (python -m grader roster WORKSHEET --lesson LESSON)")
    Tables(course.log).write(path, lines, (named["Identifier"],), (column,),
                             named.get("Full name", ""))
    course.log(f"wrote the codes of {len(lines) - 1} participant(s) of {lesson} to {path}, "
               "Moodle's grading worksheet with each code in its feedback comment: in the "
               "assignment, View all submissions > Grading action > Upload grading worksheet "
               "(its grades stay blank, so none is changed), then release the feedback")
    if missing:
        course.log(f"{len(missing)} participant(s) not on the roster, left out: "
                   + inert(", ".join(missing), 500))
    return len(lines) - 1


def write_worksheet(course, path: Path, rows: list[dict], rosters: list[Path],
                    include_flagged: bool, tables: Tables | None = None) -> int:
    """The lesson's Moodle grading worksheet, as Moodle gave it, with the grade of each
    participant who has one: for the assignment's own "Upload grading worksheet". Only the
    rows with a grade to write, and only the columns Moodle's importer reads and Moodle wrote
    (its feedback columns would be imported too); scores scaled to the worksheet's ``Maximum
    Grade``. Returns the participants written."""
    lessons = sorted({str(r["lesson"]) for r in rows})
    if len(rosters) != 1 or len(lessons) != 1:
        raise CourseError("--format moodle-worksheet fills in one lesson's grading worksheet: "
                          "give that worksheet (the assignment's View all submissions > "
                          "Download grading worksheet, as it comes) with --roster FILE, once, "
                          "and the lesson with --lesson LESSON"
                          + (f" (graded: {', '.join(lessons)})" if len(lessons) > 1 else ""))
    (lesson,), (source,) = lessons, rosters
    header, table, named = _read_worksheet(source)
    last = header.index(named.get("Last modified (submission)", named["Maximum Grade"]))
    kept = [i for i, name in enumerate(header)
            if i <= last or name == named["Last modified (grade)"]]
    moodle_own = {named[c] for c in WORKSHEET_MOODLE if c in named}
    by_student = {str(r["student_id"]): r for r in rows}
    held: list[list[str]] = []
    lines, seen = [[header[i] for i in kept]], set()
    for line in table[1:]:
        given = dict(zip(header, line, strict=False))
        cells = {english: given.get(heading, "") for english, heading in named.items()}
        student, name = worksheet.participant(cells.get("Identifier", "")), cells.get(
            "Full name", "")
        if student is None:
            continue
        seen.add(student)
        row = by_student.get(student)
        status = row["status"] if row else "missing"
        why = ("no submission graded" if row is None or row["score"] is None
               else "" if status == "graded" or (status == "needs_review" and include_flagged)
               else str(row.get("reason", "")) or status)
        if not why and cells.get("Grade can be changed", "").strip().casefold() in worksheet.NO:
            status, why = "not written", "Moodle locks this grade (Grade can be changed: No)"
        try:
            maximum = float(cells.get("Maximum Grade", "").strip().replace(",", "."))
        except ValueError:
            maximum = float("nan")
        if not why and not maximum > 0:
            status, why = "not written", "the worksheet's Maximum Grade is no number of points " \
                "(a scale): enter it by hand"
        if why:
            held.append([student, name, lesson, status, why])
            continue
        possible = float(row["max_score"])
        given[named["Grade"]] = points_text(float(row["score"]) / possible * maximum
                                            if possible > 0 else 0.0)
        lines.append([given.get(header[i], "") if header[i] in moodle_own
                      else display(given.get(header[i], "")) for i in kept])
    for student in sorted(set(by_student) - seen):
        held.append([student, str(by_student[student].get("name", "")), lesson, "not written",
                     "not in the worksheet (another assignment's participant id?)"])
    tables = tables or Tables(course.log)
    held_path = _held_file(path, held, tables)
    if len(lines) == 1:
        raise CourseError(f"nothing written: no participant of {source} has a grade to write. "
                          + _held_summary(held, held_path, include_flagged))
    tables.write(path, lines, (named["Identifier"],), (named["Grade"],),
                 named.get("Full name", ""))  # the worksheet's own headings
    if tables.dry_run:
        return len(lines) - 1
    course.log(f"wrote {len(lines) - 1} participant(s) of {lesson} to {path}, Moodle's grading "
               "worksheet with its Grade filled in (scaled to its Maximum Grade): in the "
               "assignment, View all submissions > Grading action > Upload grading worksheet")
    if held:
        course.log(_held_summary(held, held_path, include_flagged))
    return len(lines) - 1


def canvas_reupload_zip(target: Path, pages: list[tuple[str, Path, dict]]) -> list[str]:
    """Canvas's "Re-Upload Submissions" zip of the feedback pages: each named
    ``<download name>_<attachment id>_<page>``, as Canvas's re-upload reads a name (the first
    two all-digit parts: the user id, then the id of the file it answers). ``pages``: (student,
    page, hand-in record). Returns why each student left out was (anonymous grading, a text
    submission, a name Canvas would read as another user's)."""
    skipped = []
    with written(target, "wb") as handle, \
            zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for student, page, handin in pages:
            prefix, file_id = str(handin.get("download_name", "")), str(handin.get("file_id", ""))
            name = f"{prefix}_{file_id}_{page.name}"
            digits = [part for part in name.split("_") if re.fullmatch(r"[0-9]+", part)][:2]
            why = ("anonymous grading: Canvas's re-upload finds a student by user id"
                   if student.startswith("anon_")
                   else "no file of theirs was graded (a text or URL submission)"
                   if not file_id.isdigit()
                   else "their download name cannot be a file name"
                   if not _one_component(prefix)
                   else "Canvas would read the name as another user's (a name ending in "
                        "_<digits>)" if digits != [student, file_id] else "")
            if why:
                skipped.append(f"{inert(student, 60)}: {why}")
            else:
                archive.write(page, name)
    return skipped


def _one_component(name: str) -> bool:
    """Whether a name the download gave can name a file here and in a zip."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= 200 and name not in (".", "..") and "/" not in name and "\\" not in name \
        and inert(name, 1000) == name and not name.startswith(".")
