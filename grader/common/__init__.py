"""What every layer of the grader shares: its errors, how a student's text is made
neutral, and the faults of its infrastructure. Imports nothing else of the grader."""
