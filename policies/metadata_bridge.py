"""Serving Metadata v13 over a backend that stops at v12.

A v13 request body is identical to v12, so the request only changes its header's
version. The v13 response is the v12 response plus a top-level ErrorCode, which
is how REBOOTSTRAP_REQUIRED reaches clients (librdkafka reads it only at v13).
"""

from __future__ import annotations

import struct

from kproxy.codecs import api_keys

BRIDGED_VERSION = api_keys.METADATA_TOP_LEVEL_ERROR_SINCE
BACKEND_VERSION = 12
_VERSION_AT = 2  # request header: api_key int16, then api_version int16


def advertised_metadata_max(backend_max: int) -> int:
    """What to offer clients: v13 whenever the backend reaches at least v12."""
    return max(backend_max, BRIDGED_VERSION) if backend_max >= BACKEND_VERSION else backend_max


def needs_bridge(client_version: int, backend_max: int) -> bool:
    return client_version == BRIDGED_VERSION and backend_max < BRIDGED_VERSION


def downgrade_request(frame: bytes) -> bytes:
    """The same request, as v12 (the body does not change)."""
    (key,) = struct.unpack_from(">h", frame, 0)
    assert key == api_keys.METADATA
    return frame[:_VERSION_AT] + struct.pack(">h", BACKEND_VERSION) + frame[_VERSION_AT + 2:]
