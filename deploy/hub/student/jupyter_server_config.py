"""The course's Validate button (grader/lab/labextension/, built and shipped with the package) in
place of nbgrader's: jupyter_server_config.json beside this turns on the server side
(grader.lab.validate), labconfig/page_config.json turns nbgrader's button off."""

from grader.lab.server import LAB_EXTENSIONS

c = get_config()  # noqa: F821
c.LabApp.extra_labextensions_path = [str(LAB_EXTENSIONS)]
