"""Quotas applied to a session: count, mute the channel, tell the client (KIP-124).

``kproxy.policies.auth.quotas`` says how long a principal must wait; here that becomes a
muted channel, as on a broker: the session's request side reads nothing more from
the client until the throttle has passed (a trio sleep in that session's task; other
connections go on), and the response it throttled carries ``throttle_time_ms``.
No request is ever dropped.

What counts: every request (request rate), a Produce request's size (its response
is throttled; acks=0 has none, so only the mute applies) and a Fetch response's
size (that response is throttled). A Fetch response relayed as it arrives
(spliced or cut through) has the field rewritten in its first bytes when they hold
it; otherwise it mutes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.framing import Frame, frame
from kproxy.policies.auth.quotas import FETCH, PRODUCE, REQUEST, set_throttle

if TYPE_CHECKING:
    from kproxy.session.inflight import Slot
    from kproxy.session.session import Session


def _throttle(session: Session, kind: str, amount: float) -> float:
    """Count ``amount``; mute the channel for the throttle it earns (seconds)."""
    delay = session.services.quotas.record(session.conn.principal, kind, amount,
                                           trio.current_time())
    if delay > 0:
        session.mute_until = max(session.mute_until, trio.current_time() + delay)
        metrics = session.services.metrics
        metrics.quota_throttled.labels(kind).inc()
        metrics.quota_throttle_seconds.labels(kind).inc(delay)
    return delay


def on_request(session: Session, api_key: int, size: int) -> int:
    """A request taken from the client: the throttle (ms) for its response."""
    if not session.services.quotas.enabled:
        return 0
    delay = _throttle(session, REQUEST, 1)
    if api_key == api_keys.PRODUCE:
        delay = max(delay, _throttle(session, PRODUCE, size))
    return _ms(delay)


def on_fetch_bytes(session: Session, slot: Slot, size: int) -> None:
    """A Fetch response of ``size`` bytes is on its way to the client."""
    if slot.api_key == api_keys.FETCH and session.services.quotas.enabled:
        slot.throttle_ms = max(slot.throttle_ms, _ms(_throttle(session, FETCH, size)))


def response_wire(session: Session, slot: Slot,
                  wire: Frame | bytes | memoryview) -> Frame | bytes | memoryview:
    """The response to send for ``slot``, its ``throttle_time_ms`` set if it throttled."""
    if not slot.throttle_ms:
        return wire
    body = wire.body if isinstance(wire, Frame) else memoryview(wire)[4:]
    patched = set_throttle(slot.api_key, slot.api_version, body, slot.throttle_ms)
    return wire if patched is None else frame(patched)


def head_parts(slot: Slot, parts: list[memoryview]) -> list[memoryview]:
    """The first bytes of a Fetch response relayed as it arrives, ``throttle_time_ms``
    set when the field is in them (it is the response's first field): one copy of the
    first part, made only for a throttled response."""
    if not slot.throttle_ms or slot.api_key != api_keys.FETCH or not parts:
        return parts
    head = parts[0]
    patched = set_throttle(slot.api_key, slot.api_version, head[4:], slot.throttle_ms)
    if patched is not None:
        parts[0] = memoryview(bytes(head[:4]) + patched)
    return parts


async def wait_unmuted(session: Session) -> bool:
    """Hold the request side until the throttle passes (a drain or close ends the wait);
    True when a drain ended it."""
    while trio.current_time() < session.mute_until and not session.draining:
        session.mute_scope = scope = trio.CancelScope(deadline=session.mute_until)
        with scope:
            await trio.sleep_forever()
        session.mute_scope = None
    return session.draining


def _ms(delay: float) -> int:
    return int(delay * 1000 + 0.999) if delay > 0 else 0
