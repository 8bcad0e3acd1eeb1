"""The ``kproxy`` subcommands (run, demo, decode, embedded-broker); ``kproxy.cli``
dispatches to them.
"""
