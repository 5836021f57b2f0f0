"""Run by every kernel of the student's lab at its start, and again after each restart.

The lab (grader/lab/server.py) and the hub's student servers (deploy/hub/) name this file in
``PYTHONSTARTUP``, which IPython's kernels run before any cell. It installs the one-line
messages of the notebooks' checks cell (grader/content/notebook_checks.py): a cell run after
Kernel > Restart, before the cells above it have run again, says "the kernel restarted: run the
cells above" in one line, not in a traceback. Outside IPython (a plain ``python`` in the lab's
terminal also reads ``PYTHONSTARTUP``) it does nothing. The file runs in the notebook's own
namespace: it leaves no name behind.
"""


def _install_course_messages() -> None:
    try:
        from IPython import get_ipython

        if get_ipython() is not None:
            import grader.content.notebook_checks  # noqa: F401  (installs them on import)
    except Exception:  # a kernel without the course's package starts as usual
        pass


_install_course_messages()
del _install_course_messages
