"""Set up the course and run its fast tests under each Python the README names.

    python benchmarks/python_versions.py [--pythons 3.11 3.13] [--torch 'torch==X.Y']
                                         [--skip-missing-torch] [--ref COMMIT] [--keep]

The versions are requires-python's floor (pyproject.toml) up to NEWEST below, the newest CPython
that the Makefile's torch has wheels for; ``--pythons`` names others. For each one the script
looks for an interpreter on this machine: ``python3.X`` on PATH, pyenv's versions
($PYENV_ROOT/versions/3.X.*) and ``uv python find 3.X`` where uv is installed. It never downloads
an interpreter. Under the one it finds it copies the repository into a temporary folder (the
files of the working tree that git tracks or does not ignore; with ``--ref``, that commit as
``git archive`` gives it, as a clean clone has it), creates a fresh ``.venv`` there and installs
as ``make setup`` does (``pip install TORCH``, then ``pip install -e '.[dev]'``), then runs the
fast tests: ``python -m pytest -q -m "not slow" -n 2 -p no:cacheprovider``. It prints, per
Python, where it looked and what it found, the install times and pytest's summary line, and at
the end which of the named versions were not checked and why.

``--torch SPEC`` installs that torch first (default: the Makefile's TORCH). ``--skip-missing-torch``
takes torch only from this machine's disk (``pip install --no-index --no-deps``, which keeps pip's
find-links) and skips a Python for which no such wheel exists, rather than letting pip download
one (for Linux that is a CUDA build of several GB); the skipped versions are listed as not checked.

It also creates a venv under the newest Python below the floor that it finds and checks that pip
refuses to install the course there (``pip install --dry-run --no-deps -e .``), saying so in a
message that names requires-python.

Exit status: 0 when every Python found set up and passed its tests (skipped ones aside) and the
Python below the floor, if found, was refused; 1 otherwise; 2 when the arguments are wrong.
A script for checking the README's claim, not a test: it installs from the network and runs for
minutes per Python.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# torch 2.13.0, the Makefile's TORCH, has wheels on PyPI for CPython 3.10 to 3.14 (cp310-cp314;
# none for 3.15, which torch 2.15 adds). Keep in step with the README's "Python 3.11 to 3.14".
NEWEST = (3, 14)
NEWEST_WHY = "torch 2.13.0's wheels on PyPI: cp310 to cp314"
FAST_TESTS = ["-m", "pytest", "-q", "-m", "not slow", "-n", "2", "-p", "no:cacheprovider"]
PROBE = "import sys, venv, ensurepip; print(sys.executable, '%d.%d.%d' % sys.version_info[:3])"


def floor() -> tuple[int, int]:
    """requires-python's floor, read without tomllib (so that any Python 3 can run this)."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    if not found:
        sys.exit("pyproject.toml: no requires-python = \">=3.X\" to read the floor from")
    return int(found.group(1)), int(found.group(2))


