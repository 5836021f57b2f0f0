"""What every layer of the grader shares: its errors, how a student's text is made
neutral, the faults of its infrastructure, and Python's parser one thread at a time. Imports
nothing else of the grader."""
