"""One client connection and its one upstream connection.

Two tasks per session: requests flow client -> upstream, responses upstream ->
client. Frames the proxy does not decode pass through as bytes; responses that
carry broker addresses are rewritten before they leave. Every response leaves in
request order through ``OrderedResponses``, including ones the proxy answers
itself (``LocalHandler``s, e.g. telemetry). Writes are shielded from cancellation
so a frame is never cut in half, and bounded by a timeout so a stuck peer cannot
hold a session forever.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import Frame, FrameReader
from kproxy.codecs.peek import (
    RequestPeek,
    peek_correlation_id,
    peek_request,
    peek_response_error,
)
from kproxy.inflight import OrderedResponses, Slot
from kproxy.policies.rewrite import carries_addresses
from kproxy.transport import Buffer, Transport, transport_for

if TYPE_CHECKING:
    from kproxy.server import ProxyContext

log = logging.getLogger("kproxy.session")
_SIZE = struct.Struct(">i")
RECV_BYTES = 256 * 1024

# A handler gets the request body (a view: header included, no size prefix) and
# returns the response body to send (header included, no size prefix), or None to
# let the request go upstream. A handler with costly work (a telemetry push to
# decode) returns an awaitable of the body instead; this connection's requests
# wait for it, other connections do not.
LocalHandler = Callable[["Session", RequestPeek, memoryview],
                        "bytes | Awaitable[bytes] | None"]


class SessionClosed(Exception):
    """Ends a session; the message says why, for the log."""


@dataclass
class ClientInfo:
    """What the proxy knows of the client on this connection."""

    source_address: str
    source_port: int
    client_id: str | None = None
    software_name: str | None = None
    software_version: str | None = None


class Session:
    def __init__(self, ctx: ProxyContext, client: trio.abc.Stream, listener: str,
                 node_id: int | None, peer: tuple[str, int]) -> None:
        self.ctx = ctx
        self.client = client
        self.listener = listener
        self.node_id = node_id
        self.upstream: trio.abc.Stream | None = None
        # How the relay moves bytes on each side (see kproxy.transport).
        self._client_io: Transport = transport_for(client)
        self._upstream_io: Transport | None = None
        self.ordered = OrderedResponses()
        self.info = ClientInfo(*peer)
        # The epoch this client last saw (set at its first Metadata response), the
        # Metadata version it speaks, and what the broker behind it can serve.
        self.topology_epoch: int | None = None
        self.metadata_version: int | None = None
        self.backend_metadata_max: int | None = None
        self.connected_epoch = ctx.view.epoch
        self.upstream_address: tuple[str, int] | None = None
        self.close_after_flush = False
        # SASL passes through; the proxy only notes that the broker accepted it.
        self.authenticated = False
        # For the idle and first-request timeouts: complete frames either way.
        self.frames_in = 0
        self.last_activity = trio.current_time()
        # For the connection inventory: highest version used per API, bytes each way.
        self.api_versions_used: dict[int, int] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.opened_at = time.time()
        self._write_lock = trio.Lock()
        self._room = trio.Event()
        self._draining = False
        self._recv_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self.done = trio.Event()

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        m = self.ctx.metrics
        m.connections_total.labels(self.listener).inc()
        m.connections_active.labels(self.listener).inc()
        try:
            self.upstream = await self.ctx.connect_upstream(self)
            if self.upstream is not None:
                self._upstream_io = transport_for(self.upstream)
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._guard, self._requests)
                    nursery.start_soon(self._guard, self._responses)
        finally:
            m.connections_active.labels(self.listener).dec()
            self.ctx.connection_closed(self)
            with trio.CancelScope(shield=True):
                for stream in (self.client, self.upstream):
                    if stream is not None:
                        await trio.aclose_forcefully(stream)
            self.done.set()

    async def _guard(self, direction: Callable[[], Awaitable[None]]) -> None:
        """Run one direction; whatever ends it ends the whole session, never the proxy."""
        try:
            await direction()
        except SessionClosed as exc:
            log.debug("session closed: %s", exc, extra={"fields": self._fields()})
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("session ended: %r", exc, extra={"fields": self._fields()})
        except Exception:
            self.ctx.metrics.internal_errors.inc()
            log.exception("internal error in a session; closing it",
                          extra={"fields": self._fields()})
        finally:
            self.close()

    def stop_reading(self) -> None:
        """Drain: take no new requests; the session ends once in-flight ones are answered."""
        self._draining = True
        self._recv_scope.cancel()

    @property
    def client_key(self) -> tuple[str, str]:
        return self.info.source_address, self.info.client_id or ""

    def close(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _fields(self) -> dict[str, object]:
        return {"listener": self.listener, "client": f"{self.info.source_address}:"
                f"{self.info.source_port}", "client_id": self.info.client_id}

    # ------------------------------------------------------------------ requests

    async def _requests(self) -> None:
        reader = FrameReader(self.ctx.config.max_frame_bytes)
        first_deadline = trio.current_time() + self.ctx.config.first_request_timeout
        client = self._client_io
        while not self._draining:
            n = client.fill_now(reader, RECV_BYTES)
            if n is None:
                # Only the wait for bytes is cancellable by a drain: a request already
                # taken is always sent upstream and answered. One scope serves both:
                # a drain cancels it, the read deadline expires it.
                self._recv_scope = trio.CancelScope(
                    deadline=self._read_deadline(first_deadline))
                with self._recv_scope:
                    n = await client.fill(reader, RECV_BYTES)
                if self._recv_scope.cancelled_caught:
                    if self._draining:
                        break
                    self._check_timeouts()
                    continue
            if not n:
                raise SessionClosed("client closed the connection")
            await self._handle_requests(reader)
        # Draining: wait until every request already taken has been answered.
        with trio.move_on_after(self.ctx.config.drain_timeout):
            while len(self.ordered):
                self._room = trio.Event()
                await self._room.wait()
        self.close()

    def _read_deadline(self, first_deadline: float) -> float:
        if not self.frames_in:
            return first_deadline
        idle = self.ctx.config.idle_timeout
        if not idle:
            return math.inf
        if len(self.ordered):  # busy: look again later
            return trio.current_time() + idle
        return self.last_activity + idle

    def _check_timeouts(self) -> None:
        """A read deadline passed: close a silent new connection or an idle one."""
        cfg = self.ctx.config
        if not self.frames_in:
            self.ctx.limit_hit("first_request_timeout", "no complete request within "
                               f"{cfg.first_request_timeout:g}s of connecting; closed",
                               self)
            raise SessionClosed("first request timeout")
        if not len(self.ordered) and (
                trio.current_time() - self.last_activity >= cfg.idle_timeout):
            self.ctx.limit_hit("idle_timeout", f"idle for {cfg.idle_timeout:g}s; closed", self)
            raise SessionClosed("idle timeout")

    async def _handle_requests(self, reader: FrameReader) -> None:
        out: list[Frame | bytes] = []  # what goes upstream, in order
        answered_locally = False
        try:
            frames = reader.wire_frames()
        except CodecError as exc:
            self.ctx.decode_error("request", "frame", exc, self)
            raise SessionClosed(str(exc)) from None
        if frames:
            self.frames_in += len(frames)
            self.last_activity = trio.current_time()
        for frame in frames:
            body = frame.body
            try:
                peek = peek_request(body)
            except CodecError as exc:
                self.ctx.decode_error("request", "header", exc, self)
                raise SessionClosed(str(exc)) from None
            api = self.ctx.metrics.api(peek.api_key)
            api.requests.inc()
            api.request_bytes.inc(len(body) + 4)
            self.bytes_in += len(body) + 4
            if self.api_versions_used.get(peek.api_key, -1) < peek.api_version:
                self.api_versions_used[peek.api_key] = peek.api_version
            if peek.client_id is not None:
                self.info.client_id = peek.client_id
            try:
                local = self.ctx.answer_locally(self, peek, body)
                if local is not None and not isinstance(local, bytes):
                    local = await local
            except CodecError as exc:  # a broker closes the connection on such a request
                self.ctx.decode_error("request", api_keys.api_name(peek.api_key), exc, self)
                raise SessionClosed(str(exc)) from None
            now = time.monotonic()
            if local is not None:
                self.ordered.answer_locally(peek.correlation_id, peek.api_key, peek.api_version,
                                            now, _SIZE.pack(len(local)) + local)
                answered_locally = True
                continue
            upstream_version = peek.api_version
            if peek.api_key == api_keys.METADATA:
                self.metadata_version = peek.api_version
                sent, upstream_version = self.ctx.bridge_metadata_request(self, peek, bytes(body))
                out.append(_SIZE.pack(len(sent)) + sent)
            else:
                out.append(frame)  # relayed as received: a view, not a copy
            if peek.expects_response:
                slot = self.ordered.expect_upstream(peek.correlation_id, peek.api_key,
                                                    peek.api_version, now)
                slot.upstream_version = upstream_version
            else:
                self.ordered.expect_nothing(peek.correlation_id)
            if len(self.ordered) >= self.ctx.config.max_inflight:
                # Backpressure: send what we have, then stop reading this client
                # until responses drain.
                await self._send(self._upstream_transport(), out)
                out = []
                await self._wait_for_room()
        if out:
            await self._send(self._upstream_transport(), out)
        if answered_locally:
            await self._flush()

    async def _wait_for_room(self) -> None:
        self.ctx.limit_hit("max_inflight", "client has max_inflight requests in flight; "
                           "not reading from it until responses drain", self)
        while len(self.ordered) >= self.ctx.config.max_inflight:
            self._room = trio.Event()
            await self._room.wait()

    def _upstream_transport(self) -> Transport:
        assert self._upstream_io is not None
        return self._upstream_io

    # ------------------------------------------------------------------ responses

    async def _responses(self) -> None:
        upstream = self._upstream_transport()
        # The broker is trusted with allocations of the sizes it declares: large
        # responses (fetches) are received in place, never assembled from chunks.
        reader = FrameReader(self.ctx.config.max_frame_bytes, in_place_from=RECV_BYTES)
        while True:
            n = upstream.fill_now(reader, RECV_BYTES)
            if n is None:
                n = await upstream.fill(reader, RECV_BYTES)
            if not n:
                self.ctx.upstream_lost(self, "broker closed the connection")
                raise SessionClosed("upstream closed the connection")
            try:
                frames = reader.wire_frames()
                if frames:
                    self.last_activity = trio.current_time()
                for frame in frames:
                    slot = self.ordered.next_upstream(peek_correlation_id(frame.body))
                    if slot is None:
                        self.ctx.metrics.stray_responses.inc()
                        continue
                    slot.wire = await self._process_response(slot, frame)
            except CodecError as exc:
                self.ctx.decode_error("response", "frame", exc, self)
                raise SessionClosed(str(exc)) from None
            await self._flush()

    async def _process_response(self, slot: Slot, frame: Frame) -> Frame | bytes:
        if slot.api_key == api_keys.SASL_AUTHENTICATE:
            self.authenticated = peek_response_error(frame.body, slot.api_key,
                                                     slot.api_version) == 0
        elif slot.api_key == api_keys.API_VERSIONS or carries_addresses(slot.api_key,
                                                                      slot.api_version):
            body = frame.body
            new = await self.ctx.rewrite_response(self, slot, body)
            if new is not body:
                return _SIZE.pack(len(new)) + bytes(new)
        return frame

    async def _flush(self) -> None:
        # One writer at a time; taking a free lock without a scheduling round trip
        # matters on the per-request path.
        lock = self._write_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            ready = self.ordered.pop_ready()
            if not ready:
                return
            now = time.monotonic()
            metrics = self.ctx.metrics
            parts: list[Frame | bytes] = []
            for slot in ready:
                assert slot.wire is not None
                parts.append(slot.wire)
                size = len(slot.wire) + 4 if isinstance(slot.wire, Frame) else len(slot.wire)
                api = metrics.api(slot.api_key)
                api.latency.observe(now - slot.started)
                api.response_bytes.inc(size)
                self.bytes_out += size
            await self._send(self._client_io, parts)
            self._room.set()
            if self.close_after_flush:
                raise SessionClosed("closed after its last response, as the legacy-client "
                                    "policy asks")
        finally:
            lock.release()

    async def _send(self, transport: Transport, parts: list[Frame | bytes]) -> None:
        """Write every part or end the session; cancellation never splits a frame."""
        rest = transport.send_now(coalesce(parts))
        if not rest:  # the kernel took it all: no wait, nothing to cancel
            return
        # One scope: shielded from outside cancellation, bounded by its own deadline.
        with trio.CancelScope(shield=True, deadline=trio.current_time()
                              + self.ctx.config.write_timeout) as scope:
            await transport.send_rest(rest)
        if scope.cancelled_caught:
            raise SessionClosed("write timed out")


SMALL = 64 * 1024


def coalesce(parts: list[Frame | bytes]) -> list[Buffer]:
    """As few buffers as possible, copying little.

    Frames that follow each other in the buffer they were received in become one
    slice of it; small pieces are joined into one write; large ones go as they are.
    """
    slices: list[Buffer] = []
    run: tuple[Frame, Frame] | None = None  # first and last frame of a contiguous run
    for part in parts:
        if isinstance(part, Frame):
            if run is not None and part.extends(run[1]):
                run = (run[0], part)
                continue
            if run is not None:
                slices.append(memoryview(run[0].buf)[run[0].start : run[1].end])
            run = (part, part)
        else:
            if run is not None:
                slices.append(memoryview(run[0].buf)[run[0].start : run[1].end])
                run = None
            slices.append(part)
    if run is not None:
        slices.append(memoryview(run[0].buf)[run[0].start : run[1].end])
    out: list[Buffer] = []
    small: list[Buffer] = []
    for buf in slices:
        if len(buf) < SMALL:
            small.append(buf)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(buf)
    if small:
        out.append(small[0] if len(small) == 1 else b"".join(small))
    return out


def peer_of(stream: trio.SocketStream) -> tuple[str, int]:
    """The client's address and port, for limits, logs and the connection inventory."""
    try:
        addr = stream.socket.getpeername()
        return str(addr[0]), int(addr[1])
    except (OSError, AttributeError, IndexError):
        return "unknown", 0
