"""The guides say what the code does: every command they show exists with the options it uses,
and every link they make resolves.

The guides are README.md, docs/*.md and deploy/hub/README.md. Each command in a fenced
``bash``, ``sh`` or ``console`` block is

- (a) a ``python -m grader ...`` command (any ``.../python -m grader``): parsed by the grader's
  own argparse parser, with placeholders (LESSON, SUBMISSIONS, FILE, N, ...) replaced by real
  values and ``[optional]`` parts included, and every lesson it names a lesson of the course;
  or a ``make ...`` command: its targets and variables are the Makefile's, ``make -n`` accepts
  it, and each grader command its recipe would run is parsed as above;
- (b) named in END_TO_END with the test that runs it end to end (that test must exist); or
- in a block marked ``<!-- not run: why -->`` on the line before its fence (grader and make
  commands in such a block are still checked as in (a)).

A command that is none of these fails the test. Inline mentions in the prose
(```autograde --resume```, ```make lab TORCH=...```) are checked too: the grader command and
each option named exist, and a ``make`` target exists. Nothing is run: the whole file takes a
second or two.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GUIDES = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "hub" / "README.md"]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")

# What the placeholders in the guides' commands stand for, when a command is parsed.
PLACEHOLDERS = {
    "LESSON": "01_float_formats", "SUBMISSIONS": "submissions.zip", "FILE": "file.csv",
    "N": "2", "S": "60", "GIB": "4", "STUDENT": "s017", "DIR": "/srv/nbgrader/exchange",
    "ID": "counting-the-cost", "TEXT": "in place of", "EXERCISE": "decode", "POINTS": "1",
    "HOST": "localhost", "USER": "grader", "DB": "course", "NAME": "prof_x",
}
PLACEHOLDER = re.compile(r"\b(" + "|".join(PLACEHOLDERS) + r")\b")

# (b): commands a test runs end to end (the command itself, or the functions behind it on the
# same kind of input), as the guides write them with `python -m grader` written `grader`, and
# that test. Each entry must match a command the guides show and name a test that exists. The
# first pattern a command matches names its test.
END_TO_END = [
    (r"^grader (worker|autograde .* --broker)",
     "tests/test_distributed.py",
     "test_workers_grade_a_class_and_a_worker_killed_mid_batch_loses_nothing"),
    (r"^make test$",
     "tests/test_environment.py",
     "test_ci_runs_the_readme_test_command"),
    (r"^make lab$",
     "tests/test_lab.py",
     "test_lab_smoke_lists_every_lesson_and_keeps_the_students_work"),
    (r"^grader progress",
     "tests/test_lab.py",
     "test_progress_lists_each_exercise_of_the_students_copies"),
    (r"^grader lab --reset",
     "tests/test_lab.py",
     "test_a_newer_course_version_is_announced_only_when_there_is_one"),
    (r"^(make demo|grader demo)",
     "tests/test_lab.py",
     "test_each_demo_serves_its_lesson_alone_in_a_workspace_of_its_own"),
    (r"^grader release \S+$",
     "tests/test_grading.py",
     "test_student_version_has_no_solutions_and_no_hidden_tests"),
    (r"^grader autograde \S+ SUBMISSIONS --resume",
     "tests/test_term_state.py",
     "test_every_grade_says_which_checks_made_it_and_resume_grades_again_the_others"),
    (r"^grader autograde \S+ SUBMISSIONS",
     "tests/test_grading.py",
     "test_autograde_reports_every_submission"),
    (r"^grader report",
     "tests/test_review.py",
     "test_report_gives_each_exercise_its_distribution_and_most_failed_check"),
    (r"^grader feedback \S+$",
     "tests/test_grading.py",
     "test_feedback_pages_show_scores_and_no_hidden_check"),
    (r"^grader export .*--dry-run",
     "tests/test_export_lms.py",
     "test_a_dry_run_shows_each_grade_the_lms_would_change_and_writes_nothing"),
    (r"^grader withdraw",
     "tests/test_term_state.py",
     "test_withdraw_removes_a_batchs_grades_and_logs_why"),
    (r"^grader export --csv",
     "tests/test_review.py",
     "test_the_csv_export_has_a_column_per_exercise_that_adds_up_to_the_score"),
    (r"^grader export --per-exercise",
     "tests/test_review.py",
     "test_per_exercise_export_is_one_row_per_student_and_exercise"),
    (r"^grader review \S+$",
     "tests/test_review.py",
     "test_review_lists_the_flagged_submissions_with_their_reasons"),
    (r"^grader review \S+ s017( --regrade)?$",
     "tests/test_review.py",
     "test_decisions_survive_autograde_and_go_only_when_discarded"),
    (r"^grader review \S+ s017 --(accept|total|clear-total)\b",
     "tests/test_review.py",
     "test_accepting_settles_a_flag_and_a_lesson_score_replaces_the_sum"),
    (r"^grader review \S+ s017 --set",
     "tests/test_review.py",
     "test_a_score_set_in_review_is_logged_exported_reported_and_shown_inert"),
    (r"^grader review \S+ s017 --note",
     "tests/test_feedback.py",
     "test_a_note_alone_or_an_accept_with_a_note_shows_on_the_students_page"),
    (r"^grader review \S+ --accept-all",
     "tests/test_review.py",
     "test_accept_all_settles_only_the_flags_whose_every_reason_is_the_expected_one"),
    (r"^grader deadlines --check",
     "tests/test_deadlines.py",
     "test_extensions_name_students_by_id_lms_id_email_or_name_and_mistakes_are_warned"),
    (r"^grader similarity",
     "tests/test_similarity.py",
     "test_a_renamed_copy_is_listed_and_honest_work_is_not"),
    (r"^grader autograde \S+ \S*submissions\.zip",
     "tests/test_handins.py",
     "test_each_download_is_recognised_and_every_student_graded_once"),
    (r"^grader autograde \S+ \S+ --times",
     "tests/test_deadlines.py",
     "test_a_zips_member_times_never_count_and_moodles_worksheet_gives_the_times"),
    (r"^grader feedback \S+ --zip",
     "tests/test_handins.py",
     "test_feedback_goes_back_as_each_lms_takes_it"),
    (r"^grader export --format canvas",
     "tests/test_handins.py",
     "test_the_grades_of_a_canvas_class_import_as_they_are"),
    (r"^grader export --format moodle-worksheet",
     "tests/test_handins.py",
     "test_the_grades_of_a_moodle_class_go_back_in_its_own_worksheet"),
    (r"^grader export --format moodle --roster",
     "tests/test_export_lms.py",
     "test_moodle_worksheets_of_two_lessons_make_one_row_per_person_in_a_file_per_lesson"),
    (r"^grader (release \S+ --exchange|collect|autograde \S+ --collected|feedback \S+ --exchange)",
     "tests/test_exchange.py",
     "test_publish_fetch_submit_collect_grade_and_fetch_feedback"),
    (r"^grader sync",
     "tests/test_notebooks.py",
     "test_notebook_is_in_step_with_solutions_cases_and_data"),
]

# Paths the guides name, in inline code or in links, that are being moved (issue 35: grader
# modules into packages): not checked until the guides name the new paths; then drop the entry.
MOVING: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    where: str  # file:line, for messages
    block: str  # file:line of its block's fence
    text: str  # as written: one line, continuations joined, comment dropped
    argv: tuple[str, ...]  # shell words, variables of the block expanded
    not_run: str | None  # the reason its block gives, if it is marked


def guide_name(path: Path) -> str:
    return str(path.relative_to(REPO))


@cache
def fenced_blocks(path: Path) -> tuple[tuple[int, str, tuple[str, ...], str | None], ...]:
    """(first line number, info string, lines, not-run reason) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, marker, info = opened.groups()
        end = i + 1
        closing = re.compile(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$")
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        reason = NOT_RUN.match(before)
        blocks.append((i + 1, info.lower(), tuple(line.removeprefix(indent)
                                                  for line in lines[i + 1:end]),
                       reason[1] if reason else None))
        i = end + 1
    return tuple(blocks)


def outside_fences(path: Path) -> str:
    """The file's text with every fenced block blanked out (its lines kept, for numbering)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for start, _info, body, _reason in fenced_blocks(path):
        for n in range(start - 1, start + len(body) + 1):
            if n < len(lines):
                lines[n] = ""
    return "\n".join(lines)


def shell_lines(info: str, body: tuple[str, ...]) -> list[tuple[int, str]]:
    """(offset in the block, command line) of each command: continuations joined; in a console
    block only the lines after a ``$`` prompt."""
    found, pending, first = [], "", 0
    for offset, line in enumerate(body):
        if info == "console" and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        if not pending:
            first = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        found.append((first, pending + line))
        pending = ""
    return found


def commands() -> list[Command]:
    """Every command in the guides' shell blocks, in order."""
    found = []
    for path in GUIDES:
        for start, info, body, reason in fenced_blocks(path):
            if info not in SHELL_BLOCKS:
                continue
            variables: dict[str, str] = {}
            for offset, line in shell_lines(info, body):
                words = shlex.split(line, comments=True)
                if not words:
                    continue
                if len(words) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                    name, value = words[0].split("=", 1)
                    variables[name] = value
                    continue
                expanded = []
                for word in words:
                    if word.startswith("$") and word[1:] in variables:
                        expanded += shlex.split(variables[word[1:]])
                    else:
                        expanded.append(word)
                while expanded and re.fullmatch(r"[A-Za-z_]\w*=.*", expanded[0]):
                    expanded.pop(0)  # an environment variable for this command alone
                text = " ".join(shlex.quote(w) if " " in w else w for w in words)
                found.append(Command(f"{guide_name(path)}:{start + 1 + offset}",
                                     f"{guide_name(path)}:{start}", text, tuple(expanded),
                                     reason))
    return found


def grader_argv(argv: tuple[str, ...]) -> list[str] | None:
    """The grader's arguments, where ``argv`` runs ``python -m grader``; else None."""
    if len(argv) >= 3 and re.fullmatch(r"(\S*/)?python3?", argv[0]) and argv[1:3] == ("-m",
                                                                                     "grader"):
        return list(argv[3:])
    return None


def filled(words: list[str]) -> list[str]:
    """The words with placeholders replaced and ``[optional]`` parts included."""
    out = []
    for word in words:
        if word in ("[", "]", "|"):
            continue
        word = word.removeprefix("[").removesuffix("]")
        out.append(PLACEHOLDER.sub(lambda m: PLACEHOLDERS[m[1]], word))
    return out


@cache
def lessons() -> frozenset[str]:
    return frozenset(p.name for p in (REPO / "notebooks").iterdir()
                     if p.is_dir() and re.match(r"\d\d_", p.name))


@cache
def parser() -> argparse.ArgumentParser:
    """The grader's parser, taking no abbreviation: a guide writes each option in full."""
    from grader.cli import build_parser

    built = build_parser()
    built.allow_abbrev = False
    for action in built._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.allow_abbrev = False
    return built


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def parse(words: list[str]) -> str | None:
    """Why the grader's command line refuses ``words``, or None where it accepts them and every
    lesson they name is a lesson of the course."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            args = parser().parse_args(words)
    except SystemExit:
        return said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "refused"
    if args.command is None:
        return "no command"
    named = [getattr(args, "lesson", None), *getattr(args, "lessons", []),
             *getattr(args, "reset", [])]
    unknown = [name for name in named if name is not None and name not in lessons()]
    return f"no such lesson: {', '.join(unknown)}" if unknown else None


@cache
def makefile() -> tuple[frozenset[str], frozenset[str]]:
    """The Makefile's targets, and the variables its recipes read."""
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", text))
    return frozenset(targets), frozenset(variables)


def check_make(words: list[str], dry_run: bool = True) -> str | None:
    """Why ``make words`` is wrong, or None: targets and variables exist, ``make -n`` takes
    it, and the grader commands its recipes would run parse."""
    targets, variables = makefile()
    for word in words:
        if "=" in word:
            if word.split("=", 1)[0] not in variables:
                return f"the Makefile reads no variable {word.split('=', 1)[0]}"
        elif word not in targets:
            return f"the Makefile has no target {word}"
    if not dry_run:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    words = [w.split("=", 1)[0] + "=" + filled([w.split("=", 1)[1]])[0] if "=" in w else w
             for w in words]
    done = subprocess.run(["make", "-n", *words], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=30)
    if done.returncode:
        return f"make -n: {done.stderr.strip()}"
    for line in done.stdout.splitlines():
        if "-m grader" in line:
            inner = shlex.split(line.split("-m grader", 1)[1])
            why = parse(inner)
            if why:
                return f"its recipe runs grader {' '.join(inner)}: {why}"
    return None


def normalised(command: Command) -> str:
    """The command as END_TO_END's patterns read it: `python -m grader` written `grader`."""
    words = grader_argv(command.argv)
    return " ".join(["grader", *words] if words is not None else command.argv)


def end_to_end(command: Command) -> str | None:
    text = normalised(command)
    return next((f"{file}::{test}" for pattern, file, test in END_TO_END
                 if re.search(pattern, text)), None)


def check(command: Command) -> str | None:
    """Why the command is not covered, or None."""
    words = grader_argv(command.argv)
    if words is not None:
        return parse(filled(words))
    if command.argv[0] == "make":
        return check_make(list(command.argv[1:]))
    if command.not_run or end_to_end(command):
        return None
    return ("neither a grader nor a make command, nor run by a test named in END_TO_END: "
            "mark its block <!-- not run: why --> on the line before the fence")


# ------------------------------------------------------------------ commands


def test_the_guides_show_commands_and_each_is_covered() -> None:
    found = commands()
    assert len([c for c in found if grader_argv(c.argv) is not None]) > 40, found
    wrong = [f"{c.where}: {c.text}\n    {why}" for c in found if (why := check(c))]
    assert not wrong, "\n".join(wrong)


def test_every_not_run_block_says_why_and_holds_a_command_that_needs_it() -> None:
    for path in GUIDES:
        lines = path.read_text(encoding="utf-8").splitlines()
        marks = [n for n, line in enumerate(lines, 1)
                 if line.lstrip().startswith("<!--") and "not run" in line]
        starts = {start for start, _, _, reason in fenced_blocks(path) if reason}
        for n in marks:
            assert NOT_RUN.match(lines[n - 1]), \
                f"{guide_name(path)}:{n}: write <!-- not run: why -->"
            following = next(m for m in range(n + 1, len(lines) + 1) if lines[m - 1].strip())
            assert following in starts, f"{guide_name(path)}:{n}: the mark stands before no fence"
    marked: dict[str, list[Command]] = {}
    for command in commands():
        if command.not_run:
            marked.setdefault(command.block, []).append(command)
    for block, held in marked.items():
        assert any(grader_argv(c.argv) is None and c.argv[0] != "make" for c in held), \
            f"{block}: every command of this block is checked: drop its not-run mark"


def test_every_end_to_end_entry_names_an_existing_test_and_a_shown_command() -> None:
    shown = [normalised(c) for c in commands()]
    for pattern, file, test in END_TO_END:
        source = (REPO / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(test)}\(", source, re.M), f"no test {file}::{test}"
        assert any(re.search(pattern, text) for text in shown), f"{pattern} matches no command"


def test_the_check_catches_a_wrong_command() -> None:
    assert parse(filled(["autograde", "LESSON", "SUBMISSIONS", "--jobs", "N"])) is None
    assert parse(["autograde", "01_float_formats", "x.zip", "--job", "2"]) is not None
    assert parse(["review", "01_float_format"]) == "no such lesson: 01_float_format"
    assert parse(["export", "--format", "blackboard"]) is not None
    assert check_make(["lab"], dry_run=False) is None
    assert check_make(["labs"], dry_run=False) is not None
    assert check_make(["demo", "LESSONS=x"], dry_run=False) is not None


# ------------------------------------------------------------------ prose


def inline_code(path: Path) -> list[tuple[int, str]]:
    """(line, text with its whitespace collapsed) of each inline code span outside fences."""
    text = outside_fences(path)
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m[1].split()))
            for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text)]


