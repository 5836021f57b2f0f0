"""The course's content, as the grader reads it: the lessons and their notebooks, the hidden
checks (cases/), the notebook's check helpers, and sync, which keeps notebooks in step with
solutions/. Imports only grader.common."""
