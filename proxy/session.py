"""One client connection and its one upstream connection: the I/O of a connection.

The session moves bytes, keeps responses in request order, enforces timeouts and the
memory budget, and applies what its ``ConnectionState`` (``policies.connection``)
decides; it makes no protocol decision itself.

Requests: the upstream connection is opened when the first complete request arrives
(a connection that never sends one costs no broker connection). Each request is
peeked, handed to the state, and forwarded as received, replaced, or answered here.

Responses (``kproxy.session_responses``, a task started with the upstream
connection): a response no handler needs whole is relayed as it arrives. Small ones
are batched and written without copying; a large one is passed through chunk by
chunk (cut-through), so a 50 MB fetch costs one receive buffer, not 50 MB. A
response a handler must see whole (addresses to rewrite) is received in place, its
size reserved from the budget first. Writes to the client go through the session's
``ClientWriter`` (``kproxy.client_writer``): whole frames, in order, one at a time.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Awaitable, Callable

import trio

from kproxy.client_writer import ClientWriter, send_all
from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import Frame, FrameReader
from kproxy.codecs.peek import peek_request
from kproxy.config import Config
from kproxy.context import SessionServices
from kproxy.errors import PeerGone, SessionClosed
from kproxy.inflight import OrderedResponses, Slot
from kproxy.latency_sketch import LatencySketch
from kproxy.memory import Charge
from kproxy.policies import timeouts
from kproxy.policies.connection import (
    Answer,
    AnswerLater,
    Close,
    ConnectionState,
    Forward,
)
from kproxy.session_guard import TaskGuard
from kproxy.session_responses import RECV_BYTES, relay_responses
from kproxy.transport import Transport, transport_for

_SIZE = struct.Struct(">i")
# Local answers (a small telemetry push is decoded as it is answered) made from one
# read for longer than this: the loop serves other connections before the rest.
LOCAL_WORK_S = 0.002


class Session:
    # Slots: one of these per open connection, thousands when they idle.
    __slots__ = ("_client_io", "_closed", "_draining", "_end_at_request", "_ended",
                 "_nursery", "_recv_scope", "_upstream_io", "bytes_in", "client", "conn",
                 "frames_in", "last_activity", "listener", "opened_at", "ordered",
                 "services", "upstream", "writer")

    def __init__(self, services: SessionServices, client: trio.abc.Stream, listener: str,
                 node_id: int | None, peer: tuple[str, int]) -> None:
        self.services = services
        self.client = client
        self.listener = listener
        self.conn = ConnectionState(services.state, services.handlers, listener, node_id, peer)
        self.upstream: trio.abc.Stream | None = None
        # How the relay moves bytes on each side (see kproxy.transport).
        self._client_io: Transport = transport_for(client)
        self._upstream_io: Transport | None = None
        self.ordered = OrderedResponses()
        self.writer = ClientWriter(self._client_io, self.ordered, services.metrics,
                                   lambda: self.config.write_timeout)
        # For the idle and first-request timeouts: complete frames either way.
        self.frames_in = 0
        self.last_activity = trio.current_time()
        self.bytes_in = 0
        self.opened_at = time.time()
        self._draining = False
        self._end_at_request = False
        self._recv_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._ended = False
        self._closed: trio.Event | None = None  # made only when someone waits (a drain)

    @property
    def config(self) -> Config:
        return self.services.config  # read each time: a reload applies to open sessions

    @property
    def bytes_out(self) -> int:
        return self.writer.bytes_out

    @property
    def latency(self) -> LatencySketch:
        return self.writer.latency  # recent response times, for the status page

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        m = self.services.metrics
        m.connections_total.labels(self.listener).inc()
        m.connections_active.labels(self.listener).inc()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # The request side runs in this task, not in a child of its own: a task
                # less per connection (memory an idle connection holds), same cancellation.
                with TaskGuard(self):
                    await self._requests()
        finally:
            self._nursery = None  # closed: nothing more can start in it
            m.connections_active.labels(self.listener).dec()
            self.services.events.connection_closed(self.conn, self.opened_at, self.bytes_in,
                                                   self.bytes_out)
            with trio.CancelScope(shield=True):
                for stream in (self.client, self.upstream):
                    if stream is not None:
                        await trio.aclose_forcefully(stream)
            self._ended = True
            if self._closed is not None:
                self._closed.set()

    async def wait_ended(self) -> None:
        """Wait until ``run`` has returned."""
        if self._ended:
            return
        if self._closed is None:
            self._closed = trio.Event()
        await self._closed.wait()

    def stop_reading(self) -> None:
        """Drain: take no new requests; the session ends once in-flight ones are answered."""
        self._draining = True
        self._recv_scope.cancel()

    def end_at_next_request(self, grace: float = timeouts.GONE_GRACE_S) -> None:
        """Its backend is gone: forward nothing more. The session ends once in-flight
        requests are answered and the client's next request has come (unanswered, it
        fails when the connection closes: librdkafka then looks for the new leader at
        once, where a quiet close leaves it waiting about 2 s on its refresh timer), or
        after ``grace`` if none comes."""
        if self._end_at_request or self._draining:
            return
        self._end_at_request = True
        try:
            if self._nursery is not None:
                self._nursery.start_soon(self._stop_after, grace)
                return
        except RuntimeError:  # its tasks have all ended: the session is closing
            pass
        self.stop_reading()

    async def _stop_after(self, grace: float) -> None:
        await trio.sleep(grace)
        self.stop_reading()

    def close(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ requests

    async def _requests(self) -> None:
        cfg = self.config
        reader = FrameReader(cfg.max_frame_bytes)
        charge = Charge(self.services.budget)
        first_deadline = trio.current_time() + cfg.first_request_timeout
        client = self._client_io
        try:
            while not self._draining:
                if not reader.held():
                    # Between frames: wait for room in the budget before taking more.
                    # Mid-frame, never: a partial frame is only freed by completing it.
                    await charge.wait_for_room()
                n = client.fill_now(reader, RECV_BYTES)
                if n is None:
                    # Only the wait for bytes is cancellable by a drain: a request already
                    # taken is always sent upstream and answered. One scope serves both:
                    # a drain cancels it, the read deadline expires it.
                    self._recv_scope = trio.CancelScope(deadline=timeouts.read_deadline(
                        trio.current_time(), first_deadline, self.frames_in,
                        len(self.ordered), self.last_activity, self.config.idle_timeout))
                    with self._recv_scope:
                        n = await client.fill(reader, RECV_BYTES)
                    if self._recv_scope.cancelled_caught:
                        if self._draining:
                            break
                        self._check_timeouts()
                        continue
                if not n:
                    raise PeerGone("client closed the connection")
                charge.settle(reader.held())
                await self._handle_requests(reader)
                charge.settle(reader.held())
        finally:
            charge.release()
        # Draining: wait until every request already taken has been answered.
        with trio.move_on_after(cfg.drain_timeout):
            while len(self.ordered):
                await self.writer.answers_left()
        self.close()

    def _check_timeouts(self) -> None:
        """A read deadline passed: close a silent new connection or an idle one."""
        cfg = self.config
        which = timeouts.expired(trio.current_time(), self.frames_in, len(self.ordered),
                                 self.last_activity, cfg.idle_timeout)
        if which is not None:
            msg = timeouts.reason(which, cfg.first_request_timeout, cfg.idle_timeout)
            self.services.events.limit_hit(which, f"{msg}; closed", self.conn)
            raise SessionClosed(which.replace("_", " "))

    async def _handle_requests(self, reader: FrameReader) -> None:
        if self._end_at_request:
            self._draining = True  # not forwarded: it fails when the connection closes
            return
        out: list[Frame | bytes] = []  # what goes upstream, in order
        answered_locally = False
        events = self.services.events
        try:
            frames = reader.wire_frames()
        except CodecError as exc:
            events.decode_error("request", "frame", exc, self.conn)
            raise SessionClosed(str(exc)) from None
        if not frames:
            return
        self.frames_in += len(frames)
        self.last_activity = trio.current_time()
        conn = self.conn
        metrics = self.services.metrics
        began = time.monotonic()
        for frame in frames:
            body = frame.body
            try:
                peek = peek_request(body)
                api = metrics.api(peek.api_key)
                api.requests.inc()
                api.request_bytes.inc(len(body) + 4)
                self.bytes_in += len(body) + 4
                decision = conn.request(peek, body)
            except CodecError as exc:  # a broker closes the connection on such a request
                events.decode_error("request", "header", exc, conn)
                raise SessionClosed(str(exc)) from None
            now = time.monotonic()
            upstream_version = peek.api_version
            if decision is None:
                out.append(frame)  # relayed as received: a view, not a copy
            elif isinstance(decision, Forward):
                out.append(_SIZE.pack(len(decision.body)) + decision.body)
                upstream_version = decision.upstream_version
            elif isinstance(decision, Answer):
                self.ordered.answer_locally(peek.correlation_id, peek.api_key, peek.api_version,
                                            now, _SIZE.pack(len(decision.body)) + decision.body)
                answered_locally = True
                if now - began > LOCAL_WORK_S:  # answers made here took work: let others in
                    await trio.lowlevel.checkpoint()
                    began = time.monotonic()
                continue
            elif isinstance(decision, AnswerLater):
                slot = self.ordered.answer_later(peek.correlation_id, peek.api_key,
                                                 peek.api_version, now)
                self._start(self._answer_later, slot, decision)
                continue
            else:
                assert isinstance(decision, Close)
                events.refused(decision, conn)
                raise SessionClosed(decision.reason)
            if peek.expects_response:
                slot = self.ordered.expect_upstream(peek.correlation_id, peek.api_key,
                                                    peek.api_version, now)
                slot.upstream_version = upstream_version
            else:
                self.ordered.expect_nothing(peek.correlation_id)
            if len(self.ordered) >= self.config.max_inflight:
                # Backpressure: send what we have, then stop reading this client
                # until responses drain.
                await self._send_upstream(out)
                out = []
                await self._wait_for_room()
        if out:
            await self._send_upstream(out)
        if answered_locally:
            await self.writer.flush()

    async def _send_upstream(self, parts: list[Frame | bytes]) -> None:
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
        self.conn.connected(address)
        self._upstream_io = transport_for(self.upstream)
        self._start(relay_responses, self, self._upstream_io)

    def _start(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Start a task of the session; ``fn`` runs under a ``TaskGuard`` of its own. It
        is named after ``fn``: a name given, not one trio formats anew for every task."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args, name=fn.__qualname__)

    async def _answer_later(self, slot: Slot, decision: AnswerLater) -> None:
        """Make a local answer without holding up the connection, then send it in order."""
        with TaskGuard(self, ends_session=False):
            try:
                body = await decision.reply
            except CodecError as exc:  # a broker closes the connection on such a request
                self.services.events.decode_error("request", api_keys.api_name(slot.api_key),
                                                  exc, self.conn)
                raise SessionClosed(str(exc)) from None
            slot.wire = _SIZE.pack(len(body)) + body
            await self.writer.flush()

    async def _wait_for_room(self) -> None:
        self.services.events.limit_hit("max_inflight", "client has max_inflight requests in "
                                       "flight; not reading from it until responses drain",
                                       self.conn)
        while len(self.ordered) >= self.config.max_inflight:
            await self.writer.answers_left()
