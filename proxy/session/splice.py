"""Relaying the rest of a large frame socket to pipe to socket, never copied into Python.

Once a frame's header is peeked and nobody needs its body, ``splice_exactly`` moves
the bytes still to come with ``os.splice`` (Linux): from the source socket into a
pipe, and from the pipe into the destination socket. The kernel passes page
references; the proxy's process never holds the bytes, and a 1 MB produce batch costs
a few dozen system calls instead of a receive, an assembly and a ``writev``.

Backpressure stays as it was: a pipe holds at most ``Pipe.size`` bytes (asked for as
``PIPE_BYTES``), and while it is full nothing more is read from the source, so a slow
reader slows its sender and the proxy holds one pipe's worth. The caller counts that
against the memory budget, as it counted the copy path's receive buffer.

Pipes come from one pool per process (``PIPES``), borrowed for one frame and given
back empty: an idle connection holds none, and at most ``MAX_PIPES`` are open at once
(their descriptors are reserved in the open-file budget, ``PIPE_FDS``). When the pool
is spent, or splice is unavailable (not Linux, TLS on either side), the copy path
relays the frame as before. A pipe that may still hold bytes (a relay cut short) is
closed, never reused.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import trio

from kproxy.session.errors import PeerGone, SessionClosed

AVAILABLE = sys.platform == "linux" and hasattr(os, "splice")
# What each pipe is asked to hold (F_SETPIPE_SZ): a producer's whole batch (1 MB by
# default), so it moves in a few splices; pipe-max-size's default allows it.
PIPE_BYTES = 1024 * 1024
MAX_PIPES = 32  # open at once per process; beyond, frames take the copy path
PIPE_FDS = 2 * MAX_PIPES
# After this many splices that did not wait, yield once to the scheduler.
FAIRNESS_OPS = 16
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named in the fcntl module from 3.10 on Linux)
_F_GETPIPE_SZ = 1032
_FLAGS = (os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK) if AVAILABLE else 0


class Pipe:
    """One kernel pipe: ``r`` and ``w`` descriptors, ``size`` bytes of capacity."""

    __slots__ = ("r", "size", "w")

    def __init__(self) -> None:
        import fcntl  # Linux only, as is this class

        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Refused past the per-user pipe limit: the default size then serves.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.w, _F_SETPIPE_SZ, PIPE_BYTES)
        self.size: int = fcntl.fcntl(self.w, _F_GETPIPE_SZ)

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class PipePool:
    """Pipes borrowed for one frame each; at most ``limit`` open at once."""

    __slots__ = ("_idle", "frames", "limit", "opened")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.opened = 0  # open pipes, idle or lent
        self.frames = 0  # frames whose rest went through a pipe of this pool
        self._idle: list[Pipe] = []

    def take(self) -> Pipe | None:
        """An empty pipe, or None: the pool is spent (or pipes cannot be made)."""
        if self._idle:
            return self._idle.pop()
        if self.opened >= self.limit:
            return None
        try:
            pipe = Pipe()
        except OSError:  # out of descriptors: the copy path needs none
            return None
        self.opened += 1
        return pipe

    def give_back(self, pipe: Pipe, empty: bool) -> None:
        """Return ``pipe``; one that may hold bytes (``empty`` False) is closed."""
        if empty:
            self.frames += 1
            self._idle.append(pipe)
            return
        pipe.close()
        self.opened -= 1


PIPES = PipePool(MAX_PIPES)


async def splice_exactly(src: int, dst: int, n: int, pipe: Pipe, *, read_timeout: float,
                         write_timeout: float) -> None:
    """Move exactly ``n`` bytes from socket ``src`` to socket ``dst`` through ``pipe``.

    Waits for the source at most ``read_timeout`` at a time (``math.inf``: as long as
    it takes) and for room at the destination at most ``write_timeout``. Raises
    ``PeerGone`` when either side goes away, ``SessionClosed`` on a timeout; either, or
    a cancellation, leaves the frame cut short: the caller must end the connection.
    """
    splicing = _Splicing(src, dst, n, pipe)
    # The bytes already there move without a cancel scope: one is made only when a wait
    # is needed (its entry and exit were most of the Python of a rest that never waits).
    if await splicing.move():
        return
    # One scope serves every wait of the frame: its deadline is set for a wait and lifted
    # after it (a scope per wait cost about a third of a large produce's Python).
    reason = ""
    with trio.CancelScope() as scope:
        while True:
            if splicing.in_pipe:  # bytes to write and nowhere to put them: wait for room
                reason, timeout, wait, fd = ("write timed out", write_timeout,
                                             trio.lowlevel.wait_writable, dst)
            else:
                reason, timeout, wait, fd = ("no bytes of a frame's rest within the read "
                                             "timeout", read_timeout,
                                             trio.lowlevel.wait_readable, src)
            if timeout != math.inf:
                scope.deadline = trio.current_time() + timeout
                await wait(fd)
                scope.deadline = math.inf
            else:
                await wait(fd)
            splicing.drained = False
            if await splicing.move():
                break
    if scope.cancelled_caught:
        raise SessionClosed(reason)


class _Splicing:
    """One frame's rest on its way: what is still to read (``n``), what the pipe holds
    (``in_pipe``), and what is known of the source."""

    __slots__ = ("drained", "dst", "ended", "in_pipe", "n", "pipe_r", "pipe_w", "size",
                 "src")

    def __init__(self, src: int, dst: int, n: int, pipe: Pipe) -> None:
        self.src, self.dst, self.n = src, dst, n
        self.size, self.pipe_r, self.pipe_w = pipe.size, pipe.r, pipe.w
        self.in_pipe = 0
        # The source closed: what the pipe holds still goes out, then the frame ends.
        self.ended = False
        # A splice from the socket that moved less than it asked for emptied its receive
        # queue: the next one would find nothing (EAGAIN, a system call for nothing), so
        # the source is left alone until a wait says it is readable again.
        self.drained = False

    async def move(self) -> bool:
        """Splice until done (True) or until nothing moves without a wait (False)."""
        ops = 0
        src, dst, size, pipe_r, pipe_w = self.src, self.dst, self.size, self.pipe_r, self.pipe_w
        n, in_pipe = self.n, self.in_pipe
        try:
            while n or in_pipe:
                if self.ended and not in_pipe:
                    raise PeerGone("closed in the middle of a frame")
                moved = False
                if n and in_pipe < size and not self.ended and not self.drained:
                    want = min(n, size - in_pipe)
                    try:
                        got = os.splice(src, pipe_w, want, None, None, _FLAGS)
                    except BlockingIOError:  # nothing to read, or the pipe is full
                        got = -1
                        self.drained = in_pipe == 0  # an empty pipe did not stop it
                    except OSError as exc:
                        raise _gone(exc) from exc
                    if not got:
                        self.ended = True
                        continue
                    if got > 0:
                        n -= got
                        in_pipe += got
                        moved = True
                        self.drained = got < want
                if in_pipe:
                    try:
                        put = os.splice(pipe_r, dst, in_pipe, None, None, _FLAGS)
                    except BlockingIOError:  # the destination's send buffer is full
                        put = 0
                    except OSError as exc:
                        raise _gone(exc) from exc
                    in_pipe -= put
                    moved = moved or put > 0
                if not moved:
                    return False
                ops += 1
                # One busy frame must not starve the others; never after its last byte,
                # though: its answer could reach the response side before the caller
                # expects it.
                if ops >= FAIRNESS_OPS and (n or in_pipe):
                    ops = 0
                    await trio.lowlevel.checkpoint()
            return True
        finally:
            self.n, self.in_pipe = n, in_pipe


def _gone(exc: OSError) -> PeerGone:
    return PeerGone(exc.strerror or type(exc).__name__)
