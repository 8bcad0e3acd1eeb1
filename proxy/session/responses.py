"""A response matched to its request's slot: what goes to the client.

Both relays of small responses come here: the session's response task
(``relay._handle_responses``) and the express lane (``express.relay_responses``). It
must not wait, so that the lane, which runs outside trio, can call it: what the proxy
must do with the backend's answer before the client sees it (fan a topology change
out, open listeners for new brokers) is returned, for the caller to await or hand to
trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kproxy.codecs.framing import Frame, frame
from kproxy.policies.connection import Handled
from kproxy.policies.rebootstrap import Action
from kproxy.session import throttle
from kproxy.session.inflight import Slot

if TYPE_CHECKING:
    from kproxy.session.session import Session


def respond_now(session: Session, slot: Slot, wire: Frame | memoryview,
                body: memoryview) -> Handled | None:
    """Fill ``slot`` with the answer to send for the response ``body`` (``wire``: the
    same with its size prefix, as received). Returns the handler's findings when the
    proxy must act on them before the answer leaves (``BackendWatch.catch_up``)."""
    conn = session.conn
    services = session.services
    later: Handled | None = None
    handled = conn.response_if_wanted(slot.api_key, slot.api_version, slot.upstream_version,
                                      body)
    if handled is None:
        # Relayed as received, the usual case.
        conn.observe(slot.api_key, slot.api_version, body)
        slot.wire = wire
    else:  # a handler read it whole
        if ((handled.seen is not None or handled.rebootstrap is not Action.NONE)
                and services.backend.observe_now(handled, conn)):
            later = handled
        slot.wire = response_wire(session, handled, body) or wire
    if services.quotas.enabled:
        throttle.on_fetch_bytes(session, slot, len(body) + 4)
        slot.wire = throttle.response_wire(session, slot, slot.wire)
    return later


def response_wire(session: Session, handled: Handled, body: memoryview) -> bytes | None:
    """The response to send for what a handler made of ``body``: None to relay it as
    received."""
    if handled.close_after:
        session.writer.close_after_flush = True
    if handled.body is None or handled.body is body:
        return None
    return frame(handled.body)
