"""Course tooling: notebook/solution sync, nbgrader release and grading, the student lab."""

import sys

# jsonschema, which nbformat validates notebooks with, builds some forty parsers as it is
# imported when rfc3987-syntax is installed (jupyter-events' jsonschema[format-nongpl] extra
# brings it), for its "iri" formats: about a second of every grader and nbgrader command's start
# on a laptop. No schema that the grader or nbgrader checks uses those formats, and jsonschema
# leaves out a format whose checker cannot be imported; so the course's own processes go
# without it. (Too late in a process that has imported jsonschema already: left alone there.)
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)