def test_commands_and_options_named_in_the_prose_exist() -> None:
    by_name = subparsers()
    every_option = {o for p in [parser(), *by_name.values()] for a in p._actions
                    for o in a.option_strings}
    wrong = []
    for path in GUIDES:
        for line, span in inline_code(path):
            where = f"{guide_name(path)}:{line}: `{span}`"
            words = span.split()
            rest = grader_argv(tuple(words))
            if words[0] == "make":
                if len(words) > 1 and words[1] != "...":
                    wrong.append(f"{where}: {why}") if (why := check_make(words[1:], False)) \
                        else None
                continue
            if rest is not None:
                words = rest
                if not words or words[0] == "...":
                    continue
                if words[0] not in by_name:
                    wrong.append(f"{where}: the grader has no command {words[0]}")
                    continue
            named = [w.split("=", 1)[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)]
            if words[0] in by_name:
                mine = {o for a in by_name[words[0]]._actions for o in a.option_strings}
                wrong += [f"{where}: {words[0]} has no option {o}" for o in named if o not in mine]
            else:
                wrong += [f"{where}: the grader has no option {o}" for o in named
                          if o not in every_option]
    assert not wrong, "\n".join(wrong)


def test_every_layout_and_lms_is_documented_where_hand_ins_are() -> None:
    text = (REPO / "docs" / "lms.md").read_text(encoding="utf-8")
    section = text.split("## Collecting hand-ins", 1)[1].split("\n## ", 1)[0]
    (layout,) = [a for a in subparsers()["autograde"]._actions if a.dest == "layout"]
    for name in layout.choices:
        assert f"--from {name}" in section or f"`{name}`" in section, name
    for lms in ("Canvas", "Moodle", "Blackboard", "Gradescope"):
        assert f"\n## {lms}" in text, lms


