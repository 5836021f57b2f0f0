"""``python -m grader similarity LESSON``: pairs of submissions whose exercise code is alike.

A hint for a human, never a verdict: the lessons' exercises are short functions with few
correct forms, so two honest students can write the same lines. The report shows the shared
fragments side by side for the instructor to judge.

How code is compared (the winnowing of Schleimer, Wilkerson and Aiken, SIGMOD 2003, as MOSS
and copydetect use it):

- Each graded submission stored in ``submitted/STUDENT/LESSON/`` gives its exercise code: the
  source of each answer cell (nbgrader ``solution`` cells, by their ``grade_id``). Demo and
  scratch cells are left out.
- Each exercise's code is tokenised and normalised by copydetect's ``filter_code`` (pygments'
  Python lexer; names become ``V``/``F``/``O``, strings ``S``, comments and whitespace go), so
  renaming variables or reflowing lines changes nothing. Its k-grams (``K`` characters of the
  normalised code) are hashed and winnowed by copydetect's ``winnow`` (every run of
  ``GUARANTEE`` characters shared by two submissions yields a shared fingerprint).
- Fingerprints of the released starter code of that exercise are removed (copydetect's
  "boilerplate"), and so are fingerprints found in more than ``ignore_common`` submissions
  (MOSS's ``-m``: the obvious way to write a line that many students found is no evidence).
- Exercise is compared with the same exercise only. For each pair, ``shared`` counts the
  fingerprints both hold; each student's similarity is ``shared`` over their own
  fingerprints. A pair is listed when the larger of the two reaches ``threshold`` and
  ``shared`` reaches ``min_shared`` (a few lines: a one-line exercise alike proves nothing).
- Notebooks with the same bytes (SHA-256) are listed outright, whatever their code, except
  the released student version handed in untouched.

copydetect (MIT) supplies the tokeniser, the winnowing and the mapping from fingerprints back
to the original text. Its own ``hashed_kgrams`` uses Python's ``hash``, which changes with
every process (PYTHONHASHSEED), so the same class would give slightly different figures on
each run; the k-gram hash here is a fixed polynomial hash instead. Its ``CopyDetector`` reads
files from disk and compares whole files; we compare exercise with exercise and write our own
inert HTML (every piece of student text escaped, no script, a Content-Security-Policy that
forbids any), like the feedback pages.

Pairs are found through an index from each fingerprint to the submissions holding it, so the
work grows with the pairs that share something, not with every pair. Most of the time goes to
pygments' lexer (25 ms of a core a submission): from PARALLEL_FROM submissions on, that is
done on every core. A class is kept as each exercise's sorted fingerprints (``Submission``),
and the code is read again only for the pairs the page shows. ``benchmarks/similarity_class.py``
measured 300 submissions in seconds, 10,000 in under 3 minutes on 2 cores (1.6 GB at its peak;
4.4 GB when every hand-in's code and fingerprints' places were kept).
"""

from __future__ import annotations

import array
import hashlib
import html
import itertools
import multiprocessing
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from grader.common.errors import CourseError
from grader.common.machine import usable_cores
from grader.common.text import inert
from grader.content.lessons import Lesson
from grader.outputs.similarity_page import MAX_HTML_PAIRS, Pair, write_csv, write_html

K = 25  # characters of normalised code in a k-gram (copydetect's noise threshold default)
GUARANTEE = 30  # a shared run this long always yields a shared fingerprint (copydetect's)
WINDOW = GUARANTEE - K + 1
DEFAULT_THRESHOLD = 0.8
DEFAULT_MIN_SHARED = 20
DEFAULT_IGNORE_COMMON = 10
MAX_CELL_CHARS = 200_000  # a longer answer cell is cut: the report is a hint, not an archive
PAIRS_AT_ONCE = 1 << 22  # pairs found that are counted at once (32 MiB of them)
# A class this large is fingerprinted on every core this process may use (at most
# MAX_WORKERS): a worker's start (its imports) costs what some 40 hand-ins do.
PARALLEL_FROM = 400
MAX_WORKERS = 8
_BASE = np.uint64(1_000_003)