def makefile_torch() -> str:
    found = re.search(r"^TORCH\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    return found.group(1) if found else "torch"


def name(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def probe(executable: str, version: tuple[int, int]) -> tuple[str | None, str]:
    """(the interpreter's own path, what was seen) when it runs as ``version`` with venv."""
    try:
        done = subprocess.run([executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=60, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"does not run ({error})"
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        return None, f"does not run as Python with venv: {first}"
    path, full = done.stdout.split()
    if tuple(int(p) for p in full.split(".")[:2]) != version:
        return None, f"is Python {full}"
    return path, f"Python {full}"


def find_python(version: tuple[int, int]) -> tuple[str | None, list[str]]:
    """The first interpreter of ``version`` found here, and where the search looked."""
    looked: list[str] = []

    def runs(where: str, executable: str) -> str | None:
        path, seen = probe(executable, version)
        looked.append(f"{where}: {executable} ({seen})")
        return path

    command = f"python{name(version)}"
    on_path = shutil.which(command)
    if on_path and (found := runs(f"{command} on PATH", on_path)):
        return found, looked
    if not on_path:
        looked.append(f"{command} on PATH: none")
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    pattern = os.path.join(pyenv_root, "versions", f"{name(version)}.*", "bin", command)
    in_pyenv = sorted(glob.glob(pattern), reverse=True, key=lambda p: [
        int(x) for x in re.findall(r"\d+", Path(p).parent.parent.name)])
    for executable in in_pyenv:
        if found := runs(f"pyenv {Path(executable).parent.parent.name}", executable):
            return found, looked
    if not in_pyenv:
        looked.append(f"pyenv: no {pattern}")
    uv = shutil.which("uv")
    if not uv:
        looked.append("uv: not installed")
        return None, looked
    done = subprocess.run([uv, "python", "find", "--no-python-downloads", name(version)],
                          capture_output=True, text=True, timeout=60,
                          env={**clean_env(), "UV_PYTHON_DOWNLOADS": "never"})
    if done.returncode == 0 and done.stdout.strip():
        return runs("uv python find", done.stdout.strip()), looked
    looked.append("uv python find: none")
    return None, looked


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without its own venv; ``venv``'s bin first on PATH (as the
    Makefile's test target does)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")}
    own = str(Path(sys.prefix) / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != own]
    if venv:
        path.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(path)
    return env


def copy_repository(dest: Path, ref: str | None) -> None:
    """The working tree's files git tracks or does not ignore, or ``ref`` as git archive has it."""
    dest.mkdir(parents=True)
    if ref:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for relative in filter(None, listed.decode().split("\0")):
        source = REPO / relative
        if source.is_file():  # a file deleted in the working tree but not yet in the index
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / relative)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None
        ) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        out = error.stdout or b""
        code, output = 124, (out.decode() if isinstance(out, bytes) else out) + "\n(timed out)"
    return code, output, time.monotonic() - start


def tail(output: str, lines: int = 25) -> str:
    return "\n".join("      " + line for line in output.rstrip().splitlines()[-lines:])


def summary_line(output: str) -> str:
    for line in reversed(output.strip().splitlines()):
        if re.search(r"\b(passed|failed|error|errors|no tests ran)\b.* in [\d.]+s", line):
            return line.strip("= ")
    return "(no pytest summary line)"


def check_python(version: tuple[int, int], executable: str, work: Path, torch: str,
                 skip_missing_torch: bool, ref: str | None, test_timeout: float
                 ) -> tuple[str, str]:
    """Set up and run the fast tests: ("passed" | "failed" | "skipped", a line for the summary)."""
    source = work / f"py{name(version)}" / "repo"
    copy_repository(source, ref)
    venv = source / ".venv"
    env = clean_env(venv)
    code, output, _ = run([executable, "-m", "venv", str(venv)], source, env)
    if code:
        print("  venv: failed\n" + tail(output))
        return "failed", "python -m venv failed"
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet"]
    timings = []
    if skip_missing_torch:
        code, output, seconds = run([*pip, "--no-index", "--no-deps", torch], source, env)
        if code:
            why = f"no wheel for {torch} on this machine's disk (--skip-missing-torch)"
            print(f"  not checked: {why}")
            return "skipped", why
        timings.append(f"{torch} from local disk {seconds:.0f} s")
    code, output, seconds = run([*pip, torch], source, env)
    if code:
        print(f"  install {torch}: failed\n" + tail(output))
        return "failed", f"pip install {torch} failed"
    timings.append(f"{torch}{' dependencies' if skip_missing_torch else ''} {seconds:.0f} s")
    code, output, seconds = run([*pip, "-e", ".[dev]"], source, env)
    if code:
        print("  install -e '.[dev]': failed\n" + tail(output))
        return "failed", "pip install -e '.[dev]' failed"
    timings.append(f"-e '.[dev]' {seconds:.0f} s")
    print("  install: " + ", ".join(timings))
    code, output, seconds = run([python, *FAST_TESTS], source, env, timeout=test_timeout)
    line = summary_line(output)
    print(f"  tests: {line} (exit {code}, {seconds:.0f} s wall)")
    if code:
        print(tail(output))
        return "failed", f"fast tests: {line}"
    return "passed", f"fast tests: {line}"


def check_refused(version: tuple[int, int], executable: str, work: Path, ref: str | None,
                  floor_name: str) -> tuple[bool, str]:
    """pip must refuse the course on a Python below the floor, naming requires-python."""
    source = work / f"py{name(version)}" / "repo"
    copy_repository(source, ref)
    venv = work / f"py{name(version)}" / "venv"
    env = clean_env(venv)
    code, output, _ = run([executable, "-m", "venv", str(venv)], source, env)
    if code:
        return False, "python -m venv failed: " + output.strip()[-200:]
    code, output, _ = run([str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run",
                           "--no-deps", "-e", "."], source, env)
    said = [line for line in output.splitlines() if "requires a different Python" in line]
    if code and said and f">={floor_name}" in said[0]:
        return True, said[0].strip()
    return False, f"pip exit {code}, no 'requires a different Python ... >={floor_name}':\n" \
        + tail(output, 10)


def main() -> int:
    low = floor()
    default = [(3, minor) for minor in range(low[1], NEWEST[1] + 1)]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythons", nargs="+", metavar="3.X",
                        help=f"versions to check (default: {', '.join(map(name, default))})")
    parser.add_argument("--torch", default=makefile_torch(),
                        help="the torch requirement installed first (default: the Makefile's "
                        "TORCH, %(default)s)")
    parser.add_argument("--skip-missing-torch", action="store_true",
                        help="take torch only from local wheels; skip a Python without one")
    parser.add_argument("--ref", help="test this commit (git archive) instead of the work tree")
    parser.add_argument("--test-timeout", type=float, default=3600,
                        help="seconds for each Python's fast tests (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    versions = default
    if args.pythons:
        if not all(re.fullmatch(r"3\.\d+", v) for v in args.pythons):
            parser.error("--pythons takes versions such as 3.11")
        versions = [(3, int(v.split(".")[1])) for v in args.pythons]
    below = [(3, minor) for minor in range(low[1] - 1, 7, -1)]  # the nearest below the floor

    readme = " ".join((REPO / "README.md").read_text().split())  # the sentence may wrap
    claim = f"Python {name(low)} to {name(NEWEST)}"
    source = f"commit {args.ref}" if args.ref else f"the working tree of {REPO}"
    print(f"pyproject.toml: requires-python >={name(low)}; newest: {name(NEWEST)} ({NEWEST_WHY})"
          f"; README.md says {claim!r}: {'yes' if claim in readme else 'NO'}")
    print(f"checking {', '.join(map(name, versions))} with {args.torch}"
          f"{' (local wheels only)' if args.skip_missing_torch else ''}; source: {source}\n")

    work = Path(tempfile.mkdtemp(prefix="python-versions-"))
    results: dict[str, tuple[str, str]] = {}
    failed = False
    try:
        for version in below:
            executable, looked = find_python(version)
            if executable:
                print(f"Python {name(version)} (below the floor): {executable}")
                refused, said = check_refused(version, executable, work, args.ref, name(low))
                print(f"  pip {'refuses it: ' if refused else 'did NOT refuse it: '}{said}\n")
                results[name(version)] = ("refused" if refused else "failed",
                                          f"below the floor; pip: {said.splitlines()[0]}")
                failed |= not refused
                break
        else:
            print(f"no Python below the floor found (looked for {', '.join(map(name, below))})\n")
        for version in versions:
            executable, looked = find_python(version)
            print(f"Python {name(version)}: {executable or 'not found'}")
            for line in looked:
                print(f"  looked: {line}")
            if not executable:
                results[name(version)] = ("not found", "no interpreter on this machine")
                print()
                continue
            started = time.monotonic()
            outcome, line = check_python(version, executable, work, args.torch,
                                         args.skip_missing_torch, args.ref, args.test_timeout)
            print(f"  {outcome.upper()} ({time.monotonic() - started:.0f} s in all)\n")
            results[name(version)] = (outcome, line)
            failed |= outcome == "failed"
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print(f"summary ({args.torch}; {source}):")
    for version, (outcome, line) in results.items():
        print(f"  {version:5} {outcome:9} {line}")
    unchecked = [f"{v} ({line})" for v, (outcome, line) in results.items()
                 if outcome in ("not found", "skipped")]
    print("not checked: " + ("; ".join(unchecked) if unchecked else "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
