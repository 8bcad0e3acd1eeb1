"""Forwards every accepted telemetry push to an OpenTelemetry collector over OTLP/HTTP.

The push handler only queues (``push_accepted``: no I/O, no encoding, O(1)); one task
sends batches. When the collector is slow, down or absent the queue fills to its
bound and further pushes are dropped and counted, so the relay and the push answer
never wait for it. Decisions (batching, bounds, retries) are
``kproxy.policies.otlp_batch``'s; the bytes are ``kproxy.codecs.otlp.export``'s.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from kproxy import __version__
from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp.export import CONTENT_TYPE, encode_body, export_request, rejected_points
from kproxy.config.settings import Config, ConfigError
from kproxy.http.client import Endpoint, HttpClient, HttpError
from kproxy.logs import RateLimitedLog
from kproxy.policies import otlp_batch
from kproxy.policies.connection import ConnectionState
from kproxy.policies.otlp_batch import Batch, BatchSettings, ExportQueue, Push, RetryPolicy
from kproxy.policies.telemetry.state import ClientInstance

if TYPE_CHECKING:
    from kproxy.runtime.server import Proxy

log = logging.getLogger("kproxy.otlp")
MAX_ATTRIBUTE_CHARS = 1024  # client-supplied strings (client id, software) are cut here
GZIP_LEVEL = 5
FLUSH_AT_EXIT_SECONDS = 2.0  # at shutdown, how long queued pushes may still take


@dataclass(frozen=True)
class OtlpSettings:
    endpoint: Endpoint
    headers: tuple[tuple[str, str], ...]
    timeout: float
    gzip: bool
    tls: ssl.SSLContext | None
    batch: BatchSettings

    @classmethod
    def from_config(cls, cfg: Config) -> OtlpSettings | None:
        if not cfg.telemetry_otlp_endpoint:
            return None
        try:
            endpoint = Endpoint.parse(cfg.telemetry_otlp_endpoint)
        except ValueError as exc:
            raise ConfigError(f"telemetry.otlp.endpoint: {exc}") from None
        tls = None
        if endpoint.scheme == "https":
            try:
                tls = ssl.create_default_context(cafile=cfg.telemetry_otlp_tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"telemetry.otlp.tls_ca: cannot load "
                                  f"{cfg.telemetry_otlp_tls_ca}: {exc}") from None
            if cfg.telemetry_otlp_tls_cert and cfg.telemetry_otlp_tls_key:
                try:
                    tls.load_cert_chain(cfg.telemetry_otlp_tls_cert, cfg.telemetry_otlp_tls_key)
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigError(f"telemetry.otlp.tls_cert: cannot load "
                                      f"{cfg.telemetry_otlp_tls_cert}: {exc}") from None
        elif cfg.telemetry_otlp_tls_ca or cfg.telemetry_otlp_tls_cert:
            raise ConfigError("telemetry.otlp.tls_*: the endpoint is not https://")
        return cls(endpoint, tuple(cfg.telemetry_otlp_headers or ()), cfg.telemetry_otlp_timeout,
                   cfg.telemetry_otlp_compression == "gzip", tls, BatchSettings(
                       max_batch_bytes=cfg.telemetry_otlp_max_batch_bytes,
                       max_batch_age=cfg.telemetry_otlp_max_batch_age,
                       max_queue_bytes=cfg.telemetry_otlp_max_queue_bytes,
                       max_retry_time=cfg.telemetry_otlp_max_retry_time))


class OtlpExporter:
    def __init__(self, settings: OtlpSettings, registry: CollectorRegistry,
                 identity: dict[str, str]) -> None:
        self.settings = settings
        self.identity = identity  # the proxy's own resource attributes
        self.queue = ExportQueue(settings.batch)
        self.retry = RetryPolicy(settings.batch)
        self.client = HttpClient(settings.endpoint, settings.tls)
        self.headers = [("content-type", CONTENT_TYPE), *settings.headers]
        if settings.gzip:
            self.headers.append(("content-encoding", "gzip"))
        self.ratelog = RateLimitedLog(60.0)
        self._wake = trio.Event()
        self.in_flight: Batch | None = None
        self.outcomes = Counter(
            "kproxy_telemetry_export", "Accepted telemetry pushes forwarded over OTLP, by "
            "outcome: exported, dropped_queue_full (the collector was behind), "
            "dropped_failed (no success within max_retry_time), rejected (4xx)",
            ["outcome"], registry=registry)
        for outcome in otlp_batch.OUTCOMES:
            self.outcomes.labels(outcome)
        self.attempts = Counter(
            "kproxy_telemetry_export_requests", "OTLP export requests sent, by result: the "
            "HTTP status class, 429, or no_answer", ["result"], registry=registry)
        self.points_rejected = Counter(
            "kproxy_telemetry_export_points_rejected", "Data points the collector reported "
            "as rejected in a partial success", registry=registry)
        Gauge("kproxy_telemetry_export_queue_bytes", "Push bytes waiting for the collector",
              registry=registry).set_function(lambda: float(self.queue.bytes))

    # ---------------------------------------------------------------- the push path

    def push_accepted(self, conn: ConnectionState, instance: ClientInstance,
                      payload: bytes) -> None:
        """Queue one accepted push; never waits. Called from the PushTelemetry handler."""
        if not payload:
            return
        info = conn.info
        resource = {
            "client.instance.id": instance.attrs["client_instance_id"],
            "client.id": _cut(info.client_id or instance.attrs.get("client_id", "")),
            "client.software.name": _cut(info.software_name
                                         or instance.attrs.get("client_software_name", "")),
            "client.software.version": _cut(
                info.software_version or instance.attrs.get("client_software_version", "")),
            "client.source.address": info.source_address,
            "client.source.port": str(info.source_port),
            **self.identity,
        }
        cluster_id = conn.shared.view.cluster_id
        if cluster_id:
            resource["kafka.cluster.id"] = _cut(cluster_id)
        if self.queue.offer(Push(payload, resource, trio.current_time())):
            self._wake.set()
        else:
            self.outcomes.labels(otlp_batch.QUEUE_FULL).inc()
            self.ratelog(logging.WARNING, "otlp-queue-full", "OTLP export queue full; "
                         "telemetry push dropped (the collector is slow or unreachable)",
                         queued_bytes=self.queue.bytes,
                         max_queue_bytes=self.settings.batch.max_queue_bytes)

    # ---------------------------------------------------------------- the sender

    async def run(self) -> None:
        """Send batches as they come due; runs until cancelled."""
        try:
            while True:
                batch = self.queue.take(trio.current_time())
                if batch is None:
                    due = self.queue.due_at()
                    self._wake = trio.Event()
                    with trio.move_on_at(math.inf if due is None else due):
                        await self._wake.wait()
                    continue
                await self._export(batch)
        finally:
            with trio.CancelScope(shield=True):
                await self._flush_at_exit()
                await self.client.aclose()

    async def _flush_at_exit(self) -> None:
        """One last bounded try for what is queued; whatever is left is counted dropped."""
        left = self.queue.take(trio.current_time(), force=True)
        if left is not None and self.in_flight is None:
            with trio.move_on_after(min(self.settings.timeout, FLUSH_AT_EXIT_SECONDS)):
                try:
                    body, bad = await trio.to_thread.run_sync(self._encode, left)
                    answer = await self.client.post(body, self.headers, self.settings.timeout)
                except HttpError:
                    pass
                else:
                    if 200 <= answer.status <= 299:
                        self.outcomes.labels(otlp_batch.EXPORTED).inc(len(left.pushes) - bad)
                        left = None
        dropped = len(self.queue) + (len(left.pushes) if left is not None else 0) + (
            len(self.in_flight.pushes) if self.in_flight is not None else 0)
        if dropped:
            self.outcomes.labels(otlp_batch.FAILED).inc(dropped)

    async def _export(self, batch: Batch) -> None:
        # Left set if cancelled (shutdown), so that its pushes are counted as dropped.
        self.in_flight = batch
        body, bad = await trio.to_thread.run_sync(self._encode, batch)
        if bad:
            self.outcomes.labels(otlp_batch.REJECTED).inc(bad)
        while True:
            status, retry_after, answer_body = None, None, b""
            try:
                answer = await self.client.post(body, self.headers, self.settings.timeout)
                status, answer_body = answer.status, answer.body
                retry_after = answer.headers.get("retry-after")
                self.attempts.labels(_status_class(status)).inc()
            except HttpError as exc:
                self.attempts.labels("no_answer").inc()
                detail = str(exc)
            else:
                detail = f"HTTP {status}"
            decision = self.retry.after_attempt(batch, status, retry_after,
                                                trio.current_time(), time.time())
            if decision.outcome is not None:
                self.in_flight = None
                self._finish(batch, decision.outcome, detail, answer_body, bad)
                return
            self.ratelog(logging.INFO, "otlp-retry", "OTLP export failed; retrying",
                         endpoint=self._where(), error=detail, attempt=batch.attempts)
            assert decision.retry_at is not None
            await trio.sleep_until(decision.retry_at)

    def _encode(self, batch: Batch) -> tuple[bytes, int]:
        """Runs in a worker thread: parsing, enriching and gzip stay off the relay's loop."""
        request, bad = export_request((p.payload, p.resource) for p in batch.pushes)
        return encode_body(request, GZIP_LEVEL if self.settings.gzip else None), bad

    def _finish(self, batch: Batch, outcome: str, detail: str, answer_body: bytes,
                bad: int) -> None:
        self.outcomes.labels(outcome).inc(len(batch.pushes) - bad)
        if outcome == otlp_batch.EXPORTED:
            try:
                rejected, message = rejected_points(answer_body)
            except CodecError:
                rejected, message = 0, ""  # an answer we cannot read is still a 2xx
            if rejected:
                self.points_rejected.inc(rejected)
                self.ratelog(logging.WARNING, "otlp-partial", "collector rejected some "
                             "data points", rejected=rejected, message=message)
            return
        self.ratelog(logging.WARNING, f"otlp-{outcome}", "OTLP export gave up; telemetry "
                     "pushes dropped", endpoint=self._where(), outcome=outcome, error=detail,
                     pushes=len(batch.pushes), attempts=batch.attempts)

    def _where(self) -> str:
        ep = self.settings.endpoint
        return f"{ep.scheme}://{ep.host_header}{ep.target}"


def _status_class(status: int) -> str:
    return "429" if status == 429 else f"{status // 100}xx"


def _cut(text: str) -> str:
    return text[:MAX_ATTRIBUTE_CHARS]


def install(proxy: Proxy) -> OtlpExporter | None:
    """The exporter for ``proxy``'s configuration, hooked to its push handler; None when off.

    Raises ConfigError for settings that cannot work (bad URL, unreadable certificate).
    """
    settings = OtlpSettings.from_config(proxy.config)
    if settings is None or proxy.telemetry is None:
        if settings is not None:
            log.warning("telemetry.otlp.endpoint is set but telemetry is off; nothing to export")
        return None
    identity = {"kproxy.host": proxy.events.hostname, "kproxy.version": __version__}
    exporter = OtlpExporter(settings, proxy.metrics.registry, identity)
    proxy.telemetry.push_listeners.append(exporter.push_accepted)
    return exporter
