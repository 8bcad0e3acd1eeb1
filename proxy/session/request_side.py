"""The request side of a session: its wait for the client's bytes, and what it takes.

It runs in the session's own task (``Session._run``): it reads the client into a
``FrameReader``, hands each complete request to ``relay.handle_requests`` and the start
of a large one to ``relay.splice_request``, enforces the first-request and idle
timeouts and the memory budget before a read, and decides when the session parks
(``_may_park``; at once for the express lane, ``lane_ready``). It is a part of
``Session`` kept in a module of its own; the names it shares with the rest of the
session are declared below for the type checker.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import trio

from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.peek import RequestPeek
from kproxy.config.settings import Config
from kproxy.context import SessionServices
from kproxy.memory import Charge
from kproxy.policies import timeouts
from kproxy.policies.connection import AnswerLater, Close, ConnectionState, Handled, Refuse
from kproxy.session import throttle
from kproxy.session.client_writer import ClientWriter
from kproxy.session.errors import PeerGone, SessionClosed
from kproxy.session.inflight import OrderedResponses
from kproxy.session.parked import parking
from kproxy.session.relay import PEEK_BYTES, RECV_BYTES, handle_requests, splice_request
from kproxy.session.transport import Transport

if TYPE_CHECKING:
    from kproxy.session.session import Session


class RequestSide:
    """``Session``'s request side (a base class of it)."""

    # Its own: the wait for the client's bytes, how much a receive asks for, whether it
    # parked, and whether it takes no more requests.
    __slots__ = ("_draining", "_parking", "_recv_bytes", "_recv_scope")
    _draining: bool
    _parking: bool
    _recv_bytes: int
    _recv_scope: trio.CancelScope | None

    if TYPE_CHECKING:  # what it shares with the rest of the session (session.py)
        services: SessionServices
        conn: ConnectionState
        ordered: OrderedResponses
        writer: ClientWriter
        frames_in: int
        last_activity: float
        mute_until: float
        upstream_pending: tuple[bytes, ...]
        catch_up: Handled | None
        lane_after: float
        lane_failed: CodecError | None
        lane_decided: tuple[RequestPeek, AnswerLater | Refuse | Close] | None
        _client_io: Transport
        _upstream_io: Transport | None
        _nursery: trio.Nursery | None
        _end_at_request: bool
        _closing: bool

        @property
        def config(self) -> Config: ...
        def close(self) -> None: ...
        def note_idle(self) -> None: ...
        def _plain_tcp(self) -> bool: ...
        async def _after_lane(self) -> None: ...

    async def _requests(self) -> None:
        cfg = self.config
        if (self.upstream_pending or self.catch_up is not None or self.writer.pending
                or self.writer.close_after_flush or self.lane_failed is not None
                or self.lane_decided is not None):
            await self._after_lane()
        reader = FrameReader(cfg.max_frame_bytes)
        charge = Charge(self.services.budget)
        first_deadline = trio.current_time() + cfg.first_request_timeout
        client = self._client_io
        try:
            stop = False
            while not (stop or self._draining):
                # One scope serves the waits for the client's bytes, from one wait to the
                # next until something cancels it (a scope per wait was most of what a
                # small request's read cost). Only a wait is ever cancelled by it: a drain
                # or the parking lot reach it only while the task waits in it
                # (``_recv_scope`` is set for the wait alone), and it has a deadline only
                # during a wait. A request already taken is always sent upstream and
                # answered.
                scope = trio.CancelScope()
                late: int | None = None  # what a wait received as it was cancelled
                with scope:
                    while not self._draining:
                        if not reader.held() and not charge.room_now():
                            # Between frames: wait for room in the budget before taking
                            # more. Mid-frame, never: a partial frame is only freed by
                            # completing it.
                            await charge.wait_for_room()
                        # Throttled (quotas): not a byte read until the throttle passes, or
                        # a drain.
                        if self.mute_until and await throttle.wait_unmuted(
                                cast("Session", self)):
                            stop = True
                            break
                        n = client.fill_now(reader, self._recv_bytes)
                        if n is None:
                            if not len(self.ordered) and not reader.held():
                                if self.lane_ready() and self._may_park(reader, True):
                                    self._check_timeouts()  # woken by its idle deadline
                                    self._park_now()
                                    return
                                self.note_idle()
                            # A drain or the parking lot cancels the wait, the read deadline
                            # expires it.
                            deadline = timeouts.read_deadline(
                                trio.current_time(), first_deadline, self.frames_in,
                                len(self.ordered), self.last_activity,
                                self.config.idle_timeout,
                                self._plain_tcp() and not self._end_at_request)
                            if deadline != math.inf:
                                scope.deadline = deadline
                            self._recv_scope = scope
                            n = await client.fill(reader, self._recv_bytes)
                            self._recv_scope = None
                            if scope.cancel_called:  # too late to stop the wait: its bytes
                                late = n  # are taken outside the scope
                                break
                            if deadline != math.inf:
                                scope.deadline = math.inf
                        if not await self._take(reader, charge, n):
                            stop = True
                            break
                self._recv_scope = None
                if late is not None:
                    stop = not await self._take(reader, charge, late)
                elif scope.cancelled_caught:
                    if self._draining:
                        break
                    self._check_timeouts()
                    if self._may_park(reader, self.lane_ready()):
                        self._park_now()
                        return
        finally:
            charge.release()
        # Draining: wait until every request already taken has been answered.
        with trio.move_on_after(cfg.drain_timeout):
            while len(self.ordered):
                await self.writer.answers_left()
        self.close()

    def _park_now(self) -> None:
        """Park: the response side stops at its wait for the broker."""
        self._parking = True
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _take(self, reader: FrameReader, charge: Charge, n: int) -> bool:
        """What a receive of ``n`` bytes (0: the end of the stream) brought: take its
        requests. False when the session takes no more."""
        if not n:
            raise PeerGone("client closed the connection")
        charge.settle(reader.held())
        if self._end_at_request:
            self._draining = True  # not forwarded: it fails when the connection closes
            return False
        session = cast("Session", self)
        await handle_requests(session, reader)
        held = reader.held()
        charge.settle(held)
        # After a spliced request the next receive asks for only enough to peek the next
        # one's header: a producer's next batch is likely large too, and what is received
        # into the process is copied in and out, where the rest is spliced past it.
        spliced = bool(held) and await splice_request(session, reader, charge)
        self._recv_bytes = PEEK_BYTES if spliced else RECV_BYTES
        return True

    def _check_timeouts(self) -> None:
        """A read deadline passed: close a silent new connection or an idle one."""
        cfg = self.config
        which = timeouts.expired(trio.current_time(), self.frames_in, len(self.ordered),
                                 self.last_activity, cfg.idle_timeout)
        if which is not None:
            msg = timeouts.reason(which, cfg.first_request_timeout, cfg.idle_timeout)
            self.services.events.limit_hit(which, f"{msg}; closed", self.conn)
            raise SessionClosed(which.replace("_", " "))

    def _may_park(self, reader: FrameReader, at_once: bool = False) -> bool:
        """Whether both tasks may return now, the sockets and state kept: idle for
        ``PARK_AFTER_S`` (or ``at_once``), nothing in flight, buffered or being written,
        no task but the response side (waiting for the broker), not ending."""
        nursery = self._nursery
        return (nursery is not None and not len(self.ordered) and not reader.held()
                and (at_once or trio.current_time() - self.last_activity
                     >= parking.PARK_AFTER_S)
                and not (self._draining or self._end_at_request or self._closing)
                and not self.writer.lock.locked() and not self.writer.close_after_flush
                and trio.current_time() >= self.mute_until  # a muted channel stays awake
                and self._plain_tcp()
                and len(nursery.child_tasks) == (self._upstream_io is not None))

    def lane_ready(self) -> bool:
        """Whether the session parks at its next idle moment, for the express lane to
        relay its next requests: the lane runs, the broker connection is open, no quotas,
        no SASL at the proxy, and no backing off (``express.BACKOFF_S``)."""
        services = self.services
        # Not before its second request: a new connection keeps its first-request
        # deadline, the lane relays only with a broker to relay to, and a connection
        # that asks once and closes (a health check, a version probe) would pay for a
        # park it never uses (0.58 ms of CPU a connection instead of 0.48).
        return (services.parking.lane_running and self.frames_in >= 2
                and self._upstream_io is not None and not services.quotas.enabled
                and self.conn.shared.sasl_gate is None
                and trio.current_time() >= self.lane_after)
