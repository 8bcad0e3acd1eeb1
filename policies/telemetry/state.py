"""KIP-714 client telemetry with a broker's semantics, as pure state and decisions.

The rules follow Kafka's ClientMetricsManager: which subscription a client gets,
its instance and subscription ids, when a push is too early, which error a bad
push earns and in which order the checks run, and when an instance is forgotten.
Time is passed in (milliseconds); nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from kproxy.codecs import compression
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import decode_metrics_data
from kproxy.codecs.otlp.shape import Shape
from kproxy.codecs.otlp.vetting import limit_of
from kproxy.policies.bounds import MAX_LABEL_CHARS, bounded
from kproxy.policies.telemetry.store import Landing
from kproxy.policies.telemetry.subscriptions import TelemetrySettings, resolve

# Kafka error codes used by the telemetry APIs (names kept short for the checks below).
NONE = ErrorCode.NONE
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
UNSUPPORTED_COMPRESSION_TYPE = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
INVALID_RECORD = ErrorCode.INVALID_RECORD
THROTTLING_QUOTA_EXCEEDED = ErrorCode.THROTTLING_QUOTA_EXCEEDED
UNKNOWN_SUBSCRIPTION_ID = ErrorCode.UNKNOWN_SUBSCRIPTION_ID
TELEMETRY_TOO_LARGE = ErrorCode.TELEMETRY_TOO_LARGE

ERROR_NAMES: dict[int, str] = {
    NONE: "none", INVALID_REQUEST: "invalid_request",
    UNSUPPORTED_COMPRESSION_TYPE: "unsupported_compression_type",
    INVALID_RECORD: "invalid_record", THROTTLING_QUOTA_EXCEEDED: "throttling_quota_exceeded",
    UNKNOWN_SUBSCRIPTION_ID: "unknown_subscription_id",
    TELEMETRY_TOO_LARGE: "telemetry_too_large",
}

EXPIRY_SWEEP_MS = 1000
EXPIRY_STEP = 128  # instances looked at per step of a sweep in steps (expire_steps)
REQUEST_EXPIRY_STEP = 32  # per step of the sweep that requests advance (_maybe_expire)
INSTANCE_OVERHEAD = 1024  # bytes per instance beside its attribute strings
LAST_PUSH_OVERHEAD = 256  # bytes a LastPush holds beside its per-point slots
_NEVER = 2**63  # a deadline later than any (ms)


@dataclass(frozen=True, slots=True)
class LastPush:
    """A client's last small push: where its numbers lie (``codecs.otlp.shape``) and
    which series its points updated, so that its next push, shaped the same, updates
    them from its values alone, without a decode."""

    shape: Shape
    landing: Landing

    @property
    def size(self) -> int:
        """Estimated bytes it holds: a slot per point in each of the landing's tuples,
        and the shape's own (``Shape.held_bytes``, its struct formats included)."""
        landing = self.landing
        slots = len(landing.series) + len(landing.summed) + len(landing.capped)
        return LAST_PUSH_OVERHEAD + 8 * slots + self.shape.held_bytes


@dataclass
class ClientInstance:
    """One client instance's subscription and pacing.

    A fleet has one of these per client, for minutes, and a full collection walks
    every tracked object with the loop held (82 ms at 20,000 instances when each held
    five). So the instance is one tracked object, this, and what it holds is not
    tracked: its id as the int of its 128 bits (``uuid`` gives the UUID back), its
    subscription's fields inline, not in an object of their own.
    """

    instance_id: int  # uuid.UUID.int
    attrs: dict[str, str]
    requested_metrics: tuple[str, ...]  # the three fields of its ``Resolved`` subscription
    interval_ms: int
    subscription_id: int
    settings_version: int
    last_get_ms: int = 0
    last_push_ms: int = 0
    terminating: bool = False
    last_error: int = NONE
    last_seen_ms: int = 0
    # Its pushes still being decoded, paced, off the request path: until they are
    # done, its next push waits behind them, so that pushes are ingested in order.
    paced: int = 0
    last_push: LastPush | None = None
    pushed_ms: int = 0  # when a push of it was last accepted (several workers compare it)
    asked: bool = False  # it sent a Get or a push here since it was (re)made

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.instance_id)

    @property
    def size(self) -> int:
        """Estimated bytes this instance holds (its attributes are bounded in length)."""
        attrs = sum(len(k) + len(v) for k, v in self.attrs.items())
        return INSTANCE_OVERHEAD + attrs + (self.last_push.size if self.last_push else 0)

    @property
    def expires_after_ms(self) -> int:
        return max(60_000, 3 * self.interval_ms)

    @property
    def deadline_ms(self) -> int:
        """The last moment it is remembered unseen; later, it has expired."""
        return self.last_seen_ms + self.expires_after_ms

    def expired(self, now: int) -> bool:
        return now > self.deadline_ms

    def may_get(self, now: int) -> bool:
        first, self.asked = not self.asked, True
        if first or now - max(self.last_get_ms, self.last_push_ms) >= self.interval_ms:
            self.last_get_ms = now
            return True
        return False

    def may_push(self, now: int) -> bool:
        # The first push after a Get may come early: clients add jitter to it. So may
        # the first request of an instance new here, as at a broker (whose clock starts
        # at the epoch): its Get went to another worker, or to this one before a restart.
        first, self.asked = not self.asked, True
        ok = first or self.last_get_ms > self.last_push_ms or (
            now - max(self.last_get_ms, self.last_push_ms) >= self.interval_ms)
        if ok:
            self.last_push_ms = now
        return ok


