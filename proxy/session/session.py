"""One client connection and its one upstream connection: the I/O of a connection.

The session moves bytes, keeps responses in request order, enforces timeouts and the
memory budget, and applies what its ``ConnectionState`` (``policies.connection``)
decides; it makes no protocol decision itself.

Requests (``kproxy.session.request_side``, in the session's own task, and
``kproxy.session.relay.handle_requests``): the upstream connection is opened when the
first complete request arrives (a connection that never sends one costs no broker
connection). Each request is peeked, handed to the state, and forwarded as received,
replaced, or answered here.

Responses (``kproxy.session.relay.relay_responses``, a task started with the
upstream connection): a response no handler needs whole is relayed as it arrives. Small ones
are batched and written without copying; a large one is passed through chunk by
chunk (cut-through), so a 50 MB fetch costs one receive buffer, not 50 MB. A
response a handler must see whole (addresses to rewrite) is received in place, its
size reserved from the budget first. Writes to the client go through the session's
``ClientWriter`` (``kproxy.session.client_writer``): whole frames, in order, one at a time.

Idle (nothing in flight, buffered or being written, plain TCP both ways), a session
parks: both tasks return, its sockets and state stay, and the proxy's parking lot
(``kproxy.session.parked.parking``) waits on its sockets with everyone else's. Anything that reaches
a session (bytes or a close on either socket, its idle deadline, a drain, a close, its
backend gone) runs it again. It is counted open, and reported closed, once.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import Frame
from kproxy.codecs.peek import RequestPeek
from kproxy.config.settings import Config
from kproxy.context import SessionServices
from kproxy.policies import timeouts
from kproxy.policies.connection import AnswerLater, Close, ConnectionState, Handled, Refuse
from kproxy.session import splice
from kproxy.session.client_writer import ClientWriter, send_all
from kproxy.session.errors import SessionClosed
from kproxy.session.guard import TaskGuard
from kproxy.session.inflight import OrderedResponses
from kproxy.session.latency_sketch import LatencySketch
from kproxy.session.parked import express
from kproxy.session.relay import RECV_BYTES, relay_responses, take_decided
from kproxy.session.request_side import RequestSide
from kproxy.session.transport import Buffer, SocketTransport, Transport, transport_for

log = logging.getLogger("kproxy.session")


class Session(RequestSide):
    # Slots: one of these per open connection, thousands when they idle.
    # (The request side's own are in ``RequestSide``.)
    __slots__ = ("_client_io", "_closed", "_closing", "_end_at_request", "_ended", "_nursery",
                 "_on_end", "_upstream_io", "bytes_in", "catch_up", "client", "conn", "frames_in",
                 "handing_back", "lane_after", "lane_decided", "lane_eof", "lane_failed",
                 "lane_run", "lane_short", "last_activity", "listener", "mute_scope",
                 "mute_until", "opened_at", "ordered", "park_order", "parked", "services",
                 "upstream", "upstream_pending", "writer")

    def __init__(self, services: SessionServices, client: trio.abc.Stream, listener: str,
                 node_id: int | None, peer: tuple[str, int],
                 on_end: Callable[[Session], None]) -> None:
        self.services = services
        self.client = client
        self.listener = listener
        self.conn = ConnectionState(services.state, services.handlers, listener, node_id, peer)
        self.upstream: trio.abc.Stream | None = None
        # How the relay moves bytes on each side (see kproxy.session.transport).
        self._client_io: Transport = transport_for(client)
        self._upstream_io: Transport | None = None
        self.ordered = OrderedResponses()
        # The timeout is read from the services, not through ``self``: a session in a
        # reference cycle would wait for the cyclic collector instead of going at close.
        self.writer = ClientWriter(self._client_io, self.ordered, services.metrics,
                                   lambda: services.config.write_timeout)
        # For the idle and first-request timeouts: complete frames either way.
        self.frames_in = 0
        self.last_activity = trio.current_time()
        self.bytes_in = 0
        self.opened_at = time.time()
        self._draining = False
        self._end_at_request = False
        self._closing = False  # close() was called: the run ends, and never parks
        self._parking = False  # the request side parked: the tasks stop, the sockets stay
        self.parked = False  # held by the parking lot (kproxy.session.parked), no task running
        self.park_order = -1  # which of the lot's parks it is in (the lot's to set)
        self._recv_scope = None  # the wait for the client's bytes
        # How much one receive from the client asks for (see ``_take``).
        self._recv_bytes = RECV_BYTES
        # Quotas (kproxy.session.throttle): no request is read before this (trio time).
        self.mute_until = 0.0
        self.mute_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._ended = False
        self._closed: trio.Event | None = None  # made only when someone waits (a drain)
        # The express lane (kproxy.session.parked.express): what it left for the session's tasks
        # (a write the kernel did not take whole, a backend finding to act on first), and
        # the time (trio's) before which the session does not park at once again.
        # Empty tuples, not lists: nothing held per idle connection.
        self.upstream_pending: tuple[bytes, ...] = ()
        self.catch_up: Handled | None = None  # one at most: the lane hands back at it
        self.lane_after = 0.0
        self.lane_run = 0  # requests the lane relayed since it last handed the session back
        self.lane_short = 0  # hand-backs in a row after fewer than express.MIN_RUN
        self.handing_back = False  # the lane asked trio to run it again
        self.lane_eof = False  # the lane found the client's stream ended (or failed)
        self.lane_failed: CodecError | None = None  # a response the lane could not read
        # A request the lane decided whose decision only trio can carry out (an answer
        # made later, a refusal): ``relay.take_decided`` applies it, as decided.
        self.lane_decided: tuple[RequestPeek, AnswerLater | Refuse | Close] | None = None
        self._on_end = on_end  # the proxy forgets the session and releases its admission

    @property
    def config(self) -> Config:
        return self.services.config  # read each time: a reload applies to open sessions

    @property
    def bytes_out(self) -> int:
        return self.writer.bytes_out

    @property
    def latency(self) -> LatencySketch:
        return self.writer.latency  # recent response times, for the status page

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def draining(self) -> bool:
        """Taking no new requests: a drain, or its backend gone."""
        return self._draining or self._end_at_request

    @property
    def parking(self) -> bool:
        """The request side has parked: the run ends without closing the session."""
        return self._parking

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """The session from its first byte to its close; returns early when it parks
        (the parking lot then calls ``resume``). Its end is reported once, at the close."""
        m = self.services.metrics
        m.connections_total.labels(self.listener).inc()
        m.connections_active.labels(self.listener).inc()
        await self._run()

    async def resume(self, readable: int = -1) -> None:
        """Run a parked session again, in a task the parking lot started; ``readable``:
        the descriptor found readable, if that is what woke it (read at once, where the
        other side waits first: a receive that finds nothing is a system call lost)."""
        for io in (self._client_io, self._upstream_io):
            if isinstance(io, SocketTransport) and io.fd == readable:
                io.may_have_bytes()
        try:
            await self._run()
        except Exception:  # as for a connection's first task (kproxy.runtime.admission)
            self.services.metrics.internal_errors.inc()
            log.exception("internal error resuming a session; closed",
                          extra={"fields": self.conn.log_fields()})

    async def _run(self) -> None:
        """The session's tasks, until it ends or parks (its tasks return; its sockets and
        state stay, and the parking lot holds them)."""
        parked = False
        try:
            while not self._closing:
                self._parking = False
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if self._upstream_io is not None:  # resumed: the response side again
                        self.start(relay_responses, self, self._upstream_io)
                    if self._end_at_request:  # its backend went while it was parked
                        self.start(self._stop_after, timeouts.GONE_GRACE_S)
                    # The request side runs in this task, not in a child of its own: a
                    # task less per connection, same cancellation.
                    with TaskGuard(self):
                        await self._requests()
                self._nursery = None
                if not self._parking or self._closing or self._draining:
                    break  # ended (drained: nothing was in flight)
                if self._end_at_request:
                    continue  # told to end while parking: wait for the next request
                self._recv_scope = None
                parked = self.services.parking.park(self)
                break
        finally:
            self._nursery = None
            if not parked:
                await self._end()

    async def _end(self) -> None:
        """Report the close, close both sockets, and let the proxy forget the session."""
        self._report_closed()
        with trio.CancelScope(shield=True):
            for stream in (self.client, self.upstream):
                if stream is not None:
                    await trio.aclose_forcefully(stream)
        self._gone()

    def abandon(self, why: str = "") -> None:
        """Close a parked session here and now: the proxy is stopping, or (``why``) its
        client left while the express lane held it. Parked sessions are plain TCP both
        ways, so closing is not a wait."""
        if why:
            log.debug("session ended: %s", why, extra={"fields": self.conn.log_fields()})
        self._report_closed()
        for stream in (self.client, self.upstream):
            if isinstance(stream, trio.SocketStream):
                stream.socket.close()
        self._gone()

    def _report_closed(self) -> None:
        self.services.metrics.connections_active.labels(self.listener).dec()
        self.services.events.connection_closed(self.conn, self.opened_at, self.bytes_in,
                                               self.bytes_out)

    def _gone(self) -> None:
        self._ended = True
        if self.lane_decided is not None:  # ended before its tasks could carry it out
            decision, self.lane_decided = self.lane_decided[1], None
            if isinstance(decision, AnswerLater) and inspect.iscoroutine(decision.reply):
                decision.reply.close()  # never to be awaited: not a warning at collection
        if self._closed is not None:
            self._closed.set()
        self._on_end(self)

    async def wait_ended(self) -> None:
        """Wait until the session has ended (its sockets closed)."""
        if self._ended:
            return
        if self._closed is None:
            self._closed = trio.Event()
        await self._closed.wait()

    def stop_reading(self) -> None:
        """Drain: take no new requests; the session ends once in-flight ones are answered."""
        self._draining = True
        for scope in (self._recv_scope, self.mute_scope):
            if scope is not None:
                scope.cancel()
        self._wake_if_parked()

    def end_at_next_request(self) -> None:
        """Its backend is gone: forward nothing more. The session ends once in-flight
        requests are answered and the client's next request has come (unanswered, it
        fails when the connection closes: librdkafka then looks for the new leader at
        once, where a quiet close leaves it waiting about 2 s on its refresh timer), or
        after ``timeouts.GONE_GRACE_S`` if none comes."""
        if self._end_at_request or self._draining:
            return
        self._end_at_request = True
        if self._wake_if_parked():
            return  # its run starts the grace timer
        try:
            if self._nursery is not None:
                self._nursery.start_soon(self._stop_after, timeouts.GONE_GRACE_S)
                return
        except RuntimeError:  # its tasks have all ended: the session is closing
            pass
        self.stop_reading()

    async def _stop_after(self, grace: float) -> None:
        await trio.sleep(grace)
        self.stop_reading()

    def close(self) -> None:
        self._closing = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._wake_if_parked()

    # ------------------------------------------------------------------ parking

    def note_idle(self) -> None:
        """Nothing in flight: tell the parking lot, which may ask this session to park
        once it has been idle long enough (``park_if_idle``)."""
        if self.frames_in and self._plain_tcp() and not self._end_at_request:
            self.services.parking.note_idle(self)

    def park_if_idle(self) -> None:
        """The parking lot's request (or, for the express lane, the response side's once
        the last answer left): wake the request side from its wait for the client, to
        park if it still may (``_may_park``)."""
        if self._recv_scope is not None and self.frames_in:
            self._recv_scope.cancel()

    def parking_fds(self) -> tuple[int, ...]:
        """The descriptors the parking lot waits on (parked sessions are plain TCP)."""
        client, upstream = self._client_io, self._upstream_io
        assert isinstance(client, SocketTransport)
        if upstream is None:
            return (client.fd,)
        assert isinstance(upstream, SocketTransport)
        return (client.fd, upstream.fd)

    def _plain_tcp(self) -> bool:
        """A TLS stream may hold decrypted bytes no epoll reports: such sessions never park."""
        return type(self._client_io) is SocketTransport and (
            self._upstream_io is None or type(self._upstream_io) is SocketTransport)

    def splice_ends(self) -> tuple[SocketTransport, SocketTransport] | None:
        """Client and upstream when frames may be spliced between them (plain TCP both
        ways, splice on and available), else None."""
        client, upstream = self._client_io, self._upstream_io
        if (splice.AVAILABLE and self.config.splice_from and type(client) is SocketTransport
                and type(upstream) is SocketTransport):
            return client, upstream
        return None

    def lane_closed(self) -> bool:
        """Whether the express lane must leave everything to the session's tasks (called
        from the lane: reads only)."""
        return bool(self._draining or self._end_at_request or self._closing or self.mute_until
                    or self._upstream_io is None or self.services.quotas.enabled
                    or self.conn.shared.sasl_gate is not None)

    def lane_step(self, fd: int, now: float) -> bool:
        """The express lane found ``fd`` readable: relay what it can. False when the
        session must run again (``ParkingLot._hand_back``)."""
        client, upstream = self._client_io, self._upstream_io
        if upstream is None:
            return False
        assert isinstance(client, SocketTransport) and isinstance(upstream, SocketTransport)
        if fd == client.fd:
            return express.relay_requests(self, client, upstream, now)
        return express.relay_responses(self, client, upstream, now)

    async def _after_lane(self) -> None:
        """Finish what the express lane left when it handed the session back: a
        decision to carry out, requests it sent in part, a backend finding to act on,
        answers to write; or end the session over a response it could not read, as the
        response side would."""
        if self.lane_failed is not None:
            exc, self.lane_failed = self.lane_failed, None
            self.services.events.decode_error("response", "frame", exc, self.conn)
            raise SessionClosed(str(exc))
        if self.lane_decided is not None:
            (peek, decision), self.lane_decided = self.lane_decided, None
            take_decided(self, peek, decision, time.monotonic())  # a refusal stops reading
        if self.upstream_pending:
            parts, self.upstream_pending = self.upstream_pending, ()
            await self.send_upstream(parts)
        if self.catch_up is not None:
            handled, self.catch_up = self.catch_up, None
            await self.services.backend.catch_up(handled.change)
        await self.writer.flush()

    def _wake_if_parked(self) -> bool:
        """A control reached a parked session: run it again to apply it."""
        if self.parked:
            self.services.parking.wake(self)
            return True
        return False

    # ------------------------------------------------------------------ upstream

    async def send_upstream(self, parts: Sequence[Frame | Buffer]) -> None:
        """Write ``parts`` to the broker, connecting first if this is the first request."""
        if self._upstream_io is None:
            await self._connect()
        assert self._upstream_io is not None
        await send_all(self._upstream_io, parts, self.config.write_timeout)

    async def _connect(self) -> None:
        """Open the upstream connection (lazily: at the first request it must carry)."""
        connected = await self.services.connector.connect(self.conn)
        if connected is None:
            raise SessionClosed("backend unreachable")
        self.upstream, address = connected
        if not self.conn.connected(address):
            await trio.aclose_forcefully(self.upstream)
            self.services.events.upstream_dropped(self.conn)
            raise SessionClosed("the upstream list changed while connecting")
        self._upstream_io = transport_for(self.upstream)
        self.start(relay_responses, self, self._upstream_io)

    def start(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Start a task of the session; ``fn`` runs under a ``TaskGuard`` of its own. It
        is named after ``fn``: a name given, not one trio formats anew for every task."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args, name=fn.__qualname__)

