"""Password-key derivations (PBKDF2), computed off the event loop.

A SCRAM key costs 1 to 10 ms of CPU at Kafka's iteration counts (4,096 to 16,384),
more where an operator stores more. On the loop, every other connection's relay waits
that long. ``hashlib`` lets go of the interpreter lock while it derives, so a thread
does it while the loop goes on: one derivation at a time per worker (a worker per
core), so a burst of logins queues instead of crowding the relay off its core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

_ONE_AT_A_TIME: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "kproxy_derivations")


async def derive(compute: Callable[[], T]) -> T:
    """``compute()`` in a thread, after the derivations before it in this process."""
    try:
        limiter = _ONE_AT_A_TIME.get()
    except LookupError:
        limiter = trio.CapacityLimiter(1)
        _ONE_AT_A_TIME.set(limiter)
    return await trio.to_thread.run_sync(compute, limiter=limiter)
