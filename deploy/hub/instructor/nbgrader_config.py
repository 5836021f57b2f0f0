"""nbgrader for an instructor on the hub: the course's exchange, and ~/course as the course
folder, so that formgrader shows the gradebook of ``python -m grader --course-dir ~/course``."""

import os

c = get_config()  # noqa: F821
c.Exchange.root = os.environ.get("CTC_EXCHANGE", "/srv/nbgrader/exchange")
c.CourseDirectory.course_id = "counting-the-cost"
c.CourseDirectory.root = os.path.expanduser("~/course")
# Validate (grader/lab/validate.py) runs the notebook with the course's time limits.
