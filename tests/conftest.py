"""Hypothesis profiles, how the tests are ordered and spread over workers, and what a whole
test run shares: a folder every worker sees, one PostgreSQL and one Redis server.

``make test`` (and CI) uses ``repeatable``: the property tests draw the same examples on every run,
so a test run's result does not depend on luck. ``HYPOTHESIS_PROFILE=explore make test`` draws
fresh examples each run, to look for new failures; record any it finds as an ``@example``.
"""

import contextlib
import os
import warnings
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

from tests import servers

# One CPU thread for torch in the test processes and in every process they start (kernels of
# lecture runs and labs, lesson 07's ranks; the grader's sandbox sets its own), as the lessons
# mostly run (their first cell sets it): two workers share this machine's two cores, and
# torch's OpenMP threads spin while the other worker holds a core. Lesson 10's IsoFLOP profiles
# took 29 to 46 s on two threads so, 3.9 s on one; lesson 03's lecture run, which measures its
# matmuls on the machine's threads, 130 s beside a grading batch, 10 s alone. A thread count
# set outside is kept. What another thread count rounds differently is checked by moving
# reference values a few ulps (tests/test_portability.py), and for lesson 10's profiles on one
# thread and on two by benchmarks/isoflop_repeat.py.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
torch.set_num_threads(1)

# No per-example deadline: the suite keeps both cores busy, and an example that took 0.2 ms
# alone took 338 ms beside a grading batch (hypothesis's 200 ms deadline then fails the test,
# a flake that says nothing of the code). Speed is measured by benchmarks/, not here.
settings.register_profile("repeatable", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def slow_first(items: list[pytest.Item]) -> None:
    """The slow tests first, in their order, then the rest: under ``--dist loadgroup``
    pytest-xdist hands out work units (an ``xdist_group``, or a test alone) largest first by
    their count of tests and else in this order, and gives each worker a few units ahead. With
    the explorers' browser tests (a unit of one or two tests, 15-20 s each) collected last, the
    last three sat queued on one worker while the other, done with its quick tests, stood idle
    for 40 s at the end of the run. A stable sort: the tests of one group keep their order."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n 2 --dist loadgroup`` (``make test``), pytest-xdist sends the tests of one
    ``xdist_group`` to one worker, so an expensive module-scoped fixture (a graded batch of
    submissions) runs once. It marks them by appending ``@group`` to their node ids, which pytest
    9.2 silently ignores (pytest-xdist#1386): every worker then grades every batch, and the suite
    takes about twice as long. Say so."""
    slow_first(items)
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    if any(item.get_closest_marker("xdist_group") and "@" not in item.nodeid for item in items):
        warnings.warn(pytest.PytestWarning(
            f"pytest-xdist's --dist loadgroup does not group tests under pytest "
            f"{pytest.__version__} (pytest-xdist#1386), so expensive fixtures run on every "
            "worker. Install the versions pyproject.toml pins (make setup)."), stacklevel=1)


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory) -> "os.PathLike":
    """A folder that every xdist worker of this test run sees (the parent of the workers' own
    temporary folders), for work done once per run and shared: released lessons
    (tests/grading_helpers.released)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def postgres_server(shared_tmp) -> servers.Server:
    """The test run's one PostgreSQL server, shared by every xdist worker (started by the first
    that asks, ended by the last done). Make a database of your own on it (``postgres_database``);
    never stop it: a test that stops its server starts one of its own
    (``servers.postgres_server``)."""
    if servers.postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (make test installs it where it can)")
    with servers.shared(shared_tmp, "postgres", servers.start_postgres) as server:
        yield server


@pytest.fixture
def postgres_database(postgres_server, request) -> str:
    """A database of this test's own on the run's PostgreSQL server; its URL."""
    return servers.new_database(postgres_server.url, request.node.name)


@pytest.fixture(scope="session")
def redis_server(shared_tmp) -> servers.Server:
    """The test run's one Redis server, shared by every xdist worker as ``postgres_server``
    is; each test takes a database number of its own (``broker``). Never stop it."""
    if servers.redis_programs() is None:
        pytest.skip("Redis is not installed (make test installs it where it can)")
    with servers.shared(shared_tmp, "redis", servers.start_redis) as server:
        yield server


@pytest.fixture
def broker(redis_server, shared_tmp) -> str:
    """A Redis database of this test's own on the run's server (no other test's tasks or
    results in it): its URL, for ``--broker``."""
    return redis_server.url.format(db=servers.next_number(shared_tmp / "redis-databases"))


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium (Debian's) per test module that drives a page. Playwright's sync
    API allows one driver at a time and keeps an event loop running in the test's thread while
    it is open (so nbclient's ``asyncio.run`` in a later module would fail): a module's lab
    servers share it, and it closes with the module."""
    import shutil

    playwright = pytest.importorskip("playwright.sync_api")
    chromium_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium_path is None:
        pytest.skip("needs Debian's chromium (make test installs it where it can)")
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=chromium_path, headless=True,
                                          args=flags)
        yield chromium
        chromium.close()


class SharedLab:
    """A JupyterLab server over ``root``, with the course's lab settings and no student id;
    ``serving`` lends it to a test module."""

    def __init__(self, root, base: str, token: str) -> None:
        self.root, self.base, self.token = root, base, token

    @contextlib.contextmanager
    def serving(self, folders: dict):
        """Copies of ``folders`` (name: folder) in the server's root while in the block, each
        module's under names of its own; yields (base URL, token). At the end the kernels of
        the notebooks under those names are shut down, as a student closing them would."""
        import json
        import shutil
        import urllib.request

        for name, folder in folders.items():
            shutil.copytree(folder, self.root / name)
        try:
            yield self.base, self.token
        finally:
            headers = {"Authorization": f"token {self.token}"}
            with urllib.request.urlopen(urllib.request.Request(
                    f"{self.base}/api/sessions", headers=headers), timeout=30) as response:
                sessions = json.load(response)
            for session in sessions:
                if session.get("path", "").split("/")[0] in folders:
                    urllib.request.urlopen(urllib.request.Request(
                        f"{self.base}/api/sessions/{session['id']}", headers=headers,
                        method="DELETE"), timeout=30).close()


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory) -> "Iterator[SharedLab]":
    """One JupyterLab server per test worker for every browser test that needs no student id
    of its own (tests/test_browser.py's student and instructor runs, each explorer's test):
    a lab server costs seconds to start. Each module copies its folders in under names of its
    own and opens its pages in workspaces of their own, so no tab or kernel is shared. (The
    browser stays one per module: see ``browser``.)"""
    from grader.course import Course
    from grader.lab.server import lab_environment, running_lab

    tmp = tmp_path_factory.mktemp("shared-lab")
    (tmp / "root").mkdir()
    course = Course(tmp / "course", log=lambda _: None)
    with running_lab(tmp / "root", lab_environment(course), 0,
                     "--LabApp.expose_app_in_browser=True") as (base, token):
        yield SharedLab(tmp / "root", base, token)
