"""The student's side: their copies of the lessons in JupyterLab, the course's Validate button
(labextension/) and its server side, and progress. Imports the course."""
