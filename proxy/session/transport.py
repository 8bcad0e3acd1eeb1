"""Moving bytes on one connection with as few trips through the event loop as possible.

trio's ``SocketStream`` makes every receive and every send a scheduling point, and
every wait re-arms epoll. On the relay path that costs more CPU than the protocol
work: a relayed request is four socket operations, and through the stream API each
one yields to the scheduler even when the kernel had the bytes ready.

``SocketTransport`` (plain TCP) calls the kernel first and waits for readiness only
when it says it would block, sends a list of buffers with one ``writev`` (no joining
of frames), and skips a receive it knows would find nothing: after a short read the
socket is drained, so the next receive goes straight to waiting. It still yields
every few operations, so one busy connection cannot starve the others.
``StreamTransport`` wraps any trio stream (TLS) and keeps the stream API.

The session owns the trio stream and closes it; a transport only borrows it. The
file descriptor is read and written directly, never closed here. Every way a peer
can go away (reset, broken pipe, a broken TLS stream) leaves a transport as one
exception, ``PeerGone``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence

import trio

from kproxy.codecs.framing import Frame, FrameReader
from kproxy.session.errors import PeerGone

Buffer = bytes | bytearray | memoryview

# After this many operations that did not wait, yield once to the scheduler.
FAIRNESS_OPS = 16
# writev takes at most IOV_MAX buffers (1024 on Linux) per call.
MAX_IOV = 1024


class Transport:
    """A connection as the relay uses it; subclasses decide how bytes move."""

    __slots__ = ()

    def fill_now(self, reader: FrameReader, max_bytes: int) -> int | None:
        """Give ``reader`` what the kernel already holds: a count, 0 at end of stream,
        or None (call ``fill``). A large frame the reader opened is received in place."""
        room = reader.room()
        if room is None:
            data = self.receive_now(max_bytes)
            if data is None:
                return None
            reader.feed(data)
            return len(data)
        with room:
            n = self.receive_into_now(room)
        if n:
            reader.filled(n)
        return n

    async def fill(self, reader: FrameReader, max_bytes: int) -> int:
        """Like ``fill_now``, waiting for at least one byte or the end of the stream."""
        room = reader.room()
        if room is None:
            data = await self.receive(max_bytes)
            reader.feed(data)
            return len(data)
        with room:
            n = await self.receive_into(room)
        if n:
            reader.filled(n)
        return n

    async def receive(self, max_bytes: int) -> bytes:
        """At least one byte, or b"" at end of stream; waits as long as it takes."""
        raise NotImplementedError

    def receive_now(self, max_bytes: int) -> bytes | None:
        """Bytes the kernel already holds, b"" at end of stream, or None: call ``receive``."""
        return None

    async def receive_into(self, room: memoryview) -> int:
        """Receive into ``room``: how many bytes (at least one), or 0 at end of stream."""
        data = await self.receive(len(room))
        room[: len(data)] = data
        return len(data)

    def receive_into_now(self, room: memoryview) -> int | None:
        """Like ``receive_now``, into ``room``: a count, 0 at end of stream, or None."""
        return None

    def send_now(self, parts: list[Buffer]) -> list[Buffer]:
        """Write what the kernel takes without waiting; returns what is left."""
        return parts

    async def send_rest(self, parts: list[Buffer]) -> None:
        """Write all of ``parts``, waiting for room as needed."""
        raise NotImplementedError


class StreamTransport(Transport):
    """Any trio stream (TLS): every operation goes through the stream API."""

    __slots__ = ("_ssl", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        # A trio.SSLStream's TLS object (made with the stream), for ``_decrypted``.
        self._ssl: ssl.SSLObject | None = getattr(stream, "_ssl_object", None)

    async def receive(self, max_bytes: int) -> bytes:
        try:
            data = await self.stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise PeerGone(f"connection broke: {exc!r}") from exc
        pieces = [data]
        if self._ssl is not None and len(data) < max_bytes:
            self._decrypted(self._ssl, pieces, max_bytes - len(data))
        return bytes(data) if len(pieces) == 1 else b"".join(pieces)

    @staticmethod
    def _decrypted(tls: ssl.SSLObject, pieces: list[bytes | bytearray], room: int) -> None:
        """Append the records a TLS stream already received, decrypted without waiting.

        ``SSLStream.receive_some`` gives one TLS record (16 KiB at most) a call, and each
        call is a trip through trio's scheduler: a 1 MB produce over client TLS took ~60
        of them. What the transport already delivered is taken here in one go; anything
        else than "no whole record yet" (an alert, the end of the stream) is left where
        it is, for the next ``receive_some`` to raise or report as usual."""
        while room > 0:
            try:
                piece = tls.read(room)
            except ssl.SSLError:  # SSLWantReadError: no whole record buffered
                return
            if not piece:
                return
            pieces.append(piece)
            room -= len(piece)

    async def send_rest(self, parts: list[Buffer]) -> None:
        try:
            for part in parts:
                await self.stream.send_all(part)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise PeerGone(f"connection broke: {exc!r}") from exc


class SocketTransport(Transport):
    """A plain TCP socket, driven with non-blocking system calls on its descriptor."""

    __slots__ = ("_drained", "_ops", "carry", "fd")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.fd = stream.socket.fileno()
        self._drained = True  # nothing known to be waiting: a receive should wait first
        self._ops = 0  # operations since the last yield
        # Bytes the express lane received and did not relay: the next receive's.
        self.carry: bytes | None = None

    def may_have_bytes(self) -> None:
        """The socket is readable (it woke a parked session): the next receive tries the
        kernel first."""
        self._drained = False

    def _did_not_wait(self) -> bool:
        """Count an operation that did not wait; False when it is time to yield."""
        self._ops += 1
        return self._ops < FAIRNESS_OPS

    async def receive(self, max_bytes: int) -> bytes:
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            self._ops = 0
            try:
                data = os.read(self.fd, max_bytes)
            except BlockingIOError:  # a spurious wake-up: wait again
                continue
            except OSError as exc:
                raise _gone(exc) from exc
            self._drained = len(data) < max_bytes
            return data

    async def fill(self, reader: FrameReader, max_bytes: int) -> int:
        """``fill_now`` once the socket is readable. Waits here, not in ``receive``: an
        idle connection waits in this call, and each coroutine it waits in holds memory."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            self._drained, self._ops = False, 0
            n = self.fill_now(reader, max_bytes)
            if n is not None:  # None: a spurious wake-up, wait again
                return n

    def receive_now(self, max_bytes: int) -> bytes | None:
        carry = self.carry  # first, whatever else: a session handed back reads it here
        if carry is not None:
            self.carry = None
            return carry
        if self._drained or not self._did_not_wait():
            return None
        try:
            data = os.read(self.fd, max_bytes)
        except BlockingIOError:
            self._drained = True
            return None
        except OSError as exc:
            raise _gone(exc) from exc
        self._drained = len(data) < max_bytes
        return data

    async def receive_into(self, room: memoryview) -> int:
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            self._ops = 0
            try:
                n = os.readv(self.fd, [room])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise _gone(exc) from exc
            self._drained = n < len(room)
            return n

    def receive_into_now(self, room: memoryview) -> int | None:
        if self._drained or not self._did_not_wait():
            return None
        try:
            n = os.readv(self.fd, [room])
        except BlockingIOError:
            self._drained = True
            return None
        except OSError as exc:
            raise _gone(exc) from exc
        self._drained = n < len(room)
        return n

    def send_now(self, parts: list[Buffer]) -> list[Buffer]:
        if not self._did_not_wait():
            return parts
        return self.write_now(parts)

    def write_now(self, parts: list[Buffer]) -> list[Buffer]:
        """``send_now`` without the yield for fairness (the express lane, which has no
        task to yield)."""
        while parts:
            batch = parts[:MAX_IOV]
            try:
                sent = os.writev(self.fd, batch)
            except BlockingIOError:
                return parts
            except OSError as exc:
                raise _gone(exc) from exc
            if len(parts) == 1 and sent == len(parts[0]):
                return []  # the usual small write: one buffer, taken whole
            parts = _consume(parts, sent)
            if parts and sent < sum(map(len, batch)):
                return parts  # a short write: the send buffer is full, a retry would fail
        return parts

    async def send_rest(self, parts: list[Buffer]) -> None:
        while parts:
            await trio.lowlevel.wait_writable(self.fd)
            self._ops = 0
            try:
                sent = os.writev(self.fd, parts[:MAX_IOV])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise _gone(exc) from exc
            parts = _consume(parts, sent)


