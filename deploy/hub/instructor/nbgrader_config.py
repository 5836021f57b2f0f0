"""nbgrader for an instructor on the hub: the course's exchange, and ~/course as the course
folder, so that formgrader shows the gradebook of ``python -m grader --course-dir ~/course``."""

import os

c = get_config()  # noqa: F821
c.Exchange.root = os.environ.get("CTC_EXCHANGE", "/srv/nbgrader/exchange")
c.CourseDirectory.course_id = "counting-the-cost"
c.CourseDirectory.root = os.path.expanduser("~/course")
# (No time limits here: Validate, grader/lab/validate.py, runs the notebook with the course's own.)

# formgrader's grading pages are served by the instructor's own server, where a student's script
# would act with the instructor's session: each submission is made inert first, as on the
# feedback pages (the course directory's own nbgrader_config.py says the same; this file is the
# one formgrader reads here, started in the home folder).
from grader.outputs.exporter import inert_formgrader  # noqa: E402

inert_formgrader(c)
