"""Large responses relayed as they arrive: passed through, spliced, or streamed.

``relay.py`` hands a response here once it has started and is large: one no handler
needs whole goes to the client as its bytes come (``pass_through``: through one
buffer) or, on plain TCP, socket to pipe to socket (``splice_through``).

A Fetch v16+ response may carry broker addresses after its records, so it used to be
received whole before a byte of it went on: a consumer's responses cost the proxy
more CPU per byte than anything else it relays, and each waited for its last byte.
When the state can stream it (a ``ResponseStream``, ``policies.handlers.FetchStream``),
``stream_through`` relays it as it comes: its skeleton passes through the process and
is walked as it goes; its records are spliced from the broker's socket to the
client's, never copied in (over TLS, or with every pipe lent, copied through one
buffer as they arrive); its top-level
tagged section, the last bytes, is received and rewritten into as many bytes (the
response's size went out with its first bytes).

Ordering, the write lock and the memory budget are those of ``ClientWriter``. A
response cut short (a peer gone, a timeout, a malformed response) leaves the client
with part of a frame: the session ends, as it does on a malformed response received
whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio

from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader
from kproxy.memory import Charge
from kproxy.policies.connection import Handled, ResponseStream
from kproxy.policies.rebootstrap import Action
from kproxy.session import splice, throttle
from kproxy.session.errors import PeerGone
from kproxy.session.inflight import Slot
from kproxy.session.transport import Buffer, SocketTransport, Transport, copy_exactly

if TYPE_CHECKING:
    from kproxy.session.session import Session

# How much one receive asks for when the walk needs more of the skeleton: a partition's
# head is about 50 bytes; what comes with it of the records is copied, not spliced.
SKELETON_BYTES = 4096
# A top-level tagged section larger than this is not a response the proxy relays.
MAX_TAIL_BYTES = 1 << 20


async def stream_through(session: Session, upstream: Transport, reader: FrameReader,
                         charge: Charge, slot: Slot, pipe: splice.Pipe | None,
                         stream: ResponseStream, chunk: int) -> None:
    """Relay the pending response of ``slot`` to the client as its bytes arrive: its
    opaque runs spliced through ``pipe`` or, without one (TLS, the pool spent), copied
    through a buffer of at most ``chunk`` bytes."""
    parts, rest = _take(session, reader, slot)
    size = sum(map(len, parts)) + rest
    writer = session.writer
    with _lent(session, upstream, pipe):
        async with writer.lock:
            session.ordered.pop_head(slot)  # under the lock: see ClientWriter.relay
            handled = await _relay(session, upstream, parts, rest, charge, pipe, stream,
                                   chunk)
    writer.answered(slot, size)
    if handled.seen is not None or handled.rebootstrap is not Action.NONE:
        await session.services.backend.observed(handled, session.conn)
    await writer.flush()  # answers behind it that a flush found not yet ready


async def _relay(session: Session, upstream: Transport, parts: list[memoryview],
                 rest: int, charge: Charge, pipe: splice.Pipe | None,
                 stream: ResponseStream, chunk: int) -> Handled:
    """Walk, send and splice (or copy) until the tail; send the tail as the state
    rewrote it."""
    send = session.writer.send
    walk = stream.walk
    first = parts[0] if len(parts) == 1 else memoryview(b"".join(parts))
    out: list[Buffer] = [first[:4]]  # the size prefix, unchanged: the size is kept
    window = first[4:]  # received and not yet walked past
    # The opaque runs go through the pipe, or else through one buffer for the frame.
    if pipe is not None:
        buf, held = None, pipe.size
    else:
        buf = bytearray(min(rest, chunk))
        held = len(buf)
    charge.settle(len(first) + held)
    while True:
        used = walk.advance(window)
        if used:
            out.append(window[:used])
            window = window[used:]
        if walk.opaque:
            here = min(walk.opaque, len(window))
            if here:
                out.append(window[:here])
                window = window[here:]
                walk.skip(here)
            if walk.opaque:  # the rest of the run is still in the broker's socket
                n = walk.opaque
                await send(out)
                out = []
                charge.settle(held)
                await _pass_run(session, upstream, n, pipe, buf)
                rest -= n
                walk.skip(n)
            continue
        if walk.at_tail:
            if walk.tail_size > MAX_TAIL_BYTES:
                raise CodecError(f"top-level tagged section of {walk.tail_size} bytes",
                                 what="FetchResponse")
            charge.settle(walk.tail_size + held)
            tail = await _receive(upstream, window, rest, exactly=True)
            replaced, handled = stream.finish(tail)
            out.append(replaced)
            await send(out)
            return handled
        if not rest:
            raise CodecError("response ends inside its structure", what="FetchResponse")
        more = await _receive(upstream, window, min(rest, SKELETON_BYTES), exactly=False)
        rest -= len(more) - len(window)
        window = more


async def _pass_run(session: Session, upstream: Transport, n: int,
                    pipe: splice.Pipe | None, buf: bytearray | None) -> None:
    """``n`` opaque bytes from the broker to the client: spliced through ``pipe``, or
    copied through ``buf``."""
    client = session.writer.transport
    if pipe is not None:
        assert isinstance(upstream, SocketTransport) and isinstance(client, SocketTransport)
        await splice.splice_exactly(upstream.fd, client.fd, n, pipe, read_timeout=math.inf,
                                    write_timeout=session.config.write_timeout)
        upstream.may_have_bytes()  # the skeleton after the run may be there
        return
    assert buf is not None
    await copy_exactly(upstream, n, buf, lambda piece: session.writer.send([piece]))


async def _receive(src: Transport, held: memoryview, want: int, *,
                   exactly: bool) -> memoryview:
    """``held`` followed by at least one (``exactly``: all ``want``) more bytes from
    ``src``, in a buffer of their own (what was sent from ``held`` stays valid)."""
    buf = bytearray(len(held) + want)
    buf[: len(held)] = held
    view = memoryview(buf)
    filled = len(held)
    while filled < len(buf):
        room = view[filled:]
        got = src.receive_into_now(room)
        if got is None:
            got = await src.receive_into(room)
        if not got:
            raise PeerGone("closed in the middle of a frame")
        filled += got
        if not exactly:
            break
    return view[:filled]


async def splice_through(session: Session, upstream: SocketTransport, reader: FrameReader,
                         charge: Charge, slot: Slot, pipe: splice.Pipe) -> None:
    """Relay the pending frame to the client, its rest spliced socket to socket."""
    parts, rest = _take(session, reader, slot)
    session.conn.observe_head(slot.api_key, slot.api_version, parts)
    with _lent(session, upstream, pipe):
        await session.writer.splice(slot, parts, upstream, rest, charge, pipe)


async def pass_through(session: Session, upstream: Transport, reader: FrameReader,
                       charge: Charge, slot: Slot, chunk: int) -> None:
    """Relay the pending frame to the client as its bytes arrive (cut-through), through
    one buffer of at most ``chunk`` bytes."""
    parts, rest = _take(session, reader, slot)
    session.conn.observe_head(slot.api_key, slot.api_version, parts)
    try:
        await session.writer.relay(slot, parts, upstream, rest, charge, chunk)
    except PeerGone:
        _lost(session)
        raise
    session.last_activity = trio.current_time()


def _take(session: Session, reader: FrameReader, slot: Slot) -> tuple[list[memoryview], int]:
    """Take the pending frame of ``slot`` off the reader and its slot off the order: its
    buffered bytes (``throttle_time_ms`` set where quotas throttle it) and how many are
    still to come."""
    session.ordered.next_upstream(slot.correlation_id)
    parts, rest = reader.take_partial()
    throttle.on_fetch_bytes(session, slot, sum(map(len, parts)) + rest)
    return throttle.head_parts(slot, parts), rest


@contextlib.contextmanager
def _lent(session: Session, upstream: Transport, pipe: splice.Pipe | None) -> Iterator[None]:
    """One frame relayed as it arrives (with ``pipe`` lent for it, if any): the pipe
    given back empty once it is through; cut short, the pipe closed (it may hold bytes)
    and the session ended (the client has part of a frame)."""
    try:
        yield
    except BaseException as exc:
        if pipe is not None:
            splice.PIPES.give_back(pipe, empty=False)
        if isinstance(exc, PeerGone):
            _lost(session)
        session.close()
        raise
    if pipe is not None:
        splice.PIPES.give_back(pipe, empty=True)
    if isinstance(upstream, SocketTransport):
        upstream.may_have_bytes()  # what follows the frame may be waiting already
    session.last_activity = trio.current_time()


def _lost(session: Session) -> None:
    session.services.events.upstream_lost(session.conn, "broker closed the connection "
                                          "mid-response")
