"""The admin token as its file holds it now: a rotation needs no restart.

``admin_token_file``'s path is read at start; the file itself is looked at again every
second (``AdminToken.watch``). Once it holds a new token (rewritten in place, renamed
over, or a mounted Kubernetes Secret updated), the new token is accepted and the old
one refused. A file that changed into one that cannot serve (unreadable, too short,
readable by every user) leaves the running token in place and says so in the log,
once per change; both outcomes go to the audit log when the process keeps it for its
HTTP port.
"""

from __future__ import annotations

import logging
import os

import trio

from kproxy.config.identity import read_token
from kproxy.config.settings import ConfigError
from kproxy.http.auth import Audit

log = logging.getLogger("kproxy")
CHECK_SECONDS = 1.0  # how often the token file is looked at for a change


class AdminToken:
    """The admin token as ``admin_token_file`` now holds it (None: no token set)."""

    def __init__(self, path: str | None, token: str | None,
                 audit: Audit | None = None) -> None:
        self.path, self._token, self._audit = path, token, audit
        # No stamp yet: the first look reads the file again, in case it changed since
        # ``token`` was read from it (the configuration is read before this is made).
        self._stamp: tuple[int, ...] | None = ()

    async def watch(self) -> None:
        """Look at the file every second for as long as the process serves HTTP."""
        if self.path is None:
            return
        while True:
            await trio.sleep(CHECK_SECONDS)
            self.look()

    def current(self) -> str | None:
        return self._token

    def look(self) -> None:
        """Apply the file's token if the file changed since the last look."""
        if self.path is None:
            return
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            self._reread(self.path)

    def _reread(self, path: str) -> None:
        try:
            token = read_token(path)
        except ConfigError as exc:
            log.error("admin token file changed into one that cannot be used; the running "
                      "token stays", extra={"fields": {"error": str(exc)}})
            self._record("rejected", str(exc))
            return
        if token != self._token:
            self._token = token
            log.info("admin token file changed; the new token applies, the old one no "
                     "longer does", extra={"fields": {"path": path}})
            self._record("applied", None)

    def _record(self, outcome: str, error: str | None) -> None:
        if self._audit is not None:
            self._audit({"event": "admin_token", "outcome": outcome,
                         **({"error": error} if error else {})})


def _stamp(path: str) -> tuple[int, ...] | None:
    """What tells a changed file: a rotation by rename (as a Secret's symlink swap), a
    rewrite in place, a chmod. None: it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size
