"""What the grader gives back: grade exports (CSV, Canvas, Moodle), reports, feedback pages
(nbgrader's, with the course's preprocessors and template), similarity, and publishing to
nbgrader's exchange. Imports every layer below it, never the command line."""
