"""When a client connection has been silent too long, as pure functions of the clock.

A new connection must deliver a complete request within the first-request timeout
(a slowloris guard); afterwards, a connection with nothing in flight and no complete
frame either way for the idle timeout is closed (Kafka's connections.max.idle.ms).
A connection waiting for an answer is never idle.
"""

from __future__ import annotations

import math

# A connection whose backend is gone forwards nothing more and ends at the client's next
# request (left unanswered, so it fails at once and the client looks for the new backend
# right away), or after this long if none comes.
GONE_GRACE_S = 1.0


def read_deadline(now: float, first_deadline: float, frames_in: int, in_flight: int,
                  last_activity: float, idle_timeout: float, parks: bool = False) -> float:
    """Until when to wait for the client's next bytes before looking again.

    A busy connection is never idle, so a deadline on its wait only makes it look again.
    One that ``parks`` (plain TCP) needs none: once it has nothing in flight, the
    parking lot's sweep wakes its wait, and the wait after that has the idle deadline.
    No deadline spares trio's deadline heap an entry per request."""
    if not frames_in:
        return first_deadline
    if not idle_timeout or (in_flight and parks):
        return math.inf
    if in_flight:  # busy: look again later
        return now + idle_timeout
    return last_activity + idle_timeout


def expired(now: float, frames_in: int, in_flight: int, last_activity: float,
            idle_timeout: float) -> str | None:
    """Which timeout ends the connection once a read deadline passed, if any."""
    if not frames_in:
        return "first_request_timeout"
    if not in_flight and idle_timeout and now - last_activity >= idle_timeout:
        return "idle_timeout"
    return None


def reason(which: str, first_request_timeout: float, idle_timeout: float) -> str:
    """What the log says when ``which`` (a result of ``expired``) closes a connection."""
    if which == "first_request_timeout":
        return f"no complete request within {first_request_timeout:g}s of connecting"
    return f"idle for {idle_timeout:g}s"
