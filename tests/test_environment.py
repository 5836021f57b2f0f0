"""The two ways to install the course declare the same dependencies, and each make target
builds what it needs."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch", "redis_py": "redis"}  # conda-forge name -> PyPI name


def split_requirement(text: str) -> tuple[str, str]:
    """Name and version range; extras (``psycopg[binary]``), environment markers (``; ...``:
    conda would list such a package for every Python) and comments are left out."""
    text = text.split("#", 1)[0].split(";", 1)[0]
    name, _, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", text).groups()
    return name.lower().replace("-", "_"), spec.replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    listed = project["dependencies"] + extras["grade"] + extras["dev"]
    return dict(split_requirement(r) for r in listed)


def conda_requirements() -> dict[str, str]:
    lines = (REPO / "environment.yml").read_text().split("dependencies:", 1)[1].splitlines()
    entries = [line.strip()[2:] for line in lines if line.strip().startswith("- ")]
    pairs = (split_requirement(e) for e in entries)
    return {CONDA_NAMES.get(n, n): s for n, s in pairs if n not in ("python", "pip")}


def test_environment_yml_and_pyproject_declare_the_same_dependencies() -> None:
    assert conda_requirements() == pyproject_requirements()


def test_python_versions_agree() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    conda = (REPO / "environment.yml").read_text()
    assert f"python{project['requires-python']}" in conda.replace(" ", "")


def test_readme_names_the_pythons_that_are_checked() -> None:
    """The README's range runs from requires-python's floor to the newest Python that
    benchmarks/python_versions.py sets up and tests (run it after changing either)."""
    floor = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    script = (REPO / "benchmarks" / "python_versions.py").read_text()
    newest = re.search(r"^NEWEST = \((\d+), (\d+)\)", script, re.M).groups()
    readme = " ".join((REPO / "README.md").read_text().split())  # the sentence may wrap
    assert f"Python {floor.removeprefix('>=')} to {'.'.join(newest)}" in readme


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_each_make_target_installs_only_what_its_user_needs() -> None:
    """A student's ``make lab`` installs pyproject.toml's dependencies alone: no grading
    servers' packages, no test tools, nothing from apt (issue 47: a first lab in 90 seconds);
    an instructor's ``make setup`` adds the ``grade`` group and bubblewrap; ``make test`` adds
    the ``dev`` group, chromium, PostgreSQL and Redis, and alone builds the JupyterHub test's
    environment (.venv/hub/ as root, npm's proxy), which costs minutes. ``-W pyproject.toml``:
    as though pyproject.toml had changed, so that every recipe a fresh clone would run is
    printed. (That the lab runs with nothing of those groups importable: tests/test_lab.py.)"""
    def planned(target: str) -> str:
        return subprocess.run(["make", "-n", "-W", "pyproject.toml", target], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout

    for target in ("lab", "lab-smoke", "demo"):
        recipe = planned(target)
        assert "pip install --quiet -e .\n" in recipe, recipe
        assert "[grade" not in recipe and "[dev" not in recipe and "apt-get" not in recipe, recipe
    setup = planned("setup")
    assert "-e '.[grade]'" in setup and "bubblewrap" in setup and "[dev" not in setup, setup
    for recipe in (setup, planned("lab")):
        assert ".venv/hub" not in recipe and "configurable-http-proxy" not in recipe, recipe
    recipe = planned("test")
    assert "-e '.[grade,dev]'" in recipe and "postgresql redis-server" in recipe, recipe
    assert ".venv/hub" in recipe and "configurable-http-proxy" in recipe and "pytest" in recipe
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    student = {split_requirement(r)[0] for r in groups["dependencies"]}
    assert not student & {"celery", "redis", "psycopg", "nh3", "pytest", "hypothesis",
                          "playwright", "jupyterhub"}, student
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "make setup" in readme  # as docs/instructor.md names it
