"""OTLP/HTTP export bodies: client pushes in, one ``ExportMetricsServiceRequest`` out.

A KIP-714 push is an OTLP ``MetricsData``; its resource metrics go into the export
request unchanged (metric names, data points, temporality exactly as the client sent
them), except that the proxy's knowledge of the client is written into each resource's
attributes. The proxy's values replace same-named ones from the client: the proxy saw
the socket and the handshake, the client only says so.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.errors import CodecError

CONTENT_TYPE = "application/x-protobuf"


def export_request(pushes: Iterable[tuple[bytes, Mapping[str, str]]]) -> tuple[bytes, int]:
    """Serialized request for (MetricsData bytes, resource attributes) pairs, and how
    many pushes were left out because their payload did not parse (they were decoded once
    already when accepted, so this only happens if that decoder and this one disagree)."""
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    bad = 0
    for payload, resource in pushes:
        data = metrics_pb2.MetricsData()
        try:
            data.ParseFromString(payload)
        except (DecodeError, RuntimeError, ValueError):
            bad += 1
            continue
        for rm in data.resource_metrics:
            attrs = rm.resource.attributes
            keep = [kv for kv in attrs if kv.key not in resource]
            if len(keep) != len(attrs):
                del attrs[:]
                attrs.extend(keep)
            for key, value in resource.items():
                attrs.add(key=key, value=AnyValue(string_value=value))
        request.resource_metrics.extend(data.resource_metrics)
    return request.SerializeToString(), bad


def encode_body(request: bytes, gzip_level: int | None) -> bytes:
    """The HTTP body: the request as is, or gzip-compressed (``Content-Encoding: gzip``)."""
    return request if gzip_level is None else gzip.compress(request, compresslevel=gzip_level)


def rejected_points(response_body: bytes) -> tuple[int, str]:
    """From a 2xx answer: data points the collector says it rejected, and its message."""
    if not response_body:
        return 0, ""
    resp = metrics_service_pb2.ExportMetricsServiceResponse()
    try:
        resp.ParseFromString(response_body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CodecError(f"not an ExportMetricsServiceResponse ({exc})",
                         what="OTLP export response") from None
    partial = resp.partial_success
    return int(partial.rejected_data_points), partial.error_message[:500]
