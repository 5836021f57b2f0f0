"""The grades as stored: nbgrader's gradebook and the course's own tables beside it (each
submission's status, the review log, submission times), a course directory's nbgrader
commands, the batch that grades a class and stores each submission as one unit, review
decisions, and deadlines as a policy applied when grades are read. Imports grader.common,
grader.content, grader.intake and grader.grading, never grader.outputs."""
