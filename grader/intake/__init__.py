"""Taking hand-ins in: a folder or an LMS's zip as it comes (Canvas, Moodle, Blackboard,
Gradescope), nbgrader's exchange, rosters and submission times, each student to one hand-in;
names as the bytes they are, nothing trusted. Imports grader.common and grader.content."""
