"""The options of telemetry termination and of its OTLP export, by the same rules as
``options``: a flag, a key of the config file and an environment variable each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.config.options import (
    Option,
    parse_bool,
    parse_choice,
    parse_compression_list,
    parse_headers,
    parse_non_negative_int,
    parse_positive_int,
    parse_prefix,
    parse_seconds,
    parse_url,
)
from kproxy.policies.telemetry.subscriptions import DEFAULT_MAX_INSTANCE_BYTES


def _telemetry(name: str, parse: Callable[[Any], Any], default: Any, help_: str,
               metavar: str = "", restart: bool = False) -> Option:
    key = name.removeprefix("telemetry_") if name != "telemetry" else "enabled"
    return Option(name, parse, default, help_, metavar, ("telemetry", key), restart)


TELEMETRY_OPTIONS: tuple[Option, ...] = (
    _telemetry("telemetry", parse_bool, True,
               "answer KIP-714 telemetry requests in the proxy and export them on /metrics; "
               "off forwards them to the broker untouched", "on|off", restart=True),
    _telemetry("telemetry_default_interval_ms", parse_positive_int, 60_000,
               "push interval of the implicit all-metrics subscription used when the config "
               "file defines no [[telemetry.subscriptions]]", "MS"),
    _telemetry("telemetry_max_bytes", parse_positive_int, 1024 * 1024,
               "largest compressed push accepted (TelemetryMaxBytes)", "BYTES"),
    _telemetry("telemetry_max_decompressed_bytes", parse_positive_int, 16 * 1024 * 1024,
               "largest push after decompression; a larger one is rejected as INVALID_RECORD",
               "BYTES"),
    _telemetry("telemetry_refused_push_hold_ms", parse_non_negative_int, 1_000,
               "after a push refused as INVALID_RECORD (which ends a client's telemetry), "
               "that connection's telemetry requests are held this long and answered "
               "THROTTLING_QUOTA_EXCEEDED; 0 turns the hold off", "MS"),
    _telemetry("telemetry_delta_temporality", parse_bool, False,
               "ask clients for delta sums (accumulated by the proxy) instead of cumulative",
               "on|off"),
    _telemetry("telemetry_compression_types", parse_compression_list, "zstd,lz4,gzip,snappy",
               "accepted push compression, in the order clients should prefer", "LIST"),
    _telemetry("telemetry_metric_prefix", parse_prefix, "",
               "prefix for exported client metric names", "PREFIX"),
    _telemetry("telemetry_max_series", parse_positive_int, 50_000,
               "cap on exported client series; the excess is dropped and counted", "N"),
    _telemetry("telemetry_max_series_bytes", parse_positive_int, 32 * 1024 * 1024,
               "cap on the memory of exported client series (estimated); new series beyond "
               "it are dropped and counted", "BYTES"),
    _telemetry("telemetry_max_instances", parse_positive_int, 100_000,
               "client instances remembered before the least recently seen is forgotten", "N"),
    _telemetry("telemetry_max_instance_bytes", parse_positive_int, DEFAULT_MAX_INSTANCE_BYTES,
               "cap on the memory of remembered client instances (estimated: about 2 KB for "
               "a librdkafka instance); beyond it the least recently seen is forgotten",
               "BYTES"),
    _telemetry("telemetry_prometheus", parse_bool, True,
               "export the clients' metrics on /metrics; off leaves them to OTLP", "on|off"),
)


def _otlp(name: str, parse: Callable[[Any], Any], default: Any, help_: str,
          metavar: str = "") -> Option:
    key = name.removeprefix("telemetry_otlp_")
    # The exporter is built at start: a reload logs a change and keeps the running one.
    return Option(name, parse, default, help_, metavar, ("telemetry", "otlp", key), True)


# OTLP/HTTP export of accepted pushes ([telemetry.otlp] in the file); off without endpoint.
OTLP_OPTIONS: tuple[Option, ...] = (
    _otlp("telemetry_otlp_endpoint", parse_url, None,
          "forward every accepted push to this OTLP/HTTP metrics endpoint, e.g. "
          "http://otel-collector:4318/v1/metrics (off when unset)", "URL"),
    _otlp("telemetry_otlp_headers", parse_headers, None,
          "extra request headers, NAME=VALUE,... (in the file: a table)", "LIST"),
    _otlp("telemetry_otlp_timeout", parse_seconds, 10.0,
          "longest one export request may take before it counts as failed", "SECONDS"),
    _otlp("telemetry_otlp_compression", parse_choice("gzip", "none"), "gzip",
          "request body compression", "gzip|none"),
    _otlp("telemetry_otlp_tls_ca", str, None,
          "PEM bundle that verifies an https endpoint (default: the system's)", "FILE"),
    _otlp("telemetry_otlp_tls_cert", str, None,
          "PEM client certificate for an https endpoint that requires mTLS", "FILE"),
    _otlp("telemetry_otlp_tls_key", str, None, "PEM private key of --telemetry-otlp-tls-cert",
          "FILE"),
    _otlp("telemetry_otlp_max_batch_bytes", parse_positive_int, 1024 * 1024,
          "pushes are sent together up to this many payload bytes per request", "BYTES"),
    _otlp("telemetry_otlp_max_batch_age", parse_seconds, 2.0,
          "longest a push waits for others to share its request", "SECONDS"),
    _otlp("telemetry_otlp_max_queue_bytes", parse_positive_int, 16 * 1024 * 1024,
          "pushes waiting for the collector; beyond this they are dropped and counted "
          "(a slow or absent collector never slows the relay)", "BYTES"),
    _otlp("telemetry_otlp_max_retry_time", parse_seconds, 60.0,
          "how long a request is retried (429, 5xx, no answer) before its pushes are "
          "dropped", "SECONDS"),
)
# The identity options (kproxy.config.identity) join these in kproxy.config.settings.
