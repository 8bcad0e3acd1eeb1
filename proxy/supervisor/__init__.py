"""``kproxy run --workers N``: the supervisor process, and what links it to its workers."""
