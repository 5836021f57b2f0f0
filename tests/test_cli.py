"""The command line: every command honours --course-dir wherever it stands."""

from __future__ import annotations

import pytest

from grader.cli import build_parser, main
from tests.grading_helpers import grader

# One valid argument list per command (what follows the command's name).
COMMANDS = {
    "sync": ["--check"], "release": ["01_float_formats"], "collect": ["01_float_formats"],
    "autograde": ["01_float_formats", "submissions"], "feedback": ["01_float_formats"],
    "export": [], "report": ["01_float_formats"], "review": ["01_float_formats"],
    "similarity": ["01_float_formats"], "deadlines": ["--check"],
    "lab": ["--smoke"], "variants": ["s001"], "roster": ["roster.csv"],
    "demo": ["01_float_formats"], "progress": [],
    "worker": ["--broker", "redis://x:1/0", "--queue-key", "queue.key"],
    "withdraw": ["01_float_formats", "s1", "--reason", "graded as the wrong lesson"],
}


def parsed(argv: list[str], option: str = "course_dir") -> str | None:
    args = build_parser().parse_args(argv)
    before, after = getattr(args, f"{option}_before"), getattr(args, option)
    return after if after is not None else before


def test_every_command_is_listed_here() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(commands) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_course_dir_and_db_url_are_honoured_before_and_after_the_command(command: str) -> None:
    rest = COMMANDS[command]
    for flag, option in (("--course-dir", "course_dir"), ("--db-url", "db_url"),
                         ("--deadlines", "deadlines")):
        assert parsed([flag, "A", command, *rest], option) == "A"
        assert parsed([command, flag, "B", *rest], option) == "B"
        assert parsed([command, *rest], option) is None


def test_two_different_course_dirs_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--course-dir", "A", "export", "--course-dir", "B"])
    assert stopped.value.code == 2
    assert "--course-dir is given twice" in capsys.readouterr().err


@pytest.mark.slow
def test_release_with_the_option_first_writes_to_that_course(tmp_path) -> None:
    grader("--course-dir", tmp_path / "mine", "release", "01_float_formats")
    assert (tmp_path / "mine" / "release" / "01_float_formats" / "float_formats.ipynb").exists()
    assert (tmp_path / "mine" / "gradebook.db").exists()