@dataclass
class Exercise:
    """One exercise's code in one submission, fingerprinted."""

    code: str
    offsets: np.ndarray  # copydetect's map from normalised to original positions
    where: dict[int, list[int]] = field(default_factory=dict)  # fingerprint -> k-gram starts

    @property
    def fingerprints(self) -> set[int]:
        return set(self.where)

    @property
    def values(self) -> np.ndarray:
        """The fingerprints, sorted, as compared (8 bytes each, where ``where`` takes some
        200: a class of 10,000 kept as ``Exercise``s held gigabytes)."""
        return np.array(sorted(self.where), dtype=np.int64)


@dataclass
class Submission:
    """One hand-in, as compared: each exercise's fingerprints (``Exercise.values``). The code
    and where each fingerprint starts are read again for the pairs a page shows."""

    student_id: str
    sha256: str
    exercises: dict[str, np.ndarray]

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.exercises.values())


def kgram_hashes(text: str, k: int = K) -> np.ndarray:
    """A polynomial hash (mod 2**64) of every k-character window of ``text``: the same in
    every process, unlike Python's ``hash``."""
    if len(text) < k:
        return np.zeros(0, dtype=np.uint64)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    count = len(codes) - k + 1
    hashes = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            hashes = hashes * _BASE + codes[j:j + count]
    # 53 bits: copydetect's pure-Python winnowing compares hashes as floats, exact below 2**53
    return (hashes & np.uint64(2**53 - 1)).astype(np.int64)


def fingerprint(code: str, remove: set[int] = frozenset()) -> Exercise:
    """Normalise, hash and winnow one exercise's code (copydetect's pipeline); fingerprints
    in ``remove`` (the starter code's) are dropped."""
    from copydetect.utils import filter_code, winnow

    filtered, offsets = filter_code(code, "exercise.py", "python")
    exercise = Exercise(code, offsets)
    hashes = kgram_hashes(filtered)
    if len(hashes) == 0:
        return exercise
    selected, positions = winnow(hashes, WINDOW, remove_duplicates=False)
    for value, position in zip(selected.tolist(), positions.tolist(), strict=True):
        if value not in remove:
            exercise.where.setdefault(value, []).append(position)
    return exercise


