"""Decisions on decoded messages; pure functions and small state objects, no I/O."""
