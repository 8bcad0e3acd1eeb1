"""What a session does with each complete frame, in either direction.

The connection's state (``policies.connection``) decides; this module applies.

Requests (``handle_requests``, called from the session's own task): each is peeked
and handed to the state, then relayed as received (a view of the receive buffer, not
a copy), replaced, answered here (now, or later in a task of its own that keeps the
request's place in order), or refused by closing. Requests go upstream in batches; at
``max_inflight`` the session stops reading its client until answers leave.

Responses (``relay_responses``, the task that reads the upstream connection): each is
matched to its request's slot (``kproxy.session.inflight``) and relayed as received, passed
through as it arrives (a large one: spliced, or cut-through with one receive buffer
whatever its size; a large Fetch v16+ rewritten on the way, ``kproxy.session.streamed``),
or handed whole to the state to be rewritten. What the
state learns about the backend (a changed broker set, a rebootstrap) goes to the
proxy-wide ``BackendService``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import trio

from kproxy.codecs import api_keys, framing
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import Frame, FrameReader
from kproxy.codecs.peek import RequestPeek, peek_correlation_id, peek_request
from kproxy.memory import Charge
from kproxy.policies.connection import Answer, AnswerLater, Close, Forward, Refuse
from kproxy.session import splice, throttle
from kproxy.session.errors import PeerGone, ProtocolViolation, SessionClosed
from kproxy.session.guard import TaskGuard
from kproxy.session.inflight import Slot
from kproxy.session.responses import respond_now
from kproxy.session.streamed import pass_through, splice_through, stream_through
from kproxy.session.transport import Transport

if TYPE_CHECKING:
    from kproxy.session.session import Session

RECV_BYTES = 256 * 1024
# A response frame larger than this that is not complete in what was received is
# passed through (or, when it must be rewritten, received in place).
LARGE_FRAME = RECV_BYTES
# Enough of a request's start to peek its header (client id, transactional id, acks).
PEEK_BYTES = 4096
# Local answers (a small telemetry push is decoded as it is answered) made from one
# read for longer than this: the loop serves other connections before the rest.
LOCAL_WORK_S = 0.002


async def handle_requests(session: Session, reader: FrameReader) -> None:
    """Take every complete request ``reader`` holds: peek, decide (the connection's
    state), then forward, answer here, or close; in request order."""
    out: list[Frame | bytes] = []  # what goes upstream, in order
    answered_locally = False
    events = session.services.events
    try:
        frames = reader.wire_frames()
    except CodecError as exc:
        events.decode_error("request", "frame", exc, session.conn)
        raise SessionClosed(str(exc)) from None
    if not frames:
        return
    session.frames_in += len(frames)
    session.last_activity = trio.current_time()
    conn = session.conn
    metrics = session.services.metrics
    began = time.monotonic()
    for frame in frames:
        if session.mute_until and session.mute_until > trio.current_time():
            # Throttled (quotas): a muted channel takes no next request, even one
            # already received; what was taken before goes on meanwhile.
            out = await _muted(session, out, answered_locally)
        body = frame.body
        try:
            peek = peek_request(body)
            metrics.api(peek.api_key).request(len(body) + 4)
            session.bytes_in += len(body) + 4
            decision = conn.request(peek, body)
            throttle_ms = throttle.on_request(session, peek.api_key, len(body) + 4)
        except CodecError as exc:  # a broker closes the connection on such a request
            events.decode_error("request", "header", exc, conn)
            raise SessionClosed(str(exc)) from None
        now = time.monotonic()
        upstream_version = peek.api_version
        if decision is None:
            out.append(frame)  # relayed as received: a view, not a copy
        elif isinstance(decision, Forward):
            out.append(framing.frame(decision.body))
            upstream_version = decision.upstream_version
        elif isinstance(decision, Answer):
            session.ordered.answer_locally(peek.correlation_id, peek.api_key,
                                           peek.api_version, now,
                                           framing.frame(decision.body))
            answered_locally = True
            if now - began > LOCAL_WORK_S:  # answers made here took work: let others in
                await trio.lowlevel.checkpoint()
                began = time.monotonic()
            continue
        else:
            if not take_decided(session, peek, decision, now):
                break  # refused: nothing after it is read or sent
            continue
        session.ordered.expect(peek, now, upstream_version, throttle_ms)
        if len(session.ordered) >= session.config.max_inflight:
            # Backpressure: send what we have, then stop reading this client
            # until responses drain.
            await session.send_upstream(out)
            out = []
            await _wait_for_room(session)
    if out:
        await session.send_upstream(out)
    if answered_locally:
        await session.writer.flush()


def take_decided(session: Session, peek: RequestPeek,
                 decision: AnswerLater | Refuse | Close, now: float) -> bool:
    """Apply a decision the proxy carries out itself, over time or by ending the
    session: the request's place in the order is taken now. Used by the request side
    and for a decision the express lane made and left to trio (``Session._after_lane``).
    False after a refusal: no request after it is taken."""
    if isinstance(decision, AnswerLater):
        slot = session.ordered.answer_later(peek.correlation_id, peek.api_key,
                                            peek.api_version, now)
        session.start(_answer_later, session, slot, decision)
        return True
    if isinstance(decision, Refuse):
        # Answered after the delay, then closed.
        slot = session.ordered.answer_later(peek.correlation_id, peek.api_key,
                                            peek.api_version, now)
        session.start(_refuse, session, slot, decision)
        _refusing(session, decision)
        return False
    session.services.events.refused(decision, session.conn)
    raise SessionClosed(decision.reason)


def _refusing(session: Session, decision: Refuse) -> None:
    """A refusal is reported, and the connection takes no request after it."""
    session.services.events.refused(Close(decision.event, decision.event, decision.message),
                                    session.conn)
    session.stop_reading()


async def _refusal(session: Session, decision: Refuse) -> bytes:
    """A refusal's answer, once its delay has passed."""
    await trio.sleep(min(decision.delay_s, session.config.drain_timeout / 2))
    return decision.body


