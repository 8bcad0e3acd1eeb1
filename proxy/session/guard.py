"""How a session's task ends: whatever it raises ends the session, never the proxy.

A context manager the task enters at its top (``with TaskGuard(session): ...``), not a
coroutine that wraps the task: a session's tasks wait for long stretches, and every
coroutine frame a task waits in is memory an idle connection holds.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from kproxy.session.errors import PeerGone, SessionClosed

if TYPE_CHECKING:
    from kproxy.session.session import Session

log = logging.getLogger("kproxy.session")


class TaskGuard:
    """Ends the session when the task fails (logged, and counted if unexpected), or when
    it returns if ``ends_session`` (unless it returns to park the session). Cancellation
    passes through untouched."""

    __slots__ = ("ends_session", "session")

    def __init__(self, session: Session, ends_session: bool = True) -> None:
        self.session = session
        self.ends_session = ends_session

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        session = self.session
        if exc is None:
            if self.ends_session and not session.parking:
                session.close()
            return False
        if not isinstance(exc, Exception):
            return False  # Cancelled, KeyboardInterrupt: not ours to stop
        fields = {"fields": session.conn.log_fields()}
        if isinstance(exc, SessionClosed):
            log.debug("session closed: %s", exc, extra=fields)
        elif isinstance(exc, PeerGone):
            log.debug("session ended: %s", exc, extra=fields)
        else:
            session.services.metrics.internal_errors.inc()
            log.error("internal error in a session; closing it", exc_info=exc, extra=fields)
        session.close()
        return True
