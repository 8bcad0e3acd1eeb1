"""KIP-1242 (ApiVersions v5: the client states the cluster id and node id it expects):
kproxy caps ApiVersions at v4 (docs/rebootstrap.md says why). A v5 request is answered
as a broker answers a version it does not know, and a backend's v5 is never advertised."""

from __future__ import annotations

import struct

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.messages import decode_response
from kproxy.codecs.peek import peek_request
from kproxy.policies.addressing import PortMap
from kproxy.policies.api_versions import cap_api_versions, default_caps
from kproxy.policies.connection import Answer, ConnectionState
from kproxy.policies.handlers import standard_handlers
from kproxy.policies.proxy_state import ProxyState


def v5_request(correlation_id: int) -> bytes:
    """A request header v2 for ApiVersions v5 and a body kproxy never reads past."""
    client = b"kip1242"
    header = struct.pack(">hhih", 18, 5, correlation_id, len(client)) + client + b"\0"
    return header + b"\x05java\x045.0\x00" + b"\x01\x02\x03\x00"


def test_a_v5_request_is_answered_locally_with_v4_as_the_highest() -> None:
    handlers = standard_handlers()
    conn = ConnectionState(ProxyState(PortMap("p", 30000, 30000, 0, 10)), handlers,
                           "bootstrap", None, ("127.0.0.1", 40000))
    frame = v5_request(42)
    decision = conn.request(peek_request(memoryview(frame)), memoryview(frame))
    assert isinstance(decision, Answer)
    body = decode_response(memoryview(decision.body),
                           api_keys.API_VERSIONS, 0).body
    assert body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert body["api_keys"] == [{"api_key": 18, "min_version": 0, "max_version": 4}]


def test_a_backend_that_speaks_v5_is_advertised_as_v4() -> None:
    body = {"error_code": 0, "throttle_time_ms": 0,
            "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 5}]}
    cap_api_versions(body, default_caps())
    assert body["api_keys"] == [{"api_key": 18, "min_version": 0, "max_version": 4}]
