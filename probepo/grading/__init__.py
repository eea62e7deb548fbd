"""Grading answers with math-verify in worker processes."""
