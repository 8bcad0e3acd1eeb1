"""Per-connection response ordering, without I/O.

Kafka clients require responses in request order (Java's NetworkClient rejects a
correlation id that is not the oldest in flight). Upstream responses already come
in order; responses the proxy makes itself must wait their turn behind every
earlier upstream response. Each request that expects an answer gets a slot; a
slot is filled either by the next upstream response or locally, and filled slots
leave strictly from the head.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kproxy.codecs.errors import CodecError


@dataclass(slots=True)
class Slot:
    correlation_id: int
    api_key: int
    api_version: int
    started: float
    upstream: bool  # answered by the broker (else by the proxy itself)
    frame: bytes | None = None
    context: dict[str, object] = field(default_factory=dict)


class OrderedResponses:
    __slots__ = ("_awaiting_upstream", "_slots")

    def __init__(self) -> None:
        self._slots: deque[Slot] = deque()
        self._awaiting_upstream: deque[Slot] = deque()

    def __len__(self) -> int:
        return len(self._slots)

    def expect_upstream(self, correlation_id: int, api_key: int, api_version: int,
                        now: float) -> Slot:
        slot = Slot(correlation_id, api_key, api_version, now, upstream=True)
        self._slots.append(slot)
        self._awaiting_upstream.append(slot)
        return slot

    def answer_locally(self, correlation_id: int, api_key: int, api_version: int, now: float,
                       frame: bytes) -> Slot:
        slot = Slot(correlation_id, api_key, api_version, now, upstream=False, frame=frame)
        self._slots.append(slot)
        return slot

    def next_upstream(self, correlation_id: int) -> Slot:
        """The slot an upstream response fills; brokers answer in order, so it is the oldest."""
        if not self._awaiting_upstream:
            raise CodecError(f"response with correlation id {correlation_id} but no request "
                             "is waiting for one", what="ResponseHeader.correlation_id")
        slot = self._awaiting_upstream[0]
        if slot.correlation_id != correlation_id:
            raise CodecError(f"response correlation id {correlation_id} does not match the "
                             f"oldest request in flight ({slot.correlation_id})",
                             what="ResponseHeader.correlation_id")
        self._awaiting_upstream.popleft()
        return slot

    def pop_ready(self) -> list[Slot]:
        """Filled slots at the head, in order; stops at the first unfilled one."""
        out = []
        while self._slots and self._slots[0].frame is not None:
            out.append(self._slots.popleft())
        return out

    def upstream_pending(self) -> int:
        return len(self._awaiting_upstream)
