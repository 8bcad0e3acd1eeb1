"""Requests the proxy answers itself before anything reaches the broker."""

from __future__ import annotations

from kproxy.codecs import api_keys
from kproxy.codecs.messages import encode_response_parts
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.registry import DECODED

UNSUPPORTED_VERSION = 35
API_VERSIONS_MAX = DECODED[api_keys.API_VERSIONS].versions.hi


def api_versions_too_new(peek: RequestPeek) -> bytes | None:
    """A broker's answer to an ApiVersions version it does not know: error 35 at v0.

    The client then retries with the highest version listed, which the proxy can
    read and cap. Without this, a newer client would get the broker's own answer
    in a version the proxy cannot rewrite.
    """
    if peek.api_key != api_keys.API_VERSIONS or peek.api_version <= API_VERSIONS_MAX:
        return None
    body = {"error_code": UNSUPPORTED_VERSION,
            "api_keys": [{"api_key": api_keys.API_VERSIONS, "min_version": 0,
                          "max_version": API_VERSIONS_MAX}]}
    return encode_response_parts(api_keys.API_VERSIONS, 0, peek.correlation_id, body)
