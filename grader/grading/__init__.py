"""Grading one submission: nbgrader's clean-up, a sandboxed kernel (bubblewrap, a cgroup, a
uid of its own), the probes that call each exercise, and the verdicts, judged outside the
kernel; on this machine or on Celery workers. Imports grader.common and grader.content."""