def test_every_path_the_guides_name_exists() -> None:
    tops = ("notebooks/", "solutions/", "tests/", "benchmarks/", "data/", "grader/", "deploy/",
            "docs/")
    wrong = []
    for path in GUIDES:
        for line, span in inline_code(path):
            if (span.startswith(tops) and not span.startswith(MOVING)
                    and re.fullmatch(r"[\w./-]+", span) and not re.search(r"[A-Z]{3,}", span)
                    and not (REPO / span).exists()):
                wrong.append(f"{guide_name(path)}:{line}: `{span}` does not exist")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*_~]|<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in outside_fences(path).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading[1])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    text = outside_fences(path)
    return [(text.count("\n", 0, m.start()) + 1, m[1])
            for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]


def test_every_relative_link_resolves() -> None:
    wrong = []
    for path in GUIDES:
        for line, target in links(path):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            where = f"{guide_name(path)}:{line}: ({target})"
            if os.path.relpath(resolved, REPO).startswith(MOVING):
                continue
            if not resolved.exists():
                wrong.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                wrong.append(f"{where}: no heading #{anchor} in {resolved.name}")
    assert not wrong, "\n".join(wrong)


def test_every_guide_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for _, target in links(README) if not re.match(r"[a-z][a-z0-9+.-]*:", target)}
    missing = [guide_name(p) for p in GUIDES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md links to none of {missing}"


def test_the_readme_stays_short_and_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    shown = {c.text for c in commands() if c.where.startswith("README.md:")}
    assert {"make lab", "make test"} <= shown


@pytest.mark.parametrize("heading, anchor", [
    ("How a submission is graded, and why a student cannot fool it",
     "how-a-submission-is-graded-and-why-a-student-cannot-fool-it"),
    ("The instructor's commands", "the-instructors-commands"),
    ("Set up and start (one machine, as root)", "set-up-and-start-one-machine-as-root"),
    ("What `export` shows", "what-export-shows"),
])
def test_anchors_are_made_as_github_makes_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_the_workers_service_starts_a_command_the_worker_takes() -> None:
    """deploy/worker/ctc-grader-worker.service: its ExecStart is ``python -m grader worker``
    with options the grader's own parser takes (the broker from its environment file), it
    restarts the worker whenever it exits, and it starts after the network."""
    import configparser
    import shlex

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(REPO / "deploy" / "worker" / "ctc-grader-worker.service")
    words = shlex.split(unit["Service"]["ExecStart"])
    assert words[0].endswith("/.venv/bin/python") and words[1:4] == ["-m", "grader", "worker"]
    args = parser().parse_args([w.replace("${CTC_BROKER}", "redis://:pw@10.0.0.5:6379/0")
                                for w in words[3:]])
    assert args.command == "worker" and args.broker == "redis://:pw@10.0.0.5:6379/0"
    assert str(args.queue_key) == "/etc/ctc-grader/queue.key"
    assert unit["Service"]["Restart"] == "always" and "EnvironmentFile" in unit["Service"]
    assert "network-online.target" in unit["Unit"]["After"]
