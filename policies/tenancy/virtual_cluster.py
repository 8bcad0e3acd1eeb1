"""The virtual-cluster filter: a tenant's client sees a cluster of its own.

It runs nearest the broker in the virtual cluster's chain (the user's filters before it
see the tenant's names), and in front of the built-in filters (whose address rewriting
and Metadata bridge then see the backend's names, as on the main listeners).

- Requests of a translated API (``rules.RULES``) are decoded, every topic name, group id
  and transactional id gets the prefix, and the request is re-encoded at its version.
- Responses get the prefix taken off; entries that are not the tenant's are left out.
  Metadata and DescribeCluster carry the virtual cluster's own cluster id.
- ApiVersions offers only what is translated or passes unchanged (``rules.PASSED``),
  capped at the versions translated. Any other request closes the connection (fail
  closed): a client that skipped ApiVersions, or one that asks for an API the virtual
  cluster cannot translate, never reaches the backend with an untranslated name.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_request_header, read_response_header
from kproxy.codecs.interpreter import decode_from, encode_into
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MAX_VERSION, MessageSpec, Versions
from kproxy.policies.api_versions import offer_only
from kproxy.policies.connection import Close, ConnectionState, Forward, RequestDecision
from kproxy.policies.filters.api import Filter
from kproxy.policies.tenancy.rules import PASSED, RULES, allowed_versions
from kproxy.policies.tenancy.translate import prefix_names, strip_names

# Every API key a request can name is dispatched here, so that none passes untranslated.
# Keys past this are no Kafka API (the highest today is 92); the broker refuses them.
DISPATCHED_KEYS = range(0, 256)
ANY = Versions(0, MAX_VERSION)


def virtual_cluster_id(backend_id: str, name: str) -> str:
    """A stable cluster id of the same form as Kafka's (22 base64url characters), derived
    from the backend's id and the virtual cluster's name."""
    digest = hashlib.sha256(f"{backend_id}/{name}".encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def decode_body(spec: MessageSpec, version: int, frame: memoryview | bytes,
                start: int) -> dict[str, Any]:
    r = Reader(frame, start)
    msg = decode_from(spec, version, r)
    r.expect_end(spec.name)
    return msg


def encode_frame(head: bytes | memoryview, spec: MessageSpec, version: int,
                 msg: dict[str, Any]) -> bytes:
    w = Writer()
    w.raw(bytes(head))
    encode_into(spec, version, msg, w)
    return w.getvalue()


class VirtualClusterFilter(Filter):
    """One virtual cluster's translation; one instance serves all its connections."""

    kind = "virtual-cluster"

    def __init__(self, cluster: str, prefix: str) -> None:
        if not prefix:
            raise ValueError("a virtual cluster needs a non-empty prefix")
        self.cluster = cluster
        self.prefix = prefix
        self.name = f"virtual-cluster:{cluster}"
        requests: dict[int, Versions] = {key: ANY for key in DISPATCHED_KEYS}
        for key, rule in RULES.items():
            requests[key] = rule.versions
        self.requests = requests
        responses: dict[int, Versions] = {
            api_keys.API_VERSIONS: ANY, api_keys.METADATA: RULES[3].versions,
            api_keys.DESCRIBE_CLUSTER: PASSED[api_keys.DESCRIBE_CLUSTER]}
        for key, rule in RULES.items():
            if rule.response is not None:
                responses[key] = rule.versions
        self.responses = responses
        self._ids: dict[str, str] = {}  # backend cluster id -> ours (one or two entries)

    # ------------------------------------------------------------------ requests

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> RequestDecision:
        key, version = peek.api_key, peek.api_version
        rule = RULES.get(key)
        if rule is None:
            allowed = allowed_versions(key)
            if allowed is None or (key != api_keys.API_VERSIONS and version not in allowed):
                api = api_keys.api_name(key)
                return Close(f"{api} v{version} not offered by virtual cluster {self.cluster}",
                             "virtual_cluster_api", f"virtual cluster {self.cluster!r} does "
                             f"not translate {api} v{version} (not in its ApiVersions); "
                             "connection closed", api)
            return None
        if not rule.request_names:
            return None
        r = Reader(body)
        read_request_header(r)
        head = r.pos
        msg = decode_from(rule.request, version, r)
        prefix_names(msg, rule.request_names, self.prefix)
        # Bytes after the body travel as sent: a broker ignores them, and librdkafka 2.x
        # writes three (an empty tag section) after its Metadata v13 requests.
        return Forward(encode_frame(body[:head], rule.request, version, msg)
                       + bytes(body[r.pos:]), version)

    # ------------------------------------------------------------------ responses

    def on_response(self, conn: ConnectionState, api_key: int, api_version: int,
                    body: memoryview) -> bytes | None:
        if api_key == api_keys.API_VERSIONS:
            return self._api_versions(api_version, body)
        spec: MessageSpec | None
        rule = RULES.get(api_key)
        spec = rule.response if rule is not None else DECODED[api_key].response
        if spec is None:
            return None
        r = Reader(body)
        read_response_header(r, api_key, api_version)
        msg = decode_body(spec, api_version, body, r.pos)
        if rule is not None:
            strip_names(msg, rule.response_names, self.prefix)
        if api_key in (api_keys.METADATA, api_keys.DESCRIBE_CLUSTER):
            backend_id = msg.get("cluster_id")
            if backend_id is not None:
                msg["cluster_id"] = self.cluster_id(backend_id)
        return encode_frame(body[:r.pos], spec, api_version, msg)

    def cluster_id(self, backend_id: str) -> str:
        ours = self._ids.get(backend_id)
        if ours is None:
            if len(self._ids) >= 4:  # a backend swap now and then: keep it bounded
                self._ids.clear()
            ours = self._ids[backend_id] = virtual_cluster_id(backend_id, self.cluster)
        return ours

    def _api_versions(self, api_version: int, body: memoryview) -> bytes | None:
        spec = DECODED[api_keys.API_VERSIONS].response
        r = Reader(body)
        read_response_header(r, api_keys.API_VERSIONS, api_version)
        try:
            msg = decode_body(spec, api_version, body, r.pos)
        except CodecError:
            return None  # a v0 error answer (version unknown): it lists ApiVersions only
        offer_only(msg, allowed_versions)
        return encode_frame(body[:r.pos], spec, api_version, msg)

    def describe(self) -> str:
        return (f"virtual cluster {self.cluster!r}: names prefixed with {self.prefix!r}, "
                f"{len(RULES)} APIs translated, the rest hidden")
