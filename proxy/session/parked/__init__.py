"""Sessions without a task: the parking lot that waits for them (``parking``) and the
express lane that relays for them (``express``)."""
