"""Course tooling: notebook/solution sync, nbgrader release and grading, the student lab."""
