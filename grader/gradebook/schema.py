"""The version a new nbgrader gradebook records, read in the grader's own process.

nbgrader 0.9.6 stamps a new gradebook with its schema's Alembic revision (``alembic_version``)
by running the ``alembic heads`` command (``nbgrader.api.get_alembic_version``): a second
Python that imports SQLAlchemy and Alembic, 2 to 5 CPU seconds every time a course directory's
first gradebook is made, by the grader or by an nbgrader command it runs. Alembic's own API
reads the same migration scripts in about 0.2 s, so the grader answers in process; where the
scripts do not name exactly one head (a future nbgrader), nbgrader's own way is kept.
"""

from __future__ import annotations

import functools
import os

# The environment variable that names a file of student ids, comma-separated, that the
# nbgrader command run by grader/gradebook/coursedir.py leaves out (``excluded``).
EXCLUDE_FILE = "CTC_NBGRADER_EXCLUDE"


@functools.cache
def alembic_head() -> str | None:
    """The one head revision of nbgrader's migration scripts, or None where there is not one."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    heads = ScriptDirectory(ALEMBIC_DIR).get_heads()
    return heads[0] if len(heads) == 1 else None


def patch_nbgrader() -> None:
    """The three changes below to how nbgrader opens a gradebook, in this process."""
    stamp_in_process()
    create_all_when_missing()
    one_engine_a_database()


def stamp_in_process() -> None:
    """Make ``nbgrader.api`` stamp new gradebooks with ``alembic_head``, not ``alembic heads``."""
    import nbgrader.api

    original = nbgrader.api.get_alembic_version
    if getattr(original, "in_process", False):
        return

    def get_alembic_version() -> str:
        return alembic_head() or original()

    get_alembic_version.in_process = True  # type: ignore[attr-defined]
    nbgrader.api.get_alembic_version = get_alembic_version


def create_all_when_missing() -> None:
    """Make the ``CREATE`` of nbgrader's tables, which its ``Gradebook`` runs each time one is
    opened, ask the database once whether they all exist, not once a table.

    ``MetaData.create_all`` looks for each of nbgrader's tables in turn before creating the
    missing ones; a coordinator opens the gradebook three times a hand-in (twice in nbgrader's
    own clean-up of the notebook, once to store its grades): 13 questions each time, about
    5% of the coordinator's time in a profile (``benchmarks/grade_distributed.py
    --coordinator-only``). Where one list of the database's tables names them all, nothing
    would be created and nothing is; otherwise nbgrader's own call runs as it did."""
    import nbgrader.api
    from sqlalchemy import inspect

    metadata = nbgrader.api.Base.metadata
    original = metadata.create_all
    if getattr(original, "when_missing", False):
        return

    def create_all(bind, tables=None, checkfirst: bool = True) -> None:
        if checkfirst and tables is None \
                and set(metadata.tables) <= set(inspect(bind).get_table_names()):
            return
        original(bind=bind, tables=tables, checkfirst=checkfirst)

    create_all.when_missing = True  # type: ignore[attr-defined]
    metadata.create_all = create_all


KEPT_ENGINES = 4  # databases whose engine a process keeps (a test run opens hundreds)


def one_engine_a_database() -> None:
    """Make every ``Gradebook`` that nbgrader opens on one database in this process share one
    SQLAlchemy engine, so its pool of connections and its cache of compiled queries.

    nbgrader's ``Gradebook`` makes an engine each time it is opened, and so a connection (on
    PostgreSQL a server process) and every query compiled anew: a coordinator opens three a
    hand-in (nbgrader's clean-up of the notebook twice, storing its grades once), the feedback
    pages one a page. ``Gradebook.close`` ends its session and leaves the engine, which is
    what makes sharing it safe. A connection is tested before each use (``pool_pre_ping``): a
    database restarted mid-batch costs a reconnection, not an error. The last KEPT_ENGINES
    databases keep theirs; an older one is disposed of."""
    import threading
    from collections import OrderedDict

    import nbgrader.api

    original = nbgrader.api.create_engine
    if getattr(original, "shared", False):
        return
    engines: OrderedDict = OrderedDict()
    lock = threading.Lock()

    def create_engine(url, **options):
        key = (str(url), tuple(sorted(options.items())))
        with lock:
            if key in engines:
                engines.move_to_end(key)
                return engines[key]
            engines[key] = original(url, pool_pre_ping=True, **options)
            if len(engines) > KEPT_ENGINES:
                engines.popitem(last=False)[1].dispose()
            return engines[key]

    create_engine.shared = True  # type: ignore[attr-defined]
    nbgrader.api.create_engine = create_engine


# nbgrader's tables index their keys and unique pairs only (a grade's is cell_id, notebook_id):
# its own lookup of one submission's grades, comments or notebooks scans the whole course's
# table, and each page that ``generate_feedback`` writes makes several, so a class's feedback
# grew with the square of its size (about a page a second at 2,000 hand-ins). These indexes
# make each lookup a search, in SQLite and PostgreSQL alike.
INDEXES = (("ctc_grade_notebook", "grade", "notebook_id"),
           ("ctc_comment_notebook", "comment", "notebook_id"),
           ("ctc_submitted_notebook_assignment", "submitted_notebook", "assignment_id"),
           ("ctc_submitted_assignment_student", "submitted_assignment", "student_id"))
_indexed: set[str] = set()


def add_indexes(engine) -> None:
    """Create ``INDEXES`` in the gradebook of ``engine`` where missing (once a process). A
    database this process may only read, or another grader making them at the same instant,
    leaves them to the next command: they speed queries up and change no result."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    url = str(engine.url)
    if url in _indexed:
        return
    try:
        with engine.begin() as connection:
            for name, table, column in INDEXES:
                connection.execute(text(f"CREATE INDEX IF NOT EXISTS {name} "
                                        f"ON {table} ({column})"))
    except DBAPIError:
        return
    _indexed.add(url)


def excluded() -> list[str]:
    """nbgrader's argument that leaves out the students named in the file of EXCLUDE_FILE,
    or none. Given in this process, the list has no length limit; on a command line, one
    argument may hold 128 KiB."""
    path = os.environ.get(EXCLUDE_FILE)
    if not path:
        return []
    with open(path, encoding="utf-8") as handle:
        return [f"--CourseDirectory.student_id_exclude={handle.read()}"]
