"""Batching, queue bound and retry decisions for the OTLP exporter, as pure state.

Accepted pushes wait in a queue bounded in bytes; a batch leaves when it is big
enough or its oldest push old enough. A failed send is retried with exponential
backoff (or after the collector's Retry-After) until a time budget runs out. Every
push ends with exactly one outcome. Time is passed in (seconds); nothing here does I/O,
so the exporter shell (``kproxy.telemetry.otlp_export``) only awaits what this module decides.
"""

from __future__ import annotations

import email.utils
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# The one outcome each push ends with (label values of kproxy_telemetry_export_total).
EXPORTED = "exported"
QUEUE_FULL = "dropped_queue_full"  # the collector was behind: dropped before sending
FAILED = "dropped_failed"  # retries exhausted, or the collector unreachable throughout
REJECTED = "rejected"  # the collector refused it (4xx other than 429): not retried
OUTCOMES = (EXPORTED, QUEUE_FULL, FAILED, REJECTED)


@dataclass(frozen=True)
class BatchSettings:
    max_batch_bytes: int = 1024 * 1024  # payload bytes per request (a larger push goes alone)
    max_batch_age: float = 2.0  # seconds the oldest queued push may wait for company
    max_queue_bytes: int = 16 * 1024 * 1024  # waiting pushes, beyond them new ones drop
    max_retry_time: float = 60.0  # seconds a batch may be retried before it is dropped
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


@dataclass(frozen=True, slots=True)
class Push:
    """One accepted push: its OTLP MetricsData bytes and what the proxy adds to it."""

    payload: bytes
    resource: Mapping[str, str]
    at: float  # when it was queued

    @property
    def size(self) -> int:
        return len(self.payload) + sum(len(k) + len(v) for k, v in self.resource.items())


@dataclass
class Batch:
    pushes: list[Push]
    first_attempt_at: float | None = None
    attempts: int = 0

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pushes)


class ExportQueue:
    """Pushes waiting to be sent, bounded in bytes; batches taken from the head."""

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self._pushes: deque[Push] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._pushes)

    def offer(self, push: Push) -> bool:
        """Queue it, or refuse it (the caller counts a drop) when the bound would be passed."""
        size = push.size
        if self.bytes + size > self.settings.max_queue_bytes:
            return False
        self._pushes.append(push)
        self.bytes += size
        return True

    def due_at(self) -> float | None:
        """When the next batch is due: now if full enough, else when the oldest ages out."""
        if not self._pushes:
            return None
        if self.bytes >= self.settings.max_batch_bytes:
            return self._pushes[0].at
        return self._pushes[0].at + self.settings.max_batch_age

    def take(self, now: float, force: bool = False) -> Batch | None:
        """The next batch if one is due (or ``force``, to flush at shutdown), else None."""
        due = self.due_at()
        if due is None or (now < due and not force):
            return None
        taken: list[Push] = []
        size = 0
        while self._pushes:
            nxt = self._pushes[0].size
            if taken and size + nxt > self.settings.max_batch_bytes:
                break
            taken.append(self._pushes.popleft())
            size += nxt
        self.bytes -= size
        return Batch(taken)


@dataclass(frozen=True)
class Decision:
    """What to do with a batch after an attempt: done (with an outcome) or retry at a time."""

    outcome: str | None  # set when the batch is finished
    retry_at: float | None = None
    reason: str = ""


def retryable(status: int | None) -> bool:
    """No answer at all (refused, reset, timed out), 429, or any 5xx: worth another try."""
    return status is None or status == 429 or 500 <= status <= 599


def parse_retry_after(value: str | None, wall_now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - wall_now)


@dataclass
class RetryPolicy:
    settings: BatchSettings
    jitter: Callable[[], float] = field(default=random.random)  # in [0, 1)

    def after_attempt(self, batch: Batch, status: int | None, retry_after: str | None,
                      now: float, wall_now: float) -> Decision:
        """Account one attempt on ``batch`` (answered ``status``, None if no answer)."""
        if batch.first_attempt_at is None:
            batch.first_attempt_at = now
        batch.attempts += 1
        if status is not None and 200 <= status <= 299:
            return Decision(EXPORTED)
        if not retryable(status):
            return Decision(REJECTED, reason=f"collector answered {status}")
        what = "no answer" if status is None else f"collector answered {status}"
        delay = parse_retry_after(retry_after, wall_now) if status is not None else None
        if delay is None:
            s = self.settings
            ceiling = min(s.backoff_max, s.backoff_initial * 2 ** (batch.attempts - 1))
            delay = ceiling * (0.5 + 0.5 * self.jitter())  # never less than half the ceiling
        retry_at = now + delay
        if retry_at - batch.first_attempt_at > self.settings.max_retry_time:
            return Decision(FAILED, reason=f"{what}; giving up after {batch.attempts} "
                            f"attempt(s) (max_retry_time {self.settings.max_retry_time:g}s)")
        return Decision(None, retry_at, reason=what)
