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
from dataclasses import dataclass

from kproxy.codecs.framing import Frame
from kproxy.codecs.peek import RequestPeek
from kproxy.session.errors import ProtocolViolation


@dataclass(slots=True)
class Slot:
    correlation_id: int
    api_key: int
    api_version: int
    started: float
    upstream: bool  # answered by the broker (else by the proxy itself)
    # The response as it goes out, size prefix included.
    wire: Frame | bytes | memoryview | None = None
    upstream_version: int = -1  # when the proxy sent another version upstream (Metadata)
    throttle_ms: int = 0  # quotas: the throttle_time_ms its response must carry


# acks=0 Produce requests whose (unexpected) answer we would still recognise.
ACKS0_REMEMBERED = 1024


class OrderedResponses:
    __slots__ = ("_acks0", "_acks0_order", "_awaiting_upstream", "_slots", "stray_discarded")

    def __init__(self) -> None:
        # Lists, not deques: an empty deque keeps a 64-slot block (~760 bytes) for the
        # life of an idle connection, an empty list nothing; taking from the front of a
        # list moves at most max_inflight pointers.
        self._slots: list[Slot] = []
        self._awaiting_upstream: list[Slot] = []
        # A real broker never answers acks=0; some Kafka-compatible ones do. Such an
        # answer must not reach the client, which is not waiting for it. The last
        # few ids are remembered (bounded: a pure acks=0 producer gets no answers),
        # in a set and its order, both made at the first acks=0 request.
        self._acks0: set[int] | None = None
        self._acks0_order: deque[int] | None = None
        self.stray_discarded = 0

    def __len__(self) -> int:
        return len(self._slots)

    def expect_upstream(self, correlation_id: int, api_key: int, api_version: int,
                        now: float) -> Slot:
        slot = Slot(correlation_id, api_key, api_version, now, upstream=True)
        self._slots.append(slot)
        self._awaiting_upstream.append(slot)
        return slot

    def expect(self, peek: RequestPeek, now: float, upstream_version: int,
               throttle_ms: int = 0) -> None:
        """A request taken for the broker: the slot of its answer (the version it went
        upstream at, the throttle its answer carries), or none for an acks=0 Produce."""
        if peek.expects_response:  # expect_upstream's work, one call less a request
            slot = Slot(peek.correlation_id, peek.api_key, peek.api_version, now, True, None,
                        upstream_version, throttle_ms)
            self._slots.append(slot)
            self._awaiting_upstream.append(slot)
        else:
            self.expect_nothing(peek.correlation_id)

    def expect_nothing(self, correlation_id: int) -> None:
        """An acks=0 request went upstream: no answer is owed to the client."""
        if self._acks0 is None or self._acks0_order is None:
            self._acks0, self._acks0_order = set(), deque()
        elif len(self._acks0_order) >= ACKS0_REMEMBERED:
            self._acks0.discard(self._acks0_order.popleft())
        self._acks0.add(correlation_id)
        self._acks0_order.append(correlation_id)

    def answer_locally(self, correlation_id: int, api_key: int, api_version: int, now: float,
                       wire: bytes) -> Slot:
        slot = Slot(correlation_id, api_key, api_version, now, upstream=False, wire=wire)
        self._slots.append(slot)
        return slot

    def answer_later(self, correlation_id: int, api_key: int, api_version: int,
                     now: float) -> Slot:
        """A local answer still being made: it holds its place until its ``wire`` is set."""
        slot = Slot(correlation_id, api_key, api_version, now, upstream=False)
        self._slots.append(slot)
        return slot

    def peek_upstream(self, correlation_id: int) -> Slot | None:
        """The slot the upstream response with this id will fill, without taking it."""
        head = self._awaiting_upstream[0] if self._awaiting_upstream else None
        return head if head is not None and head.correlation_id == correlation_id else None

    def is_next(self, slot: Slot) -> bool:
        """Whether ``slot`` is the oldest response still owed to the client."""
        return bool(self._slots) and self._slots[0] is slot

    def pop_head(self, slot: Slot) -> None:
        """Take ``slot`` off the head without a ``wire``: it was passed through as it came."""
        assert self._slots[0] is slot
        del self._slots[0]

    def expects_next(self, correlation_id: int) -> bool:
        """Whether ``next_upstream`` would return the oldest slot for ``correlation_id``
        (not a stray answer to drop, not a violation): a check without side effects."""
        awaiting = self._awaiting_upstream
        return bool(awaiting) and awaiting[0].correlation_id == correlation_id

    def next_upstream(self, correlation_id: int) -> Slot | None:
        """The slot an upstream response fills; brokers answer in order, so it is the oldest.

        None means the response answers an acks=0 request and is to be dropped.
        """
        head = self._awaiting_upstream[0] if self._awaiting_upstream else None
        acks0 = self._acks0
        if (head is None or head.correlation_id != correlation_id) and (
                acks0 is not None and correlation_id in acks0):
            acks0.discard(correlation_id)
            self.stray_discarded += 1
            return None
        if not self._awaiting_upstream:
            raise ProtocolViolation(f"response with correlation id {correlation_id} but no "
                                    "request is waiting for one")
        slot = self._awaiting_upstream[0]
        if slot.correlation_id != correlation_id:
            raise ProtocolViolation(f"response correlation id {correlation_id} does not "
                                    f"match the oldest request in flight "
                                    f"({slot.correlation_id})")
        del self._awaiting_upstream[0]
        return slot

    def pop_ready(self) -> list[Slot]:
        """Filled slots at the head, in order; stops at the first unfilled one."""
        slots = self._slots
        n = 0
        while n < len(slots) and slots[n].wire is not None:
            n += 1
        out = slots[:n]
        del slots[:n]
        return out
