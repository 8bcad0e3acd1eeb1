"""The tie between a worker and its supervisor: whose signals a worker obeys, and
that it does not outlive the supervisor.

Workers run in a session of their own, so a signal sent to the supervisor's process
group (Ctrl-C in a terminal, an init that signals the group) reaches the supervisor
only, which passes one drain on to each worker. Without that, each worker got the
signal twice, once from the group and once from the supervisor, and the second one
killed it mid-drain, losing the archive it was about to close.

A worker ends with its supervisor, drained like on SIGTERM: it watches the
supervisor's pid through a pidfd. Not ``PR_SET_PDEATHSIG``: trio starts processes
from a worker thread, and that signal follows the thread that forked, which trio
retires after a few idle seconds.

A worker started by a supervisor (the environment says so) takes its first
SIGTERM/SIGINT as "drain" and ignores the next ones: they are echoes of the same
stop, through a group or a cgroup. "Stop now" is the supervisor's to decide, on a
second signal of its own, by killing the workers.

A supervisor calls its workers' HTTP ports with a secret it makes at start and hands
each worker in its environment (``WORKER_SECRET_ENV``), not with the admin token: a
rotated token file is seen by each process when it next looks, and the calls between
them must not fail in between (``kproxy.http.auth``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import trio

log = logging.getLogger("kproxy")
SUPERVISOR_ENV = "KPROXY_SUPERVISOR_PID"
WORKER_SECRET_ENV = "KPROXY_WORKER_SECRET"
POLL_SECONDS = 1.0  # where pidfds are missing: how often the parent is looked at


def worker_env(secret: str) -> dict[str, str]:
    """The environment a worker is started with: this one, plus who supervises it and
    the secret its supervisor's calls come with."""
    return {**os.environ, SUPERVISOR_ENV: str(os.getpid()), WORKER_SECRET_ENV: secret}


def worker_secret() -> str | None:
    """The supervisor's secret, when this process is one of its workers; taken out of
    the environment, so nothing this process starts inherits it."""
    secret = os.environ.pop(WORKER_SECRET_ENV, None)
    return secret if secret and supervisor_pid() is not None else None


def supervisor_pid() -> int | None:
    """The supervisor's pid when this process is one of its workers, else None."""
    try:
        pid = int(os.environ.get(SUPERVISOR_ENV, ""))
    except ValueError:
        return None
    return pid if pid > 0 else None


async def watch_supervisor(pid: int, stop: Callable[[], None]) -> None:
    """Calls ``stop`` once the supervisor ``pid`` has exited (however it ended)."""
    if os.getppid() == pid:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None
        except (AttributeError, OSError):  # no pidfds: look at the parent now and then
            while os.getppid() == pid:
                await trio.sleep(POLL_SECONDS)
            fd = None
        if fd is not None:
            try:
                await trio.lowlevel.wait_readable(fd)  # readable once the process exits
            finally:
                os.close(fd)
    log.warning("the supervisor is gone; draining", extra={"fields": {"supervisor": pid}})
    stop()
