"""Reference implementations of every graded function, one module per lesson."""