async def _muted(session: Session, out: list[Frame | bytes],
                 answered_locally: bool) -> list[Frame | bytes]:
    """Send what was taken, then wait out the throttle; the next batch to send."""
    if out:
        await session.send_upstream(out)
    if answered_locally:
        await session.writer.flush()
    await throttle.wait_unmuted(session)
    return []


async def splice_request(session: Session, reader: FrameReader, charge: Charge) -> bool:
    """A large request has started and is not complete: when its header says nobody
    needs its body, send what is buffered of it and splice the rest to the broker.
    Whether it did."""
    pending = reader.pending()
    ends = session.splice_ends()
    if (pending is None or ends is None or pending[0] < session.config.splice_from
            or session.draining):
        return False
    total = pending[0]
    head = memoryview(reader.head(PEEK_BYTES))[4:]
    try:
        peek = peek_request(head)
    except CodecError:
        return False  # not enough of the header yet, or a bad one: the usual path decides
    conn = session.conn
    if conn.handles_request(peek.api_key):
        return False  # a handler reads requests of this kind whole
    if len(session.ordered) >= session.config.max_inflight:
        await _wait_for_room(session)
    pipe = splice.PIPES.take()
    if pipe is None:
        return False
    client, upstream = ends
    parts, rest = reader.take_partial()
    decision = conn.request(peek, head)  # notes the version and client id
    assert decision is None
    throttle_ms = throttle.on_request(session, peek.api_key, total)
    session.frames_in += 1
    session.bytes_in += total
    session.services.metrics.api(peek.api_key).request(total)
    charge.settle(sum(map(len, parts)) + pipe.size)
    idle = session.config.idle_timeout
    try:
        await session.send_upstream(parts)
        parts.clear()
        charge.settle(pipe.size)
        await splice.splice_exactly(client.fd, upstream.fd, rest, pipe,
                                    read_timeout=idle or math.inf,
                                    write_timeout=session.config.write_timeout)
    except BaseException:  # cut short: the broker has part of a frame
        splice.PIPES.give_back(pipe, empty=False)
        session.close()
        raise
    splice.PIPES.give_back(pipe, empty=True)
    charge.settle(0)
    client.may_have_bytes()  # the next request may be waiting already
    now = time.monotonic()
    session.last_activity = trio.current_time()
    # Its answer cannot come before its last byte left.
    session.ordered.expect(peek, now, peek.api_version, throttle_ms)
    return True


async def _answer_later(session: Session, slot: Slot, decision: AnswerLater) -> None:
    """Make a local answer without holding up the connection, then send it in order."""
    with TaskGuard(session, ends_session=False):
        try:
            body = await decision.reply
        except CodecError as exc:  # a broker closes the connection on such a request
            session.services.events.decode_error("request", api_keys.api_name(slot.api_key),
                                                 exc, session.conn)
            raise SessionClosed(str(exc)) from None
        if isinstance(body, Refuse):  # as ``take_decided`` carries out one made at once
            _refusing(session, body)
            body = await _refusal(session, body)
        slot.wire = framing.frame(body)
        await session.writer.flush()
        if not len(session.ordered):  # its wait for the client may have no deadline
            session.note_idle()


async def _refuse(session: Session, slot: Slot, decision: Refuse) -> None:
    """A refusal (a failed login): wait the delay, answer, and let the drain close."""
    with TaskGuard(session, ends_session=False):
        slot.wire = framing.frame(await _refusal(session, decision))
        await session.writer.flush()


