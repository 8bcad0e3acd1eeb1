"""KIP-714 termination in the proxy: the two local handlers and the /metrics collector.

GetTelemetrySubscriptions (71) and PushTelemetry (72) are answered here and never
reach the broker; the decisions are ``policies.telemetry.state``'s, the series
``policies.telemetry.store``'s. The answers go through the connection's ordered
queue like any other response.

A push that passed its checks is decoded where it cannot hold up other
connections. An ordinary push (a few kilobytes, some dozens of points) costs less
than the machinery to move it elsewhere: when its compressed and decompressed
sizes and its number of points are small (``codecs.otlp.small``), it is decoded
and ingested at once and answered like any other local answer, its work bounded
by those sizes and taken from the pacer's bucket; once that bucket is empty (small
pushes back to back, such as a client asking for a fresh instance before each
push), small pushes are paced too. Any other push is paced: first vetted by a
helper process of the kernel's idle class (``vetting_process``), which decodes it to
its end and answers only whether it passed its bounds, so a refused push (a bomb)
costs this process no decoding; then, if it passed or the helper had no verdict,
decompression on a thread of the idle class (``idle_thread``; the codecs release the
interpreter lock), the bounded OTLP decode and the ingest on the event loop in
small steps, with a sleep at least every ``pacing.REST_EVERY`` of work so that the
express lane's thread gets the interpreter, and all of it together takes at most
``DECODE_SHARE`` of a core over time. One paced push is
decoded at a time (``DECODE_CONCURRENCY``); the connection that sent it waits for
its answer, the others do not wait at all. A client's pushes are ingested in the
order they came: while one of its pushes is paced, the next is paced behind it. After a
push refused as INVALID_RECORD, its connection's telemetry is held (``refusal_hold``).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid
from collections.abc import Awaitable, Callable

import trio

from kproxy.archive import ArchiveWriter
from kproxy.codecs import api_keys, compression
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_request, encode_response_parts
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import MetricsDecoder
from kproxy.codecs.otlp.shape import RecentShapes, Shape
from kproxy.codecs.otlp.small import SMALL_BYTES, decode_small
from kproxy.codecs.otlp.vetting import VetRequest
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.push_request import decode_push
from kproxy.config.settings import TelemetryConfig
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.bounds import MAX_LABEL_CHARS, bounded
from kproxy.policies.connection import ConnectionState
from kproxy.policies.telemetry import state as policy
from kproxy.policies.telemetry import subscriptions as subs
from kproxy.policies.telemetry.store import IngestStats, MetricsStore
from kproxy.telemetry.counters import TelemetryCounters
from kproxy.telemetry.exposition import ClientMetricsCollector
from kproxy.telemetry.idle_thread import IdleTime, IdleTimeCollector
from kproxy.telemetry.pacing import Pacer, PacerCollector
from kproxy.telemetry.refusal_hold import RefusalHold
from kproxy.telemetry.vetting_process import VettingProcess

log = logging.getLogger("kproxy.telemetry")
_CORRELATION_ID = struct.Struct(">i")
DECODE_CONCURRENCY = 1  # pushes decompressed and decoded at once, proxy-wide
DECODE_SHARE = 0.25  # of the time (one core), for all telemetry decoding together


PushListener = Callable[[ConnectionState, policy.ClientInstance, bytes], None]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _call_now(fn: Callable[..., object], *args: object) -> None:
    fn(*args)


class TelemetryService:
    def __init__(self, cfg: TelemetryConfig, metrics: ProxyMetrics,
                 clock_ms: Callable[[], int] = _now_ms,
                 archive: ArchiveWriter | None = None,
                 in_trio: Callable[..., None] | None = None) -> None:
        self.cfg = cfg
        # How a listener is called: a small push is answered where its request is
        # relayed, in the express lane's thread too, and listeners belong to trio.
        self.in_trio: Callable[..., None] = in_trio or _call_now
        self.archive = archive
        self.clock_ms = clock_ms
        self.store = MetricsStore(cfg.metric_prefix, cfg.max_series, cfg.max_series_bytes)
        self.state = policy.TelemetryState(cfg.settings, on_forget=self.store.forget)
        r = metrics.registry
        self.counts = TelemetryCounters(r)
        self.hold = RefusalHold(lambda: self.state.settings.refused_push_hold_ms,
                                self.clock_ms, r)
        self.decode_limiter = trio.CapacityLimiter(DECODE_CONCURRENCY)
        self.pacer = Pacer(DECODE_SHARE)
        self.idle_time = IdleTime()  # whether the idle class has had time to spare
        self.vetting = VettingProcess(idle_time=self.idle_time)
        r.register(PacerCollector(self.pacer, "telemetry_decode"))
        r.register(IdleTimeCollector(self.idle_time))
        metrics.piece_sources.append(ClientMetricsCollector(self))
        self.hostname = socket.gethostname()
        # By (version, error): a push answer's bytes, bounded by the versions and codes
        # that exist.
        self._answers: dict[tuple[int, int], bytes] = {}
        self.shapes = RecentShapes()
        # Called with every accepted push (connection, instance, decompressed OTLP bytes);
        # they only take note and never wait. ``push_listeners`` run in trio's thread
        # (``in_trio``: the OTLP exporter, which wakes its task); ``push_notes`` run where
        # the push is answered, the express lane's thread included, and must not call
        # trio (the status page's push times): a push answered in the lane then wakes
        # no trio pass, which the produce requests behind it would wait for.
        self.push_listeners: list[PushListener] = []
        self.push_notes: list[PushListener] = []

    def reconfigure(self, cfg: TelemetryConfig) -> None:
        self.cfg = cfg
        self.state.reconfigure(cfg.settings)
        self.store.max_series = cfg.max_series
        self.store.max_series_bytes = cfg.max_series_bytes

    @staticmethod
    def attributes(session: ConnectionState) -> dict[str, str]:
        info = session.info
        return {"client_id": bounded(info.client_id or "", MAX_LABEL_CHARS),
                "client_software_name": bounded(info.software_name or "", MAX_LABEL_CHARS),
                "client_software_version": bounded(info.software_version or "",
                                                   MAX_LABEL_CHARS),
                "client_source_address": info.source_address,
                "client_source_port": str(info.source_port)}

    def handle_get(self, session: ConnectionState, peek: RequestPeek,
                   frame: memoryview) -> bytes | Awaitable[bytes]:
        held = self.hold.answer_if_held(session, peek, lambda ms: self._get_answer(
            peek, policy.GetResult(policy.THROTTLING_QUOTA_EXCEEDED), ms))
        if held is not None:
            return held
        body = decode_request(frame).body
        result = self.state.get_subscriptions(body["client_instance_id"],
                                              self.attributes(session), self.clock_ms())
        self.counts.evictions(self.state)
        return self._get_answer(peek, result)

    def _get_answer(self, peek: RequestPeek, result: policy.GetResult,
                    throttle_ms: int = 0) -> bytes:
        self.counts.get_answered(result.error_code)
        settings = self.state.settings
        inst = result.instance
        reply = {
            "throttle_time_ms": throttle_ms, "error_code": result.error_code,
            "client_instance_id": inst.uuid if inst else uuid.UUID(int=0),
            "subscription_id": inst.subscription_id if inst else 0,
            "accepted_compression_types": list(settings.compression_types),
            "push_interval_ms": inst.interval_ms if inst else
            subs.DEFAULT_INTERVAL_MS,
            "telemetry_max_bytes": settings.max_bytes,
            "delta_temporality": settings.delta_temporality,
            "requested_metrics": list(inst.requested_metrics) if inst else [],
        }
        return encode_response_parts(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, peek.api_version,
                                     peek.correlation_id, reply)

    def handle_push(self, session: ConnectionState, peek: RequestPeek,
                    frame: memoryview) -> bytes | Awaitable[bytes]:
        """The answer at once when a check fails; else an awaitable that decodes first
        (or, on a held connection, that waits out the hold)."""
        held = self.hold.answer_if_held(session, peek, lambda ms: self._answer(
            session, peek, policy.PushResult(policy.THROTTLING_QUOTA_EXCEEDED,
                                             detail="connection held"), ms))
        if held is not None:
            return held
        body = decode_push(frame, peek.api_version, peek.body_offset)
        started = self.state.begin_push(
            body["client_instance_id"], body["subscription_id"], body["terminating"],
            body["compression_type"], body["metrics"], self.attributes(session),
            self.clock_ms())
        self.counts.evictions(self.state)  # an instance it forgot is made again here
        if isinstance(started, policy.PushResult):
            return self._answer(session, peek, started)
        raw: bytes | None = None
        if (len(started.payload) <= SMALL_BYTES and not started.instance.paced
                and self.pacer.may_spend()):
            began = time.thread_time()
            try:
                result, raw = self._decode_small(session, started)
            finally:
                self.pacer.spent(time.thread_time() - began)
            if result is not None:
                return self._answer(session, peek, result)
        started.instance.paced += 1
        self.state.note_last_push(started.instance, None)  # its series may change otherwise
        return self._decode_and_answer(session, peek, started, raw)

    def _decode_small(self, session: ConnectionState, pending: policy.PendingPush
                      ) -> tuple[policy.PushResult | None, bytes | None]:
        """A small push decompressed, decoded and ingested at once; else (None, the
        payload decompressed if that went within SMALL_BYTES) for the paced path.

        A push shaped like its client's last one is not decoded: its values are read
        where the last one's were, and update the series the last one's points did.
        """
        limit = min(SMALL_BYTES, self.state.settings.max_decompressed_bytes)
        try:
            raw = compression.decompress(pending.compression_type, pending.payload, limit)
        except CodecError:  # the paced path decompresses it again and decides
            return None, None
        inst, limits = pending.instance, self.state.settings.decode_limits
        values = None if inst.last_push is None else inst.last_push.shape.values(raw)
        metrics, shape = None, None
        if values is None:
            known = self.shapes.decode(raw, limits)  # a shape other clients pushed
            if known is not None:
                shape, metrics = known
            else:
                metrics = decode_small(raw, limits)
                if metrics is None:
                    return None, raw
        result = self.state.finish_push(pending, raw, metrics or [])
        if self._take_note(session, result) and self.cfg.prometheus and (
                metrics or values is not None):
            self.counts.ingested(self._ingest_small(inst, raw, metrics, values, shape),
                                self.store.max_series)
        return result, raw

    def _ingest_small(self, inst: policy.ClientInstance, raw: bytes,
                      metrics: list[otlp.ResourceMetrics] | None,
                      values: list[int | float] | None, shape: Shape | None) -> IngestStats:
        delta, limits = self.state.settings.delta_temporality, self.state.settings.decode_limits
        if values is not None and inst.last_push is not None:
            stats = self.store.land(inst.instance_id, inst.last_push.landing, values, delta)
            if stats is not None:
                return stats
            metrics = decode_small(raw, limits)
        stats, landing = self.store.ingest_noting(inst.instance_id, inst.attrs,
                                                  metrics or [], delta)
        if landing is not None and shape is None and metrics:
            shape = self.shapes.note(raw, metrics, limits)
        self.state.note_last_push(
            inst, policy.LastPush(shape, landing) if shape and landing else None)
        return stats

    async def _decode_and_answer(self, session: ConnectionState, peek: RequestPeek,
                                 pending: policy.PendingPush, raw: bytes | None) -> bytes:
        try:
            async with self.decode_limiter:
                if self.hold.remaining(session):  # one of its pushes refused meanwhile
                    result = policy.PushResult(policy.THROTTLING_QUOTA_EXCEEDED,
                                               pending.instance, detail="connection held")
                else:
                    result = await self._decode(pending, raw)
                if not result.error_code:
                    await self._accept(session, result)
        finally:
            pending.instance.paced -= 1
        return self._answer(session, peek, result)

    async def _decode(self, pending: policy.PendingPush,
                      raw: bytes | None) -> policy.PushResult:
        """Vetted by the helper process, then (unless it refused) decompressed (unless
        ``raw`` already is) and decoded here, paced, in steps."""
        try:
            await self._vet(pending, raw)
            if raw is None and pending.compression_type:
                raw = await self.pacer.in_thread(lambda: self.state.decompress(pending),
                                                 self.idle_time)
            elif raw is None:
                raw = pending.payload
            decoder = MetricsDecoder(raw, self.state.settings.decode_limits)
            await self.pacer.steps(decoder.steps())
        except CodecError as exc:
            return self.state.fail_push(pending, exc)
        return self.state.finish_push(pending, raw, decoder.result)

    async def _vet(self, pending: policy.PendingPush, raw: bytes | None) -> None:
        """Raises the helper's refusal; returns when it passed the push or had no verdict.
        Its processor time is charged to the pacer like work done here."""
        settings = self.state.settings
        verdict = await self.vetting.vet(VetRequest(
            0 if raw is not None else pending.compression_type,
            settings.max_decompressed_bytes, settings.decode_limits,
            raw if raw is not None else pending.payload))
        if verdict is None:
            self.counts.vetted.labels("none").inc()
            return
        self.counts.vetted.labels("passed" if verdict.refusal is None else "refused").inc()
        await self.pacer.rest(verdict.cpu_seconds)
        if verdict.refusal is not None:
            raise verdict.refusal

    async def _accept(self, session: ConnectionState, result: policy.PushResult) -> None:
        inst = result.instance
        if not self._take_note(session, result) or not result.metrics or not (
                self.cfg.prometheus) or inst is None:
            return
        stats = IngestStats()
        try:
            await self.pacer.steps(self.store.ingest_steps(
                inst.instance_id, inst.attrs, result.metrics,
                self.state.settings.delta_temporality, stats))
        finally:
            self.counts.ingested(stats, self.store.max_series)

    def _take_note(self, session: ConnectionState, result: policy.PushResult) -> bool:
        """Archive and listeners; False if the instance is forgotten (nothing to keep)."""
        inst = result.instance
        if inst is None or not self.state.remembers(inst):
            return False  # forgotten while its push was decoded: nothing to keep it under
        if result.raw and self.archive is not None:
            # Turned into JSON on the archive's thread, not here.
            self.archive.telemetry_payload(result.raw, _resource_attributes(inst.attrs,
                                                                            self.hostname))
        for note in self.push_notes:
            note(session, inst, result.raw)
        for listener in self.push_listeners:
            self.in_trio(listener, session, inst, result.raw)
        return True

    def _answer(self, session: ConnectionState, peek: RequestPeek,
                result: policy.PushResult, throttle_ms: int = 0) -> bytes:
        error = result.error_code
        if error == policy.INVALID_RECORD:
            self.hold.refused(session)
        self.counts.push_answered(result)
        if error:
            log.debug("telemetry push refused: %s", result.detail, extra={"fields": {
                "error": policy.ERROR_NAMES[error], **session.log_fields()}})
        if throttle_ms:
            return encode_response_parts(api_keys.PUSH_TELEMETRY, peek.api_version,
                                         peek.correlation_id,
                                         {"throttle_time_ms": throttle_ms, "error_code": error})
        # The answer differs only in its correlation id, which opens every response
        # header: encoded once per version and error, then given the request's own.
        template = self._answers.get((peek.api_version, error))
        if template is None:
            template = self._answers[peek.api_version, error] = encode_response_parts(
                api_keys.PUSH_TELEMETRY, peek.api_version, 0,
                {"throttle_time_ms": 0, "error_code": error})
        return _CORRELATION_ID.pack(peek.correlation_id) + template[4:]


def _resource_attributes(attrs: dict[str, str], hostname: str) -> dict[str, str]:
    """What the proxy knows of the client, as OTLP resource attributes for the archive."""
    return {
        "client.instance.id": attrs.get("client_instance_id", ""),
        "client.id": attrs.get("client_id", ""),
        "client.software.name": attrs.get("client_software_name", ""),
        "client.software.version": attrs.get("client_software_version", ""),
        "client.source.address": attrs.get("client_source_address", ""),
        "kproxy.host": hostname,
        "kproxy.received.time.unix.nano": str(time.time_ns()),
    }
