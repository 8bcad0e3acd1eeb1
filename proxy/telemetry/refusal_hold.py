"""A connection whose push was refused as INVALID_RECORD: its telemetry held a while.

A client takes INVALID_RECORD as the end of its telemetry (librdkafka and the Java
client both stop pushing for good), so a connection that sends more telemetry soon
after one is not following KIP-714: typically a stream of compression bombs, each
with a fresh client instance so that no push interval holds it back. Each such push
is refused without being decoded here, but still costs the event loop its requests,
the helper's verdict and the answers, which a producer on another connection feels.

So for ``refused_push_hold_ms`` after such a refusal, each telemetry request on that
connection waits out the rest of the hold and is then refused with
THROTTLING_QUOTA_EXCEEDED, ``throttle_time_ms`` saying how long it was held; nothing
of it is decoded. Answers leave in request order, so the connection's later
requests wait behind it, as on a broker's throttled channel (KIP-219). A client that
follows KIP-714 never meets the hold. The hold is per connection; many connections
are bounded by the connection limits and by the one-at-a-time, paced vetting of
pushes (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from prometheus_client import CollectorRegistry, Counter

from kproxy.codecs import api_keys
from kproxy.codecs.peek import RequestPeek
from kproxy.policies.connection import ConnectionState


class RefusalHold:
    """When a connection is held, and its held requests answered once the hold is out."""

    def __init__(self, hold_ms: Callable[[], int], clock_ms: Callable[[], int],
                 registry: CollectorRegistry) -> None:
        self.hold_ms = hold_ms  # read at each refusal: a reload applies to the next one
        self.clock_ms = clock_ms
        self.held = Counter(
            "kproxy_telemetry_requests_held", "Telemetry requests held, then refused as "
            "THROTTLING_QUOTA_EXCEEDED, because a push on their connection had been refused "
            "as INVALID_RECORD shortly before (telemetry_refused_push_hold_ms), by API",
            ["api"], registry=registry)

    def refused(self, conn: ConnectionState) -> None:
        """A push of ``conn`` was refused as INVALID_RECORD: hold it from now on."""
        hold = self.hold_ms()
        if hold > 0:
            conn.telemetry_held_until = self.clock_ms() + hold

    def remaining(self, conn: ConnectionState) -> int:
        """How much of ``conn``'s hold is left (ms); 0 when it is not held."""
        until = conn.telemetry_held_until
        if not until:
            return 0
        left = until - self.clock_ms()
        if left <= 0:
            conn.telemetry_held_until = 0
            return 0
        return left

    def answer_if_held(self, conn: ConnectionState, peek: RequestPeek,
                       refusal: Callable[[int], bytes]) -> Awaitable[bytes] | None:
        """While ``conn`` is held: its request's answer, ``refusal(ms held)``, made once
        the hold is out. None when it is not held."""
        wait_ms = self.remaining(conn)
        return self._answer(peek, wait_ms, refusal) if wait_ms else None

    async def _answer(self, peek: RequestPeek, wait_ms: int,
                      refusal: Callable[[int], bytes]) -> bytes:
        self.held.labels(api_keys.api_name(peek.api_key)).inc()
        await trio.sleep(wait_ms / 1000)
        return refusal(wait_ms)
