"""A batch's progress as the instructor watches it: a line per submission graded, failed or
skipped, or a live line on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable

from grader.common.text import inert
from grader.grading.autograde import Graded


class Progress:
    """Submissions done, failed and remaining: one line each, or a live line on a terminal."""

    def __init__(self, total: int, log: Callable[[str], None],
                 handins: dict[str, dict] | None = None):
        self.total, self.log, self.handins = total, log, handins or {}
        self.counts = {"graded": 0, "needs_review": 0, "invalid": 0}
        self.live = sys.stderr.isatty()

    def done(self, graded: Graded) -> Graded:
        self.counts[graded.status] += 1
        finished = sum(self.counts.values())
        handin = self.handins.get(graded.student_id, {})
        who = ", ".join(x for x in (handin.get("name", ""), "LATE" if handin.get("late") else "")
                        if x)
        remarks = "; ".join(handin.get("remarks", []))
        line = (f"[{finished}/{self.total}] {inert(graded.student_id, 120)}"
                + (f" ({inert(who, 120)})" if who else "") + f": {graded.status}"
                + (f" ({inert(graded.reason)})" if graded.reason else "")
                + (f" [{inert(remarks)}]" if remarks else ""))
        self.log(line)
        if self.live:
            bar = "#" * (30 * finished // self.total)
            print(f"\r[{bar:<30}] {finished}/{self.total} done, "
                  f"{self.counts['needs_review'] + self.counts['invalid']} flagged or failed, "
                  f"{self.total - finished} remaining", end="", file=sys.stderr, flush=True)
        return graded

    def skip(self, student_id: str) -> None:
        name = str(self.handins.get(student_id, {}).get("name") or "")
        self.log(f"skipped {inert(student_id, 120)}" + (f" ({inert(name, 120)})" if name else "")
                 + ": this notebook is graded already (--resume)")
        self.total -= 1

    def finish(self) -> None:
        if self.live:
            print(file=sys.stderr)
