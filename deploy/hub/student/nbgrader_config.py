"""nbgrader for a student on the hub: the course's exchange, for the Assignment List."""

import os

c = get_config()  # noqa: F821
c.Exchange.root = os.environ.get("CTC_EXCHANGE", "/srv/nbgrader/exchange")
c.CourseDirectory.course_id = "counting-the-cost"
# Validate (grader/lab/validate.py) runs the notebook with the course's time limits.