@dataclass
class GetResult:
    error_code: int
    instance: ClientInstance | None = None


@dataclass
class PushResult:
    error_code: int
    instance: ClientInstance | None = None
    metrics: list[otlp.ResourceMetrics] = field(default_factory=list)
    detail: str = ""
    raw: bytes = b""  # the decompressed OTLP payload, for the archive
    limit: str = ""  # the decode limit a refused push passed, if that was the reason
    compression_type: int = 0


@dataclass
class PendingPush:
    """A push that passed every check; its payload is still to be decompressed and decoded.

    Those two steps are the costly ones, so the caller runs them where they cannot
    hold up other connections (``decompress`` and ``decoder``), then ``finish_push``.
    """

    instance: ClientInstance
    compression_type: int
    payload: bytes
    terminating: bool
    now: int


class TelemetryState:
    """Every known client instance, bounded by count (LRU) and by age (expiry)."""

    def __init__(self, settings: TelemetrySettings,
                 new_instance_id: Callable[[], uuid.UUID] = uuid.uuid4,
                 on_forget: Callable[[int], None] | None = None) -> None:
        self.settings = settings
        self.version = 0
        # By the id's int (``ClientInstance.instance_id``); ``on_forget`` is given it too.
        self.instances: OrderedDict[int, ClientInstance] = OrderedDict()
        self._new_id = new_instance_id
        self._on_forget = on_forget
        self._swept_at: int | None = None
        self._sweep: Iterator[int] | None = None  # the requests' sweep in progress
        # No instance expires at or before this (ms): till then a sweep looks at none
        # (copying 20,000 ids to look at them held a scrape's loop 4-6 ms). Lowered as
        # an instance is seen (``_note_deadline``), set by each sweep that completes.
        self._expiry_floor = 0
        self._open_sweeps: list[list[int]] = []  # each: the lowest deadline noted since
        self.instance_bytes = 0
        # Instances forgotten before their time, by the bound that made room: "instances"
        # (max_instances) or "bytes" (max_instance_bytes). The client's next push is
        # taken as a first one (its subscription id is deterministic) and its series
        # start again: a fleet larger than the bounds churns, and this is where an
        # operator sees it.
        self.evicted = {"instances": 0, "bytes": 0}

    def reconfigure(self, settings: TelemetrySettings) -> None:
        """New settings; if what a subscription tells a client changed, every instance
        gets a fresh subscription on its next request. Lower bounds apply at once."""
        if settings.told_to_clients() != self.settings.told_to_clients():
            self.version += 1
        self.settings = settings
        self._evict()

    def expire(self, now: int) -> int:
        """Forget every instance not seen within its expiry; how many went."""
        *_, gone = self.expire_steps(now, len(self.instances) or 1)
        return gone

    def expire_steps(self, now: int, per_step: int = EXPIRY_STEP) -> Generator[int, None, None]:
        """``expire`` a step at a time, for a caller that lets others run between steps
        (a scrape, where 1,000 instances took 2 ms at once): a step looks at
        ``per_step`` instances, or ends at one forgotten (its series go with it). Yields
        how many went so far; instances that change meanwhile are judged as they are."""
        self._swept_at = now
        if now <= self._expiry_floor:
            yield 0  # every instance expires later
            return
        lowest = [_NEVER]
        self._open_sweeps.append(lowest)
        try:
            yield from self._sweep_steps(now, per_step, lowest)
        finally:  # completed or abandoned (a scrape cancelled): no longer told of changes
            self._open_sweeps.remove(lowest)

    def _sweep_steps(self, now: int, per_step: int, lowest: list[int]) -> Iterator[int]:
        ids = list(self.instances)
        gone = looked = 0
        for instance_id in ids:
            inst = self.instances.get(instance_id)
            looked += 1
            if inst is not None and inst.expired(now):
                self._forget(instance_id)
                gone += 1
                looked = per_step
            elif inst is not None:
                lowest[0] = min(lowest[0], inst.deadline_ms)
            if looked >= per_step:
                looked = 0
                yield gone
        # Every instance was looked at, or is new or moved earlier since (noted).
        self._expiry_floor = lowest[0]
        yield gone

    def _note_deadline(self, inst: ClientInstance) -> None:
        """An instance is new, seen again or ends soon: sweeps must not skip its expiry."""
        deadline = inst.deadline_ms
        self._expiry_floor = min(self._expiry_floor, deadline)
        for lowest in self._open_sweeps:
            lowest[0] = min(lowest[0], deadline)

    def _forget(self, instance_id: int) -> None:
        gone = self.instances.pop(instance_id, None)
        if gone is None:
            return
        self.instance_bytes -= gone.size
        if self._on_forget:
            self._on_forget(instance_id)

    def _instance(self, instance_uuid: uuid.UUID, attrs: dict[str, str],
                  now: int) -> ClientInstance:
        instance_id = instance_uuid.int
        inst = self.instances.get(instance_id)
        if inst is not None and inst.expired(now):
            self._forget(instance_id)  # expired, not swept yet: as if it had been
            inst = None
        if inst is None or inst.settings_version != self.version:
            # Unknown, expired or resolved under an older policy: start afresh, as a
            # broker does, so a stale subscription id is answered with 117.
            # Attributes are what the client chose: bounded before they are matched,
            # kept, or become labels.
            full = {k: bounded(v, MAX_LABEL_CHARS) for k, v in attrs.items()}
            full["client_instance_id"] = str(instance_uuid)
            if inst is not None:
                self.instance_bytes -= inst.size
            inst = ClientInstance(instance_id, full,
                                  *resolve(self.settings, instance_uuid, full), self.version)
            self.instances[instance_id] = inst
            self.instance_bytes += inst.size
        self.instances.move_to_end(instance_id)
        inst.last_seen_ms = now
        self._note_deadline(inst)
        self._evict()
        return inst

    def note_last_push(self, inst: ClientInstance, last: LastPush | None) -> None:
        """Keep (or drop) what an instance's next push may be landed by; it is counted
        in the instance's bytes like its attributes."""
        if inst.last_push is last:
            return
        before = inst.size
        inst.last_push = last
        if self.instances.get(inst.instance_id) is inst:
            self.instance_bytes += inst.size - before
            self._evict()

    def _evict(self) -> None:
        """The least recently seen instances go until count and bytes are within bounds
        (the most recent one always stays)."""
        while len(self.instances) > 1:
            if len(self.instances) > self.settings.max_instances:
                self.evicted["instances"] += 1
            elif self.instance_bytes > self.settings.max_instance_bytes:
                self.evicted["bytes"] += 1
            else:
                return
            self._forget(next(iter(self.instances)))

    def _maybe_expire(self, now: int) -> None:
        """A step of a sweep per request, a sweep begun at most once a second: no
        request pays for every instance at once (13,800 took 10.7 ms in a check, about
        20 us a step). The instance a request names is judged on its own
        (``_instance``)."""
        sweep = self._sweep
        if sweep is None:
            if self._swept_at is not None and now - self._swept_at < EXPIRY_SWEEP_MS:
                return
            sweep = self._sweep = self.expire_steps(now, REQUEST_EXPIRY_STEP)
        if next(sweep, None) is None:
            self._sweep = None

    def get_subscriptions(self, instance_id: uuid.UUID, attrs: dict[str, str],
                          now: int) -> GetResult:
        self._maybe_expire(now)
        if instance_id.int == 0:
            instance_id = self._new_id()
        inst = self._instance(instance_id, attrs, now)
        if not inst.may_get(now) and inst.last_error not in (UNKNOWN_SUBSCRIPTION_ID,
                                                             UNSUPPORTED_COMPRESSION_TYPE):
            return GetResult(THROTTLING_QUOTA_EXCEEDED)
        inst.last_error = NONE
        return GetResult(NONE, inst)

    def push(self, instance_id: uuid.UUID, subscription_id: int, terminating: bool,
             compression_type: int, payload: bytes | None, attrs: dict[str, str],
             now: int) -> PushResult:
        """The whole push in one call: checks, decompression, decode (tests, tools)."""
        started = self.begin_push(instance_id, subscription_id, terminating, compression_type,
                                  payload, attrs, now)
        if isinstance(started, PushResult):
            return started
        try:
            raw = self.decompress(started)
            metrics = decode_metrics_data(raw, self.settings.decode_limits)
        except CodecError as exc:
            return self.fail_push(started, exc)
        return self.finish_push(started, raw, metrics)

    def begin_push(self, instance_id: uuid.UUID, subscription_id: int, terminating: bool,
                   compression_type: int, payload: bytes | None, attrs: dict[str, str],
                   now: int) -> PushResult | PendingPush:
        """Every check of a push, in the broker's order; a ``PendingPush`` if all pass."""
        self._maybe_expire(now)
        if instance_id.int == 0:
            return PushResult(INVALID_REQUEST, detail="zero client instance id")
        inst = self._instance(instance_id, attrs, now)
        error, detail = self._check_push(inst, subscription_id, terminating, compression_type,
                                         payload, now)
        if error:
            inst.last_error = error
            return PushResult(error, inst, detail=detail,
                              limit="bytes" if error == TELEMETRY_TOO_LARGE else "")
        inst.terminating = terminating
        pending = PendingPush(inst, compression_type, payload or b"", terminating, now)
        if not payload:
            return self.finish_push(pending, b"", [])
        return pending

    def decompress(self, pending: PendingPush) -> bytes:
        """The payload decompressed, never past ``max_decompressed_bytes`` (CodecError)."""
        return compression.decompress(pending.compression_type, pending.payload,
                                      self.settings.max_decompressed_bytes)

    def fail_push(self, pending: PendingPush, exc: CodecError) -> PushResult:
        """The payload did not decompress or decode, or passed a decode limit: 87."""
        pending.instance.last_error = INVALID_RECORD
        return PushResult(INVALID_RECORD, pending.instance, detail=str(exc),
                          limit=limit_of(exc))

    def finish_push(self, pending: PendingPush, raw: bytes,
                    metrics: list[otlp.ResourceMetrics]) -> PushResult:
        inst = pending.instance
        inst.last_error = NONE
        inst.pushed_ms = max(inst.pushed_ms, pending.now)
        if pending.terminating:
            # Its last push: keep the values for a scrape or two, then let it expire.
            inst.last_seen_ms = pending.now - inst.expires_after_ms + 2 * 60_000
            self._note_deadline(inst)
        return PushResult(NONE, inst, metrics, raw=raw,
                          compression_type=pending.compression_type)

    def remembers(self, inst: ClientInstance) -> bool:
        """Whether ``inst`` is still the remembered instance (not expired or evicted since)."""
        return self.instances.get(inst.instance_id) is inst

    def _check_push(self, inst: ClientInstance, subscription_id: int, terminating: bool,
                    compression_type: int, payload: bytes | None, now: int) -> tuple[int, str]:
        if inst.terminating:
            return INVALID_REQUEST, "push after a terminating push"
        if not inst.may_push(now) and not terminating:
            return THROTTLING_QUOTA_EXCEEDED, "push before the push interval elapsed"
        if subscription_id != inst.subscription_id:
            return UNKNOWN_SUBSCRIPTION_ID, "stale subscription id"
        if compression_type not in (0, *self.settings.compression_types):
            return UNSUPPORTED_COMPRESSION_TYPE, f"compression type {compression_type}"
        if payload is not None and len(payload) > self.settings.max_bytes:
            return TELEMETRY_TOO_LARGE, f"{len(payload)} bytes > {self.settings.max_bytes}"
        return NONE, ""
