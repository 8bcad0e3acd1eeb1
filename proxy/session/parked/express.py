"""The express lane: small frames of busy sessions relayed off trio's scheduling.

Waiting for a socket through trio costs more than the rest of a small request's relay
(docs/architecture.md, "What a small request costs"): the run loop, a task switch and
a one-shot re-arm per wait. A session that is *parked* (``kproxy.session.parked.parking``: no
task, its sockets in the parking lot's epoll) is waited for by one thread per worker
instead, which relays what it can of each readable socket on the spot, with the same
policy calls the trio path makes (``ConnectionState.request`` and ``.response``), and
leaves the session parked. A busy session whose every request is small parks at its
first idle moment after its second request (``Session.lane_ready``) and stays parked
from request to request.

**One at a time.** The lane thread and trio never run Python at once: ``Turns`` is
trio's except while it waits for I/O (a trio instrument gives it up in
``before_io_wait`` and takes it back in ``after_io_wait``), and the lane's while it
handles a batch of events; when both want it, they alternate. To the
proxy's code the process stays single-threaded: no state needs a lock of its own, and
nothing here calls trio (the lane reads trio's clock object directly, and asks trio
for anything else with ``TrioToken.run_sync_soon``).

**What it relays.** Whole frames, from the front of what one receive (``LANE_BYTES``)
brought: a request whose handler decides without waiting (``ConnectionState.in_lane``),
relayed, replaced or answered here (a small telemetry push), and a response whatever
its handler, as the trio path would (``responses.respond_now``). It stops at the first
frame it cannot relay (a partial or large frame, a stray response, quotas on, a drain)
or a decision only trio can carry out (an answer made later, a refusal: kept in
``Session.lane_decided``, not made again) and hands the session back to its trio
tasks: the bytes not relayed wait in the transport (``SocketTransport.carry``), a
write the kernel did not take whole in ``ClientWriter.pending`` or
``Session.upstream_pending``, and the session runs again as a woken parked session
does. A session handed back soon after it parked, twice in a row, does not park at once
again for ``BACKOFF_S``: a session whose requests need trio (a producer's large
batches) does not go back and forth.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import frame
from kproxy.codecs.peek import peek_correlation_id, peek_request
from kproxy.policies.connection import Answer, Forward
from kproxy.session.relay import LOCAL_WORK_S
from kproxy.session.responses import respond_now
from kproxy.session.transport import Buffer, SocketTransport

if TYPE_CHECKING:
    from kproxy.session.session import Session

log = logging.getLogger("kproxy.session")

# One receive in the lane asks for this much: a small request or response is whole in
# it; the start of a large one is handed to the trio path with what was received.
LANE_BYTES = 64 * 1024
# A session handed back to trio twice in a row after fewer than ``MIN_RUN`` requests
# relayed in the lane parks at once again only after ``BACKOFF_S`` (meanwhile after the
# parking lot's usual idle time): a session whose every request needs trio pays a park
# and a wake-up twice in that time at most. One that needs trio now and then (a
# telemetry request among many small ones) goes back to the lane at its next idle
# moment.
MIN_RUN = 8
BACKOFF_S = 1.0


# In the lane's thread: trio's token (``call_in_trio``).
_in_lane = threading.local()


def call_in_trio(fn: Callable[..., object], *args: object) -> None:
    """Call ``fn`` in trio's thread: at once from there, soon from the lane's (where
    nothing may call trio: a listener that sets a trio event, reads trio's clock)."""
    token: trio.lowlevel.TrioToken | None = getattr(_in_lane, "token", None)
    if token is None:
        fn(*args)
    else:
        token.run_sync_soon(_contained, fn, *args)


def _contained(fn: Callable[..., object], *args: object) -> None:
    """``fn`` called by trio's run loop: what it raises is logged, not trio's to die of."""
    try:
        fn(*args)
    except Exception:
        log.exception("internal error in a call the express lane left to trio")


class Turns(trio.abc.Instrument):
    """Whose turn it is to run Python: trio's, but while it waits for I/O, and the
    lane's for each batch of events. When both want it, they alternate: a busy trio
    (which waits for I/O with no timeout between its passes) cannot keep the lane
    waiting, nor a busy lane trio. A plain lock is not fair that way: whoever just gave
    it up takes it back first.

    The turn itself is a plain lock, taken without waiting when it is free and the
    other side does not ask for it: the usual case, since each side holds it only
    while it runs. A condition variable serves only when one side must wait: it is
    Python code, and taking and giving the turn through it was about 8% of the lane's
    profiled time at 1,000 requests a second. The flags are read and written under
    the interpreter lock, and a side that asks sets its flag before it tries the lock,
    so the side that gives the turn up either sees the flag (and wakes it) or has
    released the lock before the try."""

    def __init__(self) -> None:
        self._turn = threading.Lock()  # held by whoever runs
        self._cond = threading.Condition(threading.Lock())  # only to wait and wake
        self._asks = {"trio": False, "lane": False}
        self._next = "lane"  # whose turn it is when both ask

    def _take(self, me: str, other: str) -> None:
        if not self._asks[other] and self._turn.acquire(blocking=False):
            return
        with self._cond:
            self._asks[me] = True
            while (self._asks[other] and self._next == other) or not self._turn.acquire(
                    blocking=False):
                self._cond.wait()
            self._asks[me] = False

    def _give(self, me: str, other: str) -> None:
        self._turn.release()
        if self._asks[other]:
            with self._cond:
                self._next = other
                self._cond.notify()

    # trio's side: the instrument's hooks, and the start and end of the lane.

    def trio_takes(self) -> None:
        self._take("trio", "lane")

    def trio_gives(self) -> None:
        self._give("trio", "lane")

    # Called on every pass of trio's loop: the usual case inline, without ``_give`` and
    # ``_take``'s calls (a bulk transfer's passes pay them, not only the lane's requests).

    def before_io_wait(self, timeout: float) -> None:
        self._turn.release()
        if self._asks["lane"]:
            with self._cond:
                self._next = "lane"
                self._cond.notify()

    def after_io_wait(self, timeout: float) -> None:
        if self._asks["lane"] or not self._turn.acquire(blocking=False):
            self._take("trio", "lane")

    # The lane's side: ``with turns:`` around a batch, the usual case inline as trio's.

    def __enter__(self) -> None:
        if self._asks["trio"] or not self._turn.acquire(blocking=False):
            self._take("lane", "trio")

    def __exit__(self, *exc: object) -> None:
        self._turn.release()
        if self._asks["trio"]:
            with self._cond:
                self._next = "trio"
                self._cond.notify()


class ExpressLane:
    """The thread that waits on the parking lot's epoll and relays what it can."""

    def __init__(self, epoll: select.epoll,
                 on_ready: Callable[[int, float], None]) -> None:
        self._epoll = epoll
        self._on_ready = on_ready  # (descriptor, trio time): relay it, or wake its session
        self.turns = Turns()
        self._stop_r, self._stop_w = os.pipe()
        self._clock: trio.abc.Clock | None = None

    async def run(self) -> None:
        """Run the lane until cancelled; the thread has ended when this returns."""
        self._clock = trio.lowlevel.current_clock()
        turns = self.turns
        turns.trio_takes()  # trio is running
        trio.lowlevel.add_instrument(turns)
        self._epoll.register(self._stop_r, select.EPOLLIN)
        thread = threading.Thread(target=self._loop, args=(trio.lowlevel.current_trio_token(),),
                                  name="kproxy-express-lane", daemon=True)
        thread.start()
        try:
            await trio.sleep_forever()
        finally:
            os.write(self._stop_w, b"x")
            with trio.CancelScope(shield=True):
                # Waiting for the thread is waiting for I/O: the lane gets its turn to end.
                await trio.to_thread.run_sync(thread.join)
            trio.lowlevel.remove_instrument(turns)
            turns.trio_gives()
            with contextlib.suppress(OSError):
                self._epoll.unregister(self._stop_r)
            os.close(self._stop_r)
            os.close(self._stop_w)

    def _loop(self, token: trio.lowlevel.TrioToken) -> None:
        epoll, stop, clock, turns = self._epoll, self._stop_r, self._clock, self.turns
        assert clock is not None
        _in_lane.token = token
        while True:
            try:
                events = epoll.poll()
            except InterruptedError:
                continue
            with turns:
                now = clock.current_time()
                for fd, _ in events:
                    if fd == stop:
                        return
                    try:
                        self._on_ready(fd, now)
                    except Exception:  # the lane must outlive one session's fault
                        log.exception("internal error in the express lane")


# ------------------------------------------------------------------ the relay


def relay_requests(session: Session, client: SocketTransport, upstream: SocketTransport,
                   now: float) -> bool:
    """The client's socket is readable: forward the whole requests at the front of one
    receive. False: hand the session to trio (what was not forwarded is carried)."""
    data = _receive(client)
    if data is None:
        return True  # nothing there after all
    if not data:  # the client left: the session is closed where it is handed back
        session.lane_eof = True
        return False
    if session.lane_closed():
        client.carry = data
        return False
    conn, ordered, metrics = session.conn, session.ordered, session.services.metrics
    view = memoryview(data)
    out: list[Buffer] = []
    pos = taken = answered = 0
    began = time.monotonic()
    config = session.services.config  # read each time: a reload applies
    room = config.max_inflight - len(ordered)
    for start, size in _whole_frames(view, config.max_frame_bytes):
        if taken >= room:
            break
        body = view[start:start + size]
        try:
            peek = peek_request(body)
        except CodecError:
            break  # the trio path reports it and closes
        if not conn.in_lane(peek.api_key):
            break
        decision = conn.request(peek, body)
        metrics.api(peek.api_key).request(size + 4)
        session.bytes_in += size + 4
        session.frames_in += 1
        upstream_version = peek.api_version
        if decision is None:
            out.append(view[pos:start + size])
        elif isinstance(decision, Forward):
            out.append(frame(decision.body))
            upstream_version = decision.upstream_version
        elif isinstance(decision, Answer):  # answered here, in its turn
            ordered.answer_locally(peek.correlation_id, peek.api_key, peek.api_version,
                                   time.monotonic(), frame(decision.body))
            answered += 1
            taken += 1
            pos = start + size
            if time.monotonic() - began > LOCAL_WORK_S:
                break  # answers that took work: trio takes the rest, with others between
            continue
        else:  # answered later, refused or closed: trio carries it out, as decided
            session.lane_decided = (peek, decision)
            pos = start + size
            break
        ordered.expect(peek, time.monotonic(), upstream_version)
        taken += peek.expects_response
        pos = start + size
    if out or answered:
        metrics.lane.requests += len(out) + answered
        session.lane_run += len(out) + answered
        session.last_activity = now
    if out:
        rest = upstream.write_now(out)
        if rest:
            session.upstream_pending = tuple(bytes(b) for b in rest)
    if answered:
        session.writer.write_now()
    if (pos < len(data) or session.upstream_pending or session.writer.pending
            or session.lane_decided is not None):
        client.carry = data[pos:] if pos < len(data) else None
        return False
    return True


def relay_responses(session: Session, client: SocketTransport, upstream: SocketTransport,
                    now: float) -> bool:
    """The broker's socket is readable: answer with the whole responses at the front of
    one receive. False: hand the session to trio."""
    data = _receive(upstream)
    if data is None:
        return True
    if not data or session.lane_closed():
        upstream.carry = data or None
        return False
    ordered = session.ordered
    view = memoryview(data)
    pos = 0
    needs_trio = False
    for start, size in _whole_frames(view, session.services.config.max_frame_bytes):
        body = view[start:start + size]
        try:
            correlation_id = peek_correlation_id(body)
        except CodecError:
            break
        if not ordered.expects_next(correlation_id):
            break  # a stray answer or a protocol violation: the trio path says which
        slot = ordered.next_upstream(correlation_id)
        assert slot is not None  # expects_next: the oldest slot, neither stray nor wrong
        wire, pos = view[pos:start + size], start + size
        try:
            later = respond_now(session, slot, wire, body)
        except CodecError as exc:  # a handler could not read it: the session ends over it
            session.lane_failed = exc
            return False
        if later is not None:  # a handler's finding the proxy must act on first
            session.catch_up = later
            needs_trio = True
            break
    if pos:
        session.last_activity = now
    if not needs_trio and not session.writer.close_after_flush:
        session.writer.write_now()
    if (pos < len(data) or needs_trio or session.writer.pending
            or session.writer.close_after_flush):
        upstream.carry = data[pos:] if pos < len(data) else None
        return False
    return True


def _whole_frames(view: memoryview, largest: int) -> list[tuple[int, int]]:
    """(where its body starts, its size) of each whole frame at the front of ``view``,
    up to the first that is not whole, or whose size is the trio path's to judge (out
    of range: it reports and closes). A list, not a generator: the usual receive holds
    one frame, and a generator's creation and resumptions cost more than the loop."""
    frames = []
    pos, end = 0, len(view)
    while pos + 4 <= end:
        size = int.from_bytes(view[pos:pos + 4], "big", signed=True)
        if not 0 <= size <= largest or pos + 4 + size > end:
            break
        frames.append((pos + 4, size))
        pos += 4 + size
    return frames


def _receive(io: SocketTransport) -> bytes | None:
    """One receive: bytes, b"" at the end of the stream or on an error (the trio path
    reads again and reports it), or None when there was nothing."""
    try:
        return os.read(io.fd, LANE_BYTES)
    except BlockingIOError:
        return None
    except OSError:
        return b""