def answer_cells(path: Path) -> dict[str, str]:
    """Exercise -> the code of its answer cell(s) in a notebook (nbgrader ``solution`` cells,
    by ``grade_id``); an unreadable notebook gives none."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception:  # a hand-in is untrusted: anything unreadable has no code to compare
        return {}
    found: dict[str, str] = {}
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not isinstance(meta, dict) \
                or meta.get("solution") is not True:
            continue
        name, source = str(meta.get("grade_id", "")), cell.get("source", "")
        if isinstance(source, list):
            source = "".join(str(s) for s in source)
        if name and isinstance(source, str):
            found[name] = (found.get(name, "") + "\n" + source)[:MAX_CELL_CHARS] \
                if name in found else source[:MAX_CELL_CHARS]
    return found


def load(notebooks: dict[str, Path], starter: Path, ignore_common: int,
         ) -> tuple[list[Submission], dict[str, set[int]], str]:
    """Fingerprint every submission's answer to each of the lesson's exercises (the starter
    notebook's answer cells: a ``grade_id`` a student made up is no exercise, and is never
    shown); drop the starter code's fingerprints and those found in more than
    ``ignore_common`` submissions (0: none dropped). Returns the submissions, the fingerprints
    dropped as common per exercise, and the starter notebook's SHA-256."""
    removed = starter_fingerprints(starter)
    handins = sorted(notebooks.items())
    workers = fingerprint_workers(len(handins))
    if workers < 2:
        submissions = [fingerprinted(student, path, removed) for student, path in handins]
    else:  # 25 ms of a core a submission, nearly all of it pygments' lexer
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            submissions = list(pool.map(fingerprinted, *zip(*handins, strict=True),
                                        itertools.repeat(removed),
                                        chunksize=max(1, len(handins) // (workers * 8))))
    common: dict[str, set[int]] = {}
    if ignore_common > 0:
        for name in removed:
            values, times = np.unique(np.concatenate(
                [s.exercises[name] for s in submissions if name in s.exercises]
                or [np.zeros(0, dtype=np.int64)]), return_counts=True)
            dropped = values[times > ignore_common]
            if len(dropped):
                common[name] = set(dropped.tolist())
                for submission in submissions:
                    if name in submission.exercises:
                        submission.exercises[name] = np.setdiff1d(
                            submission.exercises[name], dropped, assume_unique=True)
    return submissions, common, hashlib.sha256(starter.read_bytes()).hexdigest()


def starter_fingerprints(starter: Path) -> dict[str, set[int]]:
    """Each exercise of the starter notebook, with the fingerprints of its given code."""
    return {name: set(fingerprint(code).where) for name, code in answer_cells(starter).items()}


def fingerprint_workers(submissions: int) -> int:
    """How many processes fingerprint a class of ``submissions``: 1 (this one) below
    PARALLEL_FROM, else one a core this process may use, at most MAX_WORKERS."""
    if submissions < PARALLEL_FROM:
        return 1
    return min(usable_cores(), MAX_WORKERS)


def fingerprinted(student: str, path: Path, removed: dict[str, set[int]]) -> Submission:
    """One hand-in's answer to each exercise of the starter notebook (those of ``removed``),
    fingerprinted without the starter code's fingerprints."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Submission(student, digest, {name: exercise.values for name, exercise
                                        in detail(path, removed).items()})


def detail(path: Path, removed: dict[str, set[int]]) -> dict[str, Exercise]:
    """A hand-in's answer to each exercise of ``removed`` (exercise -> fingerprints left out:
    the starter code's, and the common fragments), with its code, as its page shows it."""
    return {name: fingerprint(code, removed[name])
            for name, code in answer_cells(path).items() if name in removed}


def compare(submissions: list[Submission], order: list[str], threshold: float = 0.0,
            min_shared: int = 1) -> list[Pair]:
    """The pairs that share at least ``min_shared`` fingerprints (exercise with exercise) and
    whose larger similarity reaches ``threshold``, with their similarities: by default, every
    pair that shares one. Each pair that shares a fingerprint is counted as one number,
    ``i * n + j``, in one array, sorted and counted by numpy: a class of 10,000 has millions of
    pairs that share a fragment or two, which a dict of pairs held as gigabytes (and counted
    three times slower)."""
    n = len(submissions)
    found, counts = _pairs_counted(_holders(submissions), n)
    sizes = np.array([max(s.size, 1) for s in submissions], dtype=np.float64)
    first, second = np.divmod(found, n)
    similarity_a, similarity_b = counts / sizes[first], counts / sizes[second]
    keep = (counts >= min_shared) & (np.maximum(similarity_a, similarity_b) >= threshold)
    rank = {name: place for place, name in enumerate(order)}
    pairs = []
    for i, j, count, to_a, to_b in zip(first[keep].tolist(), second[keep].tolist(),
                                       counts[keep].tolist(), similarity_a[keep].tolist(),
                                       similarity_b[keep].tolist(), strict=True):
        a, b = submissions[i], submissions[j]
        names = [name for name, values in a.exercises.items() if name in b.exercises
                 and len(np.intersect1d(values, b.exercises[name], assume_unique=True))]
        pairs.append(Pair(a.student_id, b.student_id, count, to_a, to_b,
                          sorted(names, key=lambda x: (rank.get(x, len(rank)), x))))
    return pairs


def _holders(submissions: list[Submission]) -> Iterator[list[int]]:
    """For each fingerprint of each exercise, the submissions (indexes, ascending) that hold
    it: sorted in numpy, not a dict of every fingerprint."""
    names = {name: place for place, name in
             enumerate(sorted({n for s in submissions for n in s.exercises}))}
    keys = [values * len(names) + names[name]  # fingerprints are below 2**53
            for s in submissions for name, values in s.exercises.items()]
    owners = [np.full(len(values), index, dtype=np.int64)
              for index, s in enumerate(submissions) for values in s.exercises.values()]
    if not keys:
        return
    key, owner = np.concatenate(keys), np.concatenate(owners)
    order = np.lexsort((owner, key))
    key, owner = key[order], owner[order]
    bounds = np.flatnonzero(np.diff(key)) + 1
    starts, ends = np.r_[0, bounds], np.r_[bounds, len(key)]
    several = ends - starts > 1
    for start, end in zip(starts[several].tolist(), ends[several].tolist(), strict=True):
        yield owner[start:end].tolist()


def _pairs_counted(holders: Iterable[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair ``i * n + j`` of submissions that hold a fingerprint together (each list of
    holders in ascending order), and how many they hold together: counted PAIRS_AT_ONCE at a
    time and merged, so that memory follows the pairs found, not every time one is found."""
    found, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    codes = array.array("q")

    def merge() -> None:
        nonlocal found, counts, codes
        new, times = np.unique(np.frombuffer(codes, dtype=np.int64), return_counts=True)
        codes = array.array("q")
        found, index = np.unique(np.concatenate([found, new]), return_inverse=True)
        counts = np.bincount(index, weights=np.concatenate([counts, times])).astype(np.int64)

    for students in holders:
        if len(students) > 1:
            codes.extend(i * n + j for i, j in itertools.combinations(students, 2))
            if len(codes) >= PAIRS_AT_ONCE:
                merge()
    if codes:
        merge()
    return found, counts


def most_similar_first(pairs: list[Pair]) -> list[Pair]:
    """``pairs`` (``compare`` kept those at the threshold) in the report's order."""
    return sorted(pairs, key=lambda p: (-p.score, -p.shared, p.a, p.b))


def identical_groups(submissions: list[Submission], starter_sha256: str) -> list[list[str]]:
    """Students whose notebooks have the same bytes, a group per notebook (the untouched
    student version is no group)."""
    by_digest: dict[str, list[str]] = defaultdict(list)
    for submission in submissions:
        if submission.sha256 != starter_sha256:
            by_digest[submission.sha256].append(submission.student_id)
    return sorted((sorted(g) for g in by_digest.values() if len(g) > 1), key=lambda g: g[0])


# ------------------------------------------------------------------ the command

def stored_notebooks(course, lesson: Lesson) -> dict[str, Path]:
    """student -> their stored notebook, for every graded submission of ``lesson``."""
    graded = course.statuses(lesson.name).get(lesson.name, {})
    found = {}
    for student, record in graded.items():
        path = course.root / "submitted" / student / lesson.name / lesson.notebook.name
        if record.get("status") != "invalid" and path.is_file() and not path.is_symlink():
            found[student] = path
    return found


def similarity(course, lesson: Lesson, threshold: float = DEFAULT_THRESHOLD,
               min_shared: int = DEFAULT_MIN_SHARED,
               ignore_common: int = DEFAULT_IGNORE_COMMON, out: Path | None = None) -> Path:
    """Compare every pair of graded submissions of ``lesson``; write similarity.html and
    similarity.csv in ``out`` (default: reports/LESSON/ of the course); print a summary."""
    if not 0 < threshold <= 1:
        raise CourseError(f"--threshold {threshold:g}: give a fraction above 0, at most 1")
    if min_shared < 1 or ignore_common < 0:
        raise CourseError("--min-shared must be at least 1 and --ignore-common at least 0")
    started = time.perf_counter()
    notebooks = stored_notebooks(course, lesson)
    if len(notebooks) < 2:
        raise CourseError(f"{len(notebooks)} graded submission(s) of {lesson.name}: nothing to "
                          f"compare (grade them with `python -m grader autograde {lesson.name} "
                          "SUBMISSIONS`)")
    starter = course.root / "release" / lesson.name / lesson.notebook.name
    if not starter.is_file():
        course.release(lesson)
    order = list(answer_cells(lesson.notebook))
    if len(notebooks) >= PARALLEL_FROM:  # minutes, not seconds: say so before they pass
        course.log(f"{lesson.name}: reading and fingerprinting {len(notebooks):,} graded "
                   f"submissions on {fingerprint_workers(len(notebooks))} core(s) (10,000 "
                   "took under 3 minutes on 2 cores, benchmarks/similarity_class.py)")
    submissions, common, starter_sha256 = load(notebooks, starter, ignore_common)
    pairs = compare(submissions, order, threshold, min_shared)
    groups = identical_groups(submissions, starter_sha256)
    same = {pair for group in groups for pair in itertools.combinations(group, 2)}
    found = [p for p in most_similar_first(pairs)
             if tuple(sorted((p.a, p.b))) not in same]  # listed once, as identical
    seconds = time.perf_counter() - started
    folder = Path(out) if out is not None else course.root / "reports" / lesson.name
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"threshold": threshold, "min_shared": min_shared,
                "ignore_common": ignore_common, "submissions": len(submissions),
                "pairs": len(submissions) * (len(submissions) - 1) // 2,
                "common": sum(len(v) for v in common.values()), "seconds": seconds}
    left_out = {name: given | common.get(name, set())
                for name, given in starter_fingerprints(starter).items()}
    shown = {student: detail(notebooks[student], left_out)  # the code, for the pairs shown
             for pair in found[:MAX_HTML_PAIRS] for student in (pair.a, pair.b)}
    sides = [{name: (highlighted(shown[p.a][name], shown[p.b][name]),
                     highlighted(shown[p.b][name], shown[p.a][name])) for name in p.exercises}
             for p in found[:MAX_HTML_PAIRS]]
    names = {student: str((record.get("handin") or {}).get("name") or "")
             for student, record in course.statuses(lesson.name).get(lesson.name, {}).items()}
    write_csv(folder / "similarity.csv", found, groups, names)
    write_html(folder / "similarity.html", lesson, found, groups, sides, settings, names)

    def who(student: str) -> str:
        return inert(student, 60) + (f" ({inert(names[student], 60)})"
                                     if names.get(student) else "")

    lines = [f"{lesson.name}: compared {settings['pairs']:,} pairs of {len(submissions)} "
             f"graded submissions in {seconds:.1f} s",
             f"  identical notebooks (same SHA-256): {len(groups)} group(s)"]
    lines += [f"    {inert(', '.join(who(s) for s in g), 400)}" for g in groups]
    lines.append(f"  pairs at or above {threshold:.0%} similar (and {min_shared}+ shared "
                 f"fingerprints): {len(found)}")
    lines += [f"    {who(p.a)} ~ {who(p.b)}: {p.similarity_a:.0%} / "
              f"{p.similarity_b:.0%} ({p.shared} shared; {inert(', '.join(p.exercises), 300)})"
              for p in found[:20]]
    if len(found) > 20:
        lines.append(f"    and {len(found) - 20} more (see similarity.csv)")
    lines += ["  These are hints for a human, not findings: short exercises have few correct "
              "forms. Read the fragments side by side before drawing any conclusion.",
              f"written: {folder}/similarity.html, similarity.csv"]
    course.log("\n".join(lines))
    return folder / "similarity.html"


def highlighted(exercise: Exercise, other: Exercise) -> str:
    """``exercise``'s code as escaped HTML, the fragments it shares with ``other`` in
    ``<mark>`` (copydetect maps the shared fingerprints back to the original text)."""
    from copydetect.utils import get_copied_slices

    code = exercise.code
    starts = [p for value in exercise.fingerprints & other.fingerprints
              for p in exercise.where[value]]
    if not starts:
        return html.escape(code)
    slices = get_copied_slices(np.array(starts, dtype=np.int64), K).astype(np.int64)
    if len(exercise.offsets) > 0:
        slices = slices + exercise.offsets[:, 1][np.clip(
            np.searchsorted(exercise.offsets[:, 0], slices), 0, exercise.offsets.shape[0] - 1)]
    out, at = [], 0
    for start, end in zip(slices[0].tolist(), slices[1].tolist(), strict=True):
        start, end = max(start, at), min(max(end, start), len(code))
        out += [html.escape(code[at:start]), "<mark>", html.escape(code[start:end]), "</mark>"]
        at = end
    out.append(html.escape(code[at:]))
    return "".join(out)