async def copy_exactly(src: Transport, n: int, buf: bytearray,
                       send: Callable[[memoryview], Awaitable[None]]) -> None:
    """Receive exactly ``n`` bytes from ``src`` through ``buf``, sending each piece on
    before receiving the next (cut-through: one buffer, whatever ``n`` is)."""
    while n:
        room = memoryview(buf)[: min(n, len(buf))]
        got = src.receive_into_now(room)
        if got is None:
            got = await src.receive_into(room)
        if not got:
            raise PeerGone("closed in the middle of a frame")
        n -= got
        await send(room[:got])


def _gone(exc: OSError) -> PeerGone:
    return PeerGone(exc.strerror or type(exc).__name__)


def _consume(parts: list[Buffer], sent: int) -> list[Buffer]:
    """What is left of ``parts`` once ``sent`` bytes of them are written."""
    i = 0
    while i < len(parts) and sent >= len(parts[i]):
        sent -= len(parts[i])
        i += 1
    if i == len(parts):
        return []
    rest = parts[i:]
    if sent:
        rest[0] = memoryview(rest[0])[sent:]
    return rest


def transport_for(stream: trio.abc.Stream) -> Transport:
    """The fastest transport that can carry ``stream``."""
    sock = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(sock, trio.SocketStream):
        kernel_buffers_as_usual(sock)
    if isinstance(stream, trio.SocketStream):
        return SocketTransport(stream)
    return StreamTransport(stream)


def kernel_buffers_as_usual(stream: trio.SocketStream) -> None:
    """Let the kernel queue what the proxy sends on ``stream`` as on any socket.

    trio sets ``TCP_NOTSENT_LOWAT`` to 16 KiB on its streams (less queued in the
    kernel, for protocols that pick what to send next at the last moment). A relay
    has nothing to pick: with it, a send stops taking bytes once 16 KiB wait unsent,
    so a 1 MB produce batch spliced to a broker that reads as it can waited for room
    five to nine times (a pass of trio's loop each), against less than once without.
    0 restores the system's default (``net.ipv4.tcp_notsent_lowat``, unlimited unless
    set). What the kernel queues is bounded by the socket's send buffer, as for
    haproxy; the proxy's own memory budget is unchanged."""
    if hasattr(socket, "TCP_NOTSENT_LOWAT"):  # where trio set it
        with contextlib.suppress(OSError):
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 0)


SMALL = 64 * 1024


def coalesce(parts: Sequence[Frame | Buffer]) -> list[Buffer]:
    """As few buffers as possible, copying little.

    Frames that follow each other in the buffer they were received in become one
    slice of it; small pieces are joined into one write; large ones go as they are.
    """
    if len(parts) == 1:  # one answer, the usual case
        part = parts[0]
        return [memoryview(part.buf)[part.start:part.end] if isinstance(part, Frame)
                else part]
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
