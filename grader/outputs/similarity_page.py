"""The files ``python -m grader similarity`` writes (similarity.py finds the pairs):
similarity.csv, every pair listed, and similarity.html, the first MAX_HTML_PAIRS side by side
with the fragments they share marked (``sides``: each shown pair's code, escaped and marked by
similarity.py's ``highlighted``). Everything else of a student's is escaped and made inert."""

from __future__ import annotations

import csv
import html
import itertools
from dataclasses import dataclass
from pathlib import Path

from grader.common import files
from grader.common.text import display, inert
from grader.content.lessons import Lesson

MAX_HTML_PAIRS = 200


@dataclass
class Pair:
    a: str
    b: str
    shared: int  # fingerprints both hold, summed over exercises
    similarity_a: float  # shared / a's fingerprints
    similarity_b: float
    exercises: list[str]  # the exercises that share fingerprints, in the lesson's order

    @property
    def score(self) -> float:
        return max(self.similarity_a, self.similarity_b)


def write_csv(path: Path, pairs: list[Pair], groups: list[list[str]],
               names: dict[str, str]) -> None:
    with files.written(path, newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_a", "student_b", "similarity_a", "similarity_b",
                         "shared_fingerprints", "identical", "exercises", "name_a", "name_b"])
        for group in groups:
            for a, b in itertools.combinations(group, 2):
                writer.writerow([display(a), display(b), 1.0, 1.0, "", "yes", "",
                                 display(names.get(a, "")), display(names.get(b, ""))])
        for p in pairs:
            writer.writerow([display(p.a), display(p.b), round(p.similarity_a, 3),
                             round(p.similarity_b, 3), p.shared, "",
                             display(" ".join(p.exercises)), display(names.get(p.a, "")),
                             display(names.get(p.b, ""))])


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table.pair {{ width: 100%; table-layout: fixed; border-collapse: collapse; }}
table.pair td {{ vertical-align: top; width: 50%; border: 1px solid #ccc; padding: 0.3em; }}
pre {{ white-space: pre-wrap; word-break: break-all; font-size: 0.85em; margin: 0; }}
mark {{ background: #ffd27f; }}
.hint {{ background: #eef; padding: 0.8em; border-left: 4px solid #669; }}
</style></head><body>
{body}
</body></html>
"""


def write_html(path: Path, lesson: Lesson, pairs: list[Pair], groups: list[list[str]],
                sides: list[dict[str, tuple[str, str]]], settings: dict,
                names: dict[str, str] | None = None) -> None:
    names = names or {}

    def e(text: str) -> str:
        return html.escape(inert(text, 1000))

    def who(student: str) -> str:
        return e(student) + (f" ({e(names[student])})" if names.get(student) else "")

    parts = [f"<h1>{e(lesson.name)}: similar submissions</h1>",
             "<p class='hint'><strong>A hint for a human, not a finding.</strong> The exercises "
             "are short functions with few correct forms, so honest students often write the "
             "same lines. Read the shared fragments (highlighted) side by side, and weigh them "
             "against what else you know, before drawing any conclusion.</p>",
             f"<p>{settings['submissions']} graded submissions, {settings['pairs']:,} pairs "
             f"compared exercise with exercise; the released starter code and "
             f"{settings['common']} fragment(s) found in more than {settings['ignore_common']} "
             f"submissions were left out. Listed: pairs where the larger similarity reaches "
             f"{settings['threshold']:.0%} with at least {settings['min_shared']} shared "
             f"fingerprints.</p>",
             f"<h2>Identical notebooks (same SHA-256): {len(groups)}</h2>"]
    if groups:
        parts.append("<ul>" + "".join(f"<li>{', '.join(who(s) for s in g)}</li>"
                                      for g in groups) + "</ul>")
    parts.append(f"<h2>Similar pairs: {len(pairs)}</h2>")
    if len(pairs) > MAX_HTML_PAIRS:
        parts.append(f"<p>The first {MAX_HTML_PAIRS} are shown; similarity.csv lists all.</p>")
    for number, (pair, marked) in enumerate(zip(pairs, sides, strict=False), 1):
        parts.append(f"<h3 id='pair-{number}'>{number}. {who(pair.a)} "
                     f"({pair.similarity_a:.0%}) and {who(pair.b)} ({pair.similarity_b:.0%}): "
                     f"{pair.shared} shared "
                     "fingerprints</h3>")
        for name in pair.exercises:
            left, right = marked[name]
            parts.append(f"<h4>{e(name)}</h4><table class='pair'><tr><th>{who(pair.a)}</th>"
                         f"<th>{who(pair.b)}</th></tr><tr><td><pre>{left}</pre></td><td><pre>"
                         f"{right}</pre></td></tr></table>")
    files.write_text(path, PAGE.format(title=e(f"{lesson.name}: similar submissions"),
                                       body="\n".join(parts)))
