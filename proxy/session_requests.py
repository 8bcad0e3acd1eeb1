"""A session's request side: each complete request peeked, decided, and applied.

The connection's state (``policies.connection``) decides; this module applies the
decision: relay the frame as received (a view of the receive buffer, not a copy),
forward a replacement, answer here (now, or later in a task of its own, keeping the
request's place in order), or close. Requests go upstream in batches; at
``max_inflight`` the session stops reading its client until answers leave.
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import Frame, FrameReader
from kproxy.codecs.peek import peek_request
from kproxy.errors import SessionClosed
from kproxy.inflight import Slot
from kproxy.policies.connection import Answer, AnswerLater, Close, Forward
from kproxy.session_guard import TaskGuard

if TYPE_CHECKING:
    from kproxy.session import Session

_SIZE = struct.Struct(">i")
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
        body = frame.body
        try:
            peek = peek_request(body)
            api = metrics.api(peek.api_key)
            api.requests.inc()
            api.request_bytes.inc(len(body) + 4)
            session.bytes_in += len(body) + 4
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
            session.ordered.answer_locally(peek.correlation_id, peek.api_key, peek.api_version,
                                        now, _SIZE.pack(len(decision.body)) + decision.body)
            answered_locally = True
            if now - began > LOCAL_WORK_S:  # answers made here took work: let others in
                await trio.lowlevel.checkpoint()
                began = time.monotonic()
            continue
        elif isinstance(decision, AnswerLater):
            slot = session.ordered.answer_later(peek.correlation_id, peek.api_key,
                                             peek.api_version, now)
            session.start(_answer_later, session, slot, decision)
            continue
        else:
            assert isinstance(decision, Close)
            events.refused(decision, conn)
            raise SessionClosed(decision.reason)
        if peek.expects_response:
            slot = session.ordered.expect_upstream(peek.correlation_id, peek.api_key,
                                                peek.api_version, now)
            slot.upstream_version = upstream_version
        else:
            session.ordered.expect_nothing(peek.correlation_id)
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


async def _answer_later(session: Session, slot: Slot, decision: AnswerLater) -> None:
    """Make a local answer without holding up the connection, then send it in order."""
    with TaskGuard(session, ends_session=False):
        try:
            body = await decision.reply
        except CodecError as exc:  # a broker closes the connection on such a request
            session.services.events.decode_error("request", api_keys.api_name(slot.api_key),
                                              exc, session.conn)
            raise SessionClosed(str(exc)) from None
        slot.wire = _SIZE.pack(len(body)) + body
        await session.writer.flush()

async def _wait_for_room(session: Session) -> None:
    """Backpressure: the client has max_inflight requests in flight."""
    session.services.events.limit_hit("max_inflight", "client has max_inflight requests in "
                                   "flight; not reading from it until responses drain",
                                   session.conn)
    while len(session.ordered) >= session.config.max_inflight:
        await session.writer.answers_left()
