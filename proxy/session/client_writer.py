"""The client side of a session's writes: answers leave whole, in request order, one
writer at a time, and each one is accounted (latency, bytes) as it leaves.

The session decides what to write; this module owns how: the write lock that keeps a
frame from being interleaved with another (the cut-through relay holds it for a whole
large response), the event the request side waits on for answers to drain, and the
write itself, which is shielded from cancellation (a frame is never cut in half) and
bounded by ``write_timeout``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import trio

from kproxy.codecs.framing import Frame
from kproxy.memory import Charge
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.session.errors import SessionClosed
from kproxy.session.inflight import OrderedResponses, Slot
from kproxy.session.latency_sketch import LatencySketch
from kproxy.session.splice import Pipe, splice_exactly
from kproxy.session.transport import Buffer, SocketTransport, Transport, coalesce, copy_exactly


async def send_all(transport: Transport, parts: Sequence[Frame | Buffer],
                   write_timeout: float) -> None:
    """Write every part or end the session; cancellation never splits a frame."""
    rest = transport.send_now(coalesce(parts))
    if not rest:  # the kernel took it all: no wait, nothing to cancel
        return
    # One scope: shielded from outside cancellation, bounded by its own deadline.
    with trio.CancelScope(shield=True, deadline=trio.current_time() + write_timeout) as scope:
        await transport.send_rest(rest)
    if scope.cancelled_caught:
        raise SessionClosed("write timed out")


class ClientWriter:
    __slots__ = ("_room", "bytes_out", "close_after_flush", "latency", "lock", "metrics",
                 "ordered", "pending", "transport", "write_timeout")

    def __init__(self, transport: Transport, ordered: OrderedResponses, metrics: ProxyMetrics,
                 write_timeout: Callable[[], float]) -> None:
        self.transport = transport
        self.ordered = ordered
        self.metrics = metrics
        self.write_timeout = write_timeout  # read at each write: a reload applies
        self.lock = trio.Lock()
        self.latency = LatencySketch()  # recent response times, for the status page
        self.bytes_out = 0
        # Set when the session must end once the answers already made have left.
        self.close_after_flush = False
        # What the request side waits on for answers to leave; made only when it waits
        # (an idle connection holds none).
        self._room: trio.Event | None = None
        # Answers the express lane wrote in part (already accounted): they leave first.
        self.pending: tuple[bytes, ...] = ()

    async def send(self, parts: Sequence[Frame | Buffer]) -> None:
        await send_all(self.transport, parts, self.write_timeout())

    async def answers_left(self) -> None:
        """Wait until some answers have left (room in the in-flight window)."""
        self._room = room = trio.Event()
        await room.wait()

    def _wake(self) -> None:
        """Answers have left: wake the request side if it waits for that."""
        room, self._room = self._room, None
        if room is not None:
            room.set()

    def answered(self, slot: Slot, size: int) -> None:
        """``slot``'s answer (``size`` bytes on the wire) has left: account it and wake
        the request side."""
        self._account(slot, size)
        self._wake()

    def _account(self, slot: Slot, size: int) -> None:
        now = time.monotonic()
        self.metrics.api(slot.api_key).response(size, now - slot.started)
        self.latency.observe(now - slot.started, now)
        self.bytes_out += size

    async def relay(self, slot: Slot, head: list[memoryview], source: Transport, rest: int,
                    charge: Charge, chunk: int) -> None:
        """Write ``slot``'s answer as its bytes arrive (cut-through): ``head`` now, then
        ``rest`` bytes copied from ``source`` through one buffer of at most ``chunk``.
        ``head`` is emptied once written, so its memory is given back before the copy.
        ``slot`` leaves the head of the order only once the lock is held: a flush queued
        for the lock earlier would otherwise find the answers behind it ready and write
        them first. They go out after it, in the flush at the end."""
        size = sum(map(len, head)) + rest
        buf = bytearray(min(rest, chunk))
        charge.settle(size - rest + len(buf))
        async with self.lock:
            self.ordered.pop_head(slot)
            await self.send(list(head))
            head.clear()
            charge.settle(len(buf))
            await copy_exactly(source, rest, buf, lambda piece: self.send([piece]))
        self.answered(slot, size)
        await self.flush()  # answers behind it that a flush found not yet ready

    async def splice(self, slot: Slot, head: list[memoryview], source: SocketTransport,
                     rest: int, charge: Charge, pipe: Pipe) -> None:
        """Like ``relay``, the ``rest`` spliced from ``source`` through ``pipe`` (never
        copied into the process); what the pipe holds is counted as held."""
        assert isinstance(self.transport, SocketTransport)
        size = sum(map(len, head)) + rest
        charge.settle(size - rest + pipe.size)
        async with self.lock:
            self.ordered.pop_head(slot)
            await self.send(list(head))
            head.clear()
            charge.settle(pipe.size)
            await splice_exactly(source.fd, self.transport.fd, rest, pipe,
                                 read_timeout=math.inf, write_timeout=self.write_timeout())
        self.answered(slot, size)
        await self.flush()

    def _take_ready(self) -> list[Frame | Buffer]:
        """What is to be written now, in order (what is pending first), each answer
        accounted as it is taken."""
        parts: list[Frame | Buffer] = list(self.pending)
        self.pending = ()
        for slot in self.ordered.pop_ready():
            wire = slot.wire
            assert wire is not None
            parts.append(wire)
            self._account(slot, len(wire) + 4 if isinstance(wire, Frame) else len(wire))
        return parts

    def write_now(self) -> None:
        """Write what is ready without waiting (the express lane, which holds no task):
        what the kernel does not take is kept in ``pending`` for ``flush``."""
        assert not self.lock.locked()  # a parked session has no task writing
        parts = self._take_ready()
        if parts:
            assert isinstance(self.transport, SocketTransport)  # only such sessions park
            rest = self.transport.write_now(coalesce(parts))
            if rest:  # the kernel did not take it all: kept, copied, for ``flush``
                self.pending = tuple(bytes(b) for b in rest)

    async def flush(self) -> None:
        """Write every answer that is ready at the head of the order."""
        # One writer at a time; taking a free lock without a scheduling round trip
        # matters on the per-request path.
        lock = self.lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            parts = self._take_ready()
            if not parts:
                return
            await self.send(parts)
            self._wake()
            if self.close_after_flush:
                raise SessionClosed("closed after its last response, as the legacy-client "
                                    "policy asks")
        finally:
            lock.release()
