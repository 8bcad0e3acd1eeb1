"""Whether a telemetry push decodes within its bounds, asked of another process.

A push refused for a bound (a kilobyte of zstd that expands to megabytes of empty
points) costs the decoder its whole bounded walk, about 5 ms of the interpreter, and
that walk wins nothing: the push is answered INVALID_RECORD. The proxy has a helper
process (``kproxy.telemetry.vetting_child``, driven by ``vetting_process``) run
``vet`` on a push before its own
loop decodes it, so a hostile stream costs the relay's loop no decoding at all; a
push that passes is decoded on the loop as before, in steps.

This module holds the check and the helper's wire format, both free of I/O. Both ways
a message is a frame as Kafka's (a 4-byte size, then the body: ``codecs.framing``, whose
``FrameReader`` splits and bounds them at either end): a request's body is the push's
compression, the bounds and the payload; a verdict's is whether it passed, the
processor time the check took (which the pacer charges), and for a refusal its reason
and the bound that was passed.
"""

from __future__ import annotations

import struct
import time
from dataclasses import astuple, dataclass

from kproxy.codecs import compression
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import frame
from kproxy.codecs.otlp.decode import DecodeLimits, MetricsDecoder, OtlpLimitExceeded

# Request body: compression type, bound on decompressed bytes, the six DecodeLimits in
# field order; then the payload.
_REQUEST = struct.Struct(">BQ6I")
# Verdict body: refused (0 or 1), processor seconds, the bound's name length; then the
# bound's name and the reason (UTF-8).
_VERDICT = struct.Struct(">BdH")
# What a bound may be named in a verdict: the label values of
# kproxy_telemetry_pushes_over_limit, so a verdict cannot make up a new one.
LIMIT_NAMES = frozenset({"decompressed_bytes", "points", "metrics", "fields", "attributes",
                         "point_bytes", "buckets"})
MAX_REASON_BYTES = 1024
# The largest request a helper reads: far above any push a proxy accepts for decoding
# (``telemetry_max_bytes``), so only a broken peer meets it.
MAX_REQUEST_BYTES = 64 << 20
MAX_VERDICT_BYTES = _VERDICT.size + 256 + MAX_REASON_BYTES


@dataclass(frozen=True)
class VetRequest:
    compression_type: int
    max_decompressed_bytes: int
    limits: DecodeLimits
    payload: bytes


@dataclass(frozen=True)
class Verdict:
    refusal: Refused | None  # None: the push decodes within its bounds
    cpu_seconds: float  # processor time the check took, in the process that ran it


class Refused(CodecError):
    """A push the helper refused; ``limit_name`` is the bound it passed ("" if malformed)."""

    def __init__(self, reason: str, limit_name: str = "") -> None:
        super().__init__(reason)
        self.limit_name = limit_name


def limit_of(exc: CodecError) -> str:
    """The bound a refused push passed, as the over-limit counter names it; "" if none."""
    if isinstance(exc, Refused):
        return exc.limit_name
    if isinstance(exc, OtlpLimitExceeded):
        return exc.limit
    if isinstance(exc, compression.DecompressionLimitExceeded):
        return "decompressed_bytes"
    return ""


def vet(request: VetRequest) -> Verdict:
    """Decompress and decode the push to its end, keeping nothing: the helper's work."""
    started = time.process_time()
    refusal = None
    try:
        raw = (compression.decompress(request.compression_type, request.payload,
                                      request.max_decompressed_bytes)
               if request.compression_type else request.payload)
        for _ in MetricsDecoder(raw, request.limits, step_work=1 << 30).steps():
            pass
    except CodecError as exc:
        refusal = Refused(str(exc), limit_of(exc))
    return Verdict(refusal, time.process_time() - started)


def encode_request(request: VetRequest) -> bytes:
    head = _REQUEST.pack(request.compression_type, request.max_decompressed_bytes,
                         *astuple(request.limits))
    return frame(head + request.payload)


def decode_request(body: bytes) -> VetRequest:
    if len(body) < _REQUEST.size:
        raise CodecError(f"a vetting request of {len(body)} bytes, shorter than its header",
                         what="vetting request")
    kind, max_bytes, *limits = _REQUEST.unpack_from(body)
    return VetRequest(kind, max_bytes, DecodeLimits(*limits), body[_REQUEST.size:])


def encode_verdict(verdict: Verdict) -> bytes:
    refusal = verdict.refusal
    name = (refusal.limit_name if refusal else "").encode()
    reason = (refusal.reason if refusal else "").encode()[:MAX_REASON_BYTES]
    body = _VERDICT.pack(refusal is not None, verdict.cpu_seconds, len(name)) + name + reason
    return frame(body)


def decode_verdict(body: bytes) -> Verdict:
    if len(body) < _VERDICT.size:
        raise CodecError(f"a verdict of {len(body)} bytes, shorter than its header",
                         what="vetting verdict")
    refused, cpu, name_len = _VERDICT.unpack_from(body)
    end = _VERDICT.size + name_len
    name = body[_VERDICT.size:end].decode(errors="replace")
    if name and name not in LIMIT_NAMES:
        raise CodecError(f"a verdict names an unknown bound {name[:40]!r}",
                         what="vetting verdict")
    reason = body[end:end + MAX_REASON_BYTES].decode(errors="replace")
    return Verdict(Refused(reason, name) if refused else None, max(0.0, cpu))