async def _wait_for_room(session: Session) -> None:
    """Backpressure: the client has max_inflight requests in flight."""
    session.services.events.limit_hit("max_inflight", "client has max_inflight requests in "
                                      "flight; not reading from it until responses drain",
                                      session.conn)
    while len(session.ordered) >= session.config.max_inflight:
        await session.writer.answers_left()


# ------------------------------------------------------------------ responses


async def relay_responses(session: Session, upstream: Transport) -> None:
    """Read responses until the upstream connection ends (which ends the session), or
    until the session parks (cancelled at its wait for the broker, holding nothing)."""
    with TaskGuard(session):
        reader = FrameReader(session.config.max_frame_bytes)
        charge = Charge(session.services.budget)
        # After a response spliced past the process, the next receive asks only for a
        # header's worth: a consumer's next response is likely large too, and what is
        # received into the process is copied in and out (as for requests).
        recv_bytes = RECV_BYTES
        try:
            while True:
                if not reader.held() and not charge.room_now():
                    await charge.wait_for_room()
                n = upstream.fill_now(reader, recv_bytes)
                if n is None:
                    n = await upstream.fill(reader, recv_bytes)
                if not n:
                    session.services.events.upstream_lost(session.conn,
                                                          "broker closed the connection")
                    raise PeerGone("upstream closed the connection")
                charge.settle(reader.held())
                try:
                    await _handle_responses(session, reader)
                    await session.writer.flush()
                    held = reader.held()
                    charge.settle(held)
                    # A large response may have started.
                    spliced = bool(held) and await _handle_pending(session, upstream,
                                                                   reader, charge)
                    recv_bytes = PEEK_BYTES if spliced else RECV_BYTES
                except (CodecError, ProtocolViolation) as exc:
                    session.services.events.decode_error("response", "frame", exc,
                                                         session.conn)
                    raise SessionClosed(str(exc)) from None
                charge.settle(reader.held())
                if not len(session.ordered):
                    if session.lane_ready():  # park now, for the express lane
                        session.park_if_idle()
                    else:
                        session.note_idle()
        finally:
            charge.release()
            if reader.held() and session.parking:
                # Bytes the broker sent with nothing in flight, cut short by the park:
                # the stream cannot be taken up again in step. End the session instead.
                session.close()


async def _handle_responses(session: Session, reader: FrameReader) -> None:
    frames = reader.wire_frames()
    if frames:
        session.last_activity = trio.current_time()
    ordered = session.ordered
    backend = session.services.backend
    for frame in frames:
        slot = ordered.next_upstream(peek_correlation_id(frame.body))
        if slot is None:
            session.services.metrics.stray_responses.inc()
            continue
        later = respond_now(session, slot, frame, frame.body)
        if later is not None:
            await backend.catch_up(later.change)


async def _handle_pending(session: Session, upstream: Transport, reader: FrameReader,
                          charge: Charge) -> bool:
    """A large response has started and is not complete: splice or pass it through,
    stream it when it must be rewritten and can be on the way (Fetch v16+,
    ``streamed.stream_through``), or else receive it whole in place (its size reserved
    first). Whether its rest was spliced."""
    pending = reader.pending()
    if pending is None or len(pending[1]) < 8:
        return False
    total, head = pending
    ends = session.splice_ends()
    splice_from = session.config.splice_from if ends is not None else 0
    if total < LARGE_FRAME and not (splice_from and total >= splice_from):
        return False
    ordered = session.ordered
    slot = ordered.peek_upstream(peek_correlation_id(head[4:]))
    if slot is not None and ordered.is_next(slot):
        # Relayed as it arrives: as bytes when no handler needs it whole, or rewritten
        # on the way (Fetch v16+) when the state can stream it.
        conn = session.conn
        whole = conn.wants_response(slot.api_key, slot.api_version)
        stream = conn.response_stream(slot.api_key, slot.api_version,
                                      slot.upstream_version, total - 4) if whole else None
        if not whole or stream is not None:
            pipe = splice.PIPES.take() if splice_from and total >= splice_from else None
            if stream is not None:  # its records spliced, or copied through one buffer
                await stream_through(session, upstream, reader, charge, slot, pipe, stream,
                                     RECV_BYTES)
                return pipe is not None
            if pipe is not None:
                assert ends is not None
                await splice_through(session, ends[1], reader, charge, slot, pipe)
                return True
            if total >= LARGE_FRAME:
                await pass_through(session, upstream, reader, charge, slot, RECV_BYTES)
            return False
    if total >= LARGE_FRAME:  # to rewrite, or behind a local answer, or a stray answer
        await charge.reserve_to(total)
        reader.open_in_place()
    return False
