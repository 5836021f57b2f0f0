"""JupyterHub for the course on one machine: local system users log in with their password,
each gets a server from the course's environment, and nbgrader's exchange folder carries
lessons out and submissions in. Set-up and the instructor's commands: README.md beside this.

Settings (environment variables of the hub process, read at start):
    CTC_VENV        the course's environment (default /opt/counting-the-cost/venv); its
                    bin/jupyterhub-singleuser is each user's server.
    CTC_EXCHANGE    nbgrader's exchange folder, mode 1777 (default /srv/nbgrader/exchange).
    CTC_USERS_FILE  who may log in (default users.txt beside this file): one "ROLE NAME" a line,
                    ROLE "student" or "instructor"; "#" starts a comment.
    CTC_COURSE_DIR  the instructor's course folder (default /srv/ctc-course), whose key
                    (variants.key, made by the first release) draws each student's own numbers.
"""

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("CTC_VENV", "/opt/counting-the-cost/venv"))
EXCHANGE = os.environ.get("CTC_EXCHANGE", "/srv/nbgrader/exchange")
USERS_FILE = Path(os.environ.get("CTC_USERS_FILE", HERE / "users.txt"))
COURSE_DIR = Path(os.environ.get("CTC_COURSE_DIR", "/srv/ctc-course"))


def read_users(path: Path) -> dict[str, set[str]]:
    """Usernames by role. A missing file stops the hub: with no one allowed it would start
    and let no one in."""
    if not path.exists():
        raise SystemExit(f"{path}: no users file (copy users.example.txt beside it and edit it)")
    roles: dict[str, set[str]] = {"student": set(), "instructor": set()}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2 or fields[0] not in roles:
            raise SystemExit(f"{path}:{number}: expected 'student NAME' or 'instructor NAME'")
        roles[fields[0]].add(fields[1])
    return roles


USERS = read_users(USERS_FILE)


def config_folder(spawner) -> str:
    """The user's role's folder of Jupyter config (nbgrader's extensions, lab plugins, exchange).
    It must be readable by every user: the server reads it as the user."""
    role = "instructor" if spawner.user.name in USERS["instructor"] else "student"
    return str(HERE / role)


def student_variants(spawner) -> str:
    """The user's own numbers in every lesson (grader/content/variants.py), drawn for their hub
    user name with the course's key. The hub runs as root and reads the key, or makes it (for
    the course folder's owner) when no release has yet: every server then holds the numbers the
    grader will draw, from the first login on. The user's server gets the draws alone. Without
    the course folder no server starts: with the default numbers, students would work on
    other numbers than the ones they are graded on."""
    if not COURSE_DIR.is_dir():
        spawner.log.error("CTC_COURSE_DIR=%s is not a folder: create the course folder "
                          "(deploy/hub/README.md) or set CTC_COURSE_DIR", COURSE_DIR)
        raise RuntimeError("the course is not set up yet: tell your instructor")
    # The key as the course's gradebook knows it (grader/gradebook/coursestate.py): one lost or
    # not the gradebook's is refused, never replaced; the numbers are drawn for the user's course
    # id (the roster's); read only: the instructor's commands record what they find.
    code = ("import os, sys; from pathlib import Path; "
            "from grader.content.variants import KEY_FILE; "
            "from grader.course import hub_variants; "
            "root = Path(sys.argv[1]); made = not (root / KEY_FILE).exists(); "
            "given = hub_variants(root, sys.argv[2]); "
            "made and (root / KEY_FILE).exists() and os.chown(root / KEY_FILE, "
            "root.stat().st_uid, root.stat().st_gid); "
            "print(given)")
    done = subprocess.run([str(VENV / "bin" / "python"), "-I", "-c", code, str(COURSE_DIR),
                           spawner.user.name], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:  # the server must not start with other numbers than the grader's
        spawner.log.error("could not draw %s's numbers: %s", spawner.user.name,
                          done.stderr[-2000:])
        raise RuntimeError("your server could not be given your numbers: tell your instructor")
    return done.stdout.strip()


c = get_config()  # noqa: F821

# PAMAuthenticator and LocalProcessSpawner, JupyterHub's defaults: the hub runs as root and
# starts each server as the user's own system account.
c.Authenticator.allowed_users = USERS["student"] | USERS["instructor"]
c.Authenticator.admin_users = USERS["instructor"]

c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
# A callable value is called with the spawner when the server starts.
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": config_folder,
    "CTC_EXCHANGE": EXCHANGE,  # read by the role folders' nbgrader_config.py
    "CTC_VARIANTS": student_variants,  # read by each lesson's variant cell
    # Run by each kernel at its start and restart: one-line messages (a cell run after a restart)
    "PYTHONSTARTUP": str(HERE.parents[1] / "grader" / "lab" / "kernel_startup.py"),
    # The course's Python first, for the terminal and for nbgrader's Validate.
    "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
}
