"""The request and response handlers: every API the proxy does more than relay.

Each handler owns one API's decisions; ``standard_handlers`` assembles the table a
``ConnectionState`` dispatches on. Adding an API the proxy acts on (group tracking,
share-group rewriting) is adding a handler here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import (
    decode_request,
    decode_response,
    encode_response,
    encode_response_parts,
)
from kproxy.codecs.partial.fetch_walk import FetchWalk, knows
from kproxy.codecs.peek import RequestPeek, peek_response_error
from kproxy.codecs.registry import DECODED
from kproxy.codecs.skipping import produce_names_no_broker
from kproxy.policies.api_versions import bridge_metadata_version, cap_api_versions
from kproxy.policies.connection import (
    Answer,
    AnswerLater,
    Close,
    ConnectionState,
    Forward,
    Handled,
    Handlers,
    RequestDecision,
    RequestHandler,
    ResponseHandler,
    ResponseObserver,
)
from kproxy.policies.fetch_watermarks import Watermark
from kproxy.policies.filters.chain import BuiltinFilter
from kproxy.policies.group_handlers import (
    GROUP_APIS,
    FetchWatermarks,
    GroupRequest,
    GroupResponse,
    GroupWatch,
    MetadataTopicNames,
)
from kproxy.policies.metadata_bridge import (
    BACKEND_VERSION,
    BRIDGED_VERSION,
    downgrade_request,
    needs_bridge,
)
from kproxy.policies.rebootstrap import Action, metadata_action
from kproxy.policies.rewrite import (
    METADATA_OPAQUE,
    NODE_ENDPOINTS_SINCE,
    Rewritten,
    rewrite_metadata,
    rewrite_response_frame,
    rewrite_tags_in_place,
)
from kproxy.policies.rewrite_cache import CachedRewrite, rewrite_key

log = logging.getLogger("kproxy.handlers")
API_VERSIONS_MAX = DECODED[api_keys.API_VERSIONS].versions.hi

# A local handler answers a request the proxy serves itself (telemetry): the answer,
# or an awaitable of it when making it takes work that must not stall the relay.
LocalHandler = Callable[[ConnectionState, RequestPeek, memoryview], bytes | Awaitable[bytes]]


# ----------------------------------------------------------------------------- requests


class ApiVersionsRequest:
    """Notes the client's software; answers versions newer than the proxy can read."""

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        if peek.api_version > API_VERSIONS_MAX:
            # What a broker answers for a version it does not know: error 35 at v0,
            # listing the highest it knows; the client retries with that one.
            reply = {"error_code": ErrorCode.UNSUPPORTED_VERSION,
                     "api_keys": [{"api_key": api_keys.API_VERSIONS, "min_version": 0,
                                   "max_version": API_VERSIONS_MAX}]}
            return Answer(encode_response_parts(api_keys.API_VERSIONS, 0,
                                                peek.correlation_id, reply))
        if peek.api_version >= 3:
            try:
                fields = decode_request(body).body
            except CodecError as exc:  # the broker will answer it with an error
                log.debug("unreadable ApiVersions request: %s", exc)
                return None
            conn.info.software_name = fields.get("client_software_name")
            conn.info.software_version = fields.get("client_software_version")
        return None


class SaslHandshakeRequest:
    """v0 is followed by raw SASL tokens that are not Kafka frames: a proxy reading
    request headers cannot follow them, so such a connection is refused clearly."""

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        if peek.api_version != 0:
            return None
        return Close("SaslHandshake v0", "sasl_v0", "SaslHandshake v0 (raw SASL tokens) is "
                     "not supported; the client must use SaslHandshake v1 and "
                     "SaslAuthenticate (Kafka 1.0+ clients do)")


class MetadataRequest:
    """Sends a v13 request as v12 when the backend stops at v12 (the body is the same)."""

    decides_now = True  # None or Forward, at once (ConnectionState.in_lane)

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        conn.metadata_version = peek.api_version
        backend_max = conn.backend_metadata_max or conn.shared.backend_metadata_max
        if peek.api_version == BRIDGED_VERSION and (
                backend_max is None or needs_bridge(peek.api_version, backend_max)):
            return Forward(downgrade_request(bytes(body)), BACKEND_VERSION)
        return None


class LocalRequest:
    """A request the proxy answers itself; refused before SASL when SASL is required."""

    # Answer, AnswerLater or Close, at once: the express lane answers a small telemetry
    # push in its turn (ConnectionState.in_lane), so the connection stays in the lane.
    decides_now = True

    def __init__(self, answer: LocalHandler) -> None:
        self.answer = answer

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        if conn.shared.require_sasl and not conn.authenticated:
            # A broker with SASL closes a connection whose first requests are not
            # ApiVersions or the SASL exchange; requests answered here never reach it.
            return Close("request before SASL authentication", "unauthenticated",
                         "request before SASL authentication; connection closed",
                         api_keys.api_name(peek.api_key))
        reply = self.answer(conn, peek, body)
        return Answer(reply) if isinstance(reply, bytes) else AnswerLater(reply)


# ----------------------------------------------------------------------------- responses


class ApiVersionsResponse:
    """Caps what the proxy decodes, adds what it serves, bridges Metadata v13."""

    def wants(self, api_version: int) -> bool:
        return True

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        shared = conn.shared
        upstream = bytes(body[4:])
        answers = shared.api_versions_answers
        known = answers.get(api_version, upstream, shared.api_caps, shared.served_apis)
        if known is None:
            try:
                resp = decode_response(body, api_keys.API_VERSIONS, api_version)
            except CodecError:
                # A broker that does not know the requested version answers at v0 with
                # an error; relay that unchanged so the client retries lower.
                if decode_response(body, api_keys.API_VERSIONS, 0).body["error_code"] != 0:
                    return Handled()
                raise
            backend_max = bridge_metadata_version(resp.body)
            cap_api_versions(resp.body, shared.api_caps, add=shared.served_apis)
            known = encode_response(resp)[4:], backend_max
            answers.put(api_version, upstream, *known)
        tail, backend_max = known
        if backend_max is not None:
            conn.backend_metadata_max = shared.backend_metadata_max = backend_max
        return Handled(bytes(body[:4]) + tail)


class MetadataResponse:
    """Addresses rewritten, v13 bridged, REBOOTSTRAP_REQUIRED injected when stale."""

    def wants(self, api_version: int) -> bool:
        return True

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        shared = conn.shared
        # A connection a change ended already counted its outcome: the answer it still
        # awaited is relayed, and it is not told (or closed as legacy) a second time.
        view = shared.view
        action = Action.NONE if conn.ended_by_change else metadata_action(
            conn.saw_topology(), view.epoch, api_version, shared.legacy_clients)
        rewritten = self._rewritten(conn, api_version, upstream_version, body,
                                    inject=action is Action.INJECT)
        change = shared.learn(rewritten.seen, conn.connected_epoch)
        # This response is the client's view from now on (even if it just moved the epoch).
        conn.topology_epoch = view.epoch
        return Handled(bytes(body[:4]) + rewritten.tail, rewritten.seen, change, action,
                       close_after=action is Action.CLOSE)

    @staticmethod
    def _rewritten(conn: ConnectionState, api_version: int, upstream_version: int,
                   body: memoryview, inject: bool) -> CachedRewrite:
        """The rewritten response after its correlation id; from the cache unless injecting."""
        shared = conn.shared
        cache = shared.rewrites
        key = None
        if not inject and len(body) <= cache.max_entry_bytes:
            key = rewrite_key(body[4:], upstream_version, api_version,
                              shared.port_map_generation)
            if (hit := cache.get(key)) is not None:
                return hit
        resp = decode_response(body, api_keys.METADATA, upstream_version, METADATA_OPAQUE)
        seen = rewrite_metadata(resp.body, shared.port_map)
        if api_version >= BRIDGED_VERSION:
            resp.body["error_code"] = (ErrorCode.REBOOTSTRAP_REQUIRED if inject
                                       else resp.body.get("error_code", 0))
        out = encode_response_parts(api_keys.METADATA, api_version,
                                    resp.header.correlation_id, resp.body, resp.header.tagged)
        result = CachedRewrite(out[4:], seen)
        if key is not None:
            cache.put(key, result)
        return result


class AddressResponse:
    """Broker addresses in FindCoordinator, DescribeCluster and KIP-951 NodeEndpoints."""

    def __init__(self, api_key: int, since: int = 0) -> None:
        self.api_key = api_key
        self.since = since  # first version that carries addresses

    def wants(self, api_version: int) -> bool:
        return api_version >= self.since

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        if self.api_key == api_keys.PRODUCE and produce_names_no_broker(body, api_version):
            # The usual Produce answer (no NodeEndpoints), told by a cheap walk before
            # the general rewrite and its result objects.
            return Handled()
        result = rewrite_response_frame(self.api_key, api_version, body,
                                        conn.shared.port_map)
        return address_handled(conn, result)

    def stream(self, conn: ConnectionState, api_version: int, size: int,
               on_marks: Marks | None = None) -> FetchStream | None:
        """A large response of ``size`` body bytes relayed as it arrives (Fetch v16+)."""
        if not FetchStream.streams(self.api_key, api_version):
            return None
        return FetchStream(conn, api_version, size, on_marks)


# ----------------------------------------------------------------------------- streamed
#
# A Fetch v16+ response must be looked at for NodeEndpoints (KIP-951), in its top-level
# tagged section after every record. Received whole, a consumer's responses were most of
# the proxy's CPU per byte consumed. A large one is streamed instead: the shell relays it
# as it arrives (``kproxy.session.streamed``), its skeleton walked as it passes
# (``codecs.partial.fetch_walk``), its records spliced unseen, and only the tail is
# rewritten, into exactly its own size: the response's size went to the client with its
# first bytes (``rewrite_tags_in_place``).

Marks = Callable[[list[Watermark]], None]  # high watermarks, for group lag


class FetchStream:
    """One Fetch response of ``size`` body bytes on its way through."""

    __slots__ = ("_conn", "_on_marks", "walk")

    def __init__(self, conn: ConnectionState, api_version: int, size: int,
                 on_marks: Marks | None) -> None:
        self._conn = conn
        self._on_marks = on_marks  # the high watermarks, for consumer-group lag
        self.walk = FetchWalk(api_version, size)

    @staticmethod
    def streams(api_key: int, api_version: int) -> bool:
        return api_key == api_keys.FETCH and api_version >= 16 and knows(api_version)

    def finish(self, tail: bytes | memoryview) -> tuple[bytes | memoryview, Handled]:
        """The top-level tagged section (all that is left of the body): what to send
        in its place (as many bytes), and what the response told about the backend.
        Raises CodecError when it cannot be read."""
        if self._on_marks is not None:
            self._on_marks([(topic, index, hwm)
                            for topic, index, error, hwm in self.walk.heads if not error])
        if len(tail) == 1 and tail[0] == 0:  # no tags: no NodeEndpoints, the usual case
            return tail, Handled()
        conn = self._conn
        result = rewrite_tags_in_place(api_keys.FETCH, self.walk.version, tail,
                                       conn.shared.port_map)
        return result.frame or tail, address_handled(conn, result)


def address_handled(conn: ConnectionState, result: Rewritten) -> Handled:
    """What a rewrite of broker addresses tells the shell about the backend."""
    seen = result.seen
    if not (seen.nodes or seen.out_of_range or seen.complete):
        # No broker named (a Produce or Fetch response without NodeEndpoints, the
        # usual case): nothing about the backend for the shell to take in.
        return Handled(result.frame)
    return Handled(result.frame, seen, conn.shared.learn(seen, conn.connected_epoch))


class SaslAuthenticateResponse:
    """Notes whether the broker accepted the client's credentials; reads nothing else."""

    def wants(self, api_version: int) -> bool:
        return True

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        conn.authenticated = peek_response_error(
            body, api_keys.SASL_AUTHENTICATE, api_version) == ErrorCode.NONE
        return Handled()


def builtin_filters(local: dict[int, LocalHandler] | None = None,
                    groups: GroupWatch | None = None) -> list[BuiltinFilter]:
    """The handlers as the filter chain's built-in filters: the Kafka protocol (ApiVersions,
    Metadata, addresses, SASL, and group tracking when on), and the local answers."""
    core = standard_handlers(None, groups)
    out = [BuiltinFilter("kafka-protocol", core, "ApiVersions caps, Metadata v13 bridge, "
                         "broker addresses rewritten, SASL noted"
                         + (", consumer groups observed" if groups is not None else ""))]
    if local:
        out.append(BuiltinFilter("local-answers", Handlers(
            {key: LocalRequest(answer) for key, answer in local.items()}),
            "requests the proxy answers itself (KIP-714 telemetry)"))
    return out


def standard_handlers(local: dict[int, LocalHandler] | None = None,
                      groups: GroupWatch | None = None) -> Handlers:
    """The handler table: address rewriting, ApiVersions, Metadata, SASL, local answers,
    and with ``groups`` the group observers (which change nothing)."""
    requests: dict[int, RequestHandler] = {
        api_keys.API_VERSIONS: ApiVersionsRequest(),
        api_keys.SASL_HANDSHAKE: SaslHandshakeRequest(),
        api_keys.METADATA: MetadataRequest(),
    }
    for key, answer in (local or {}).items():
        requests[key] = LocalRequest(answer)
    responses: dict[int, ResponseHandler] = {
        api_keys.API_VERSIONS: ApiVersionsResponse(),
        api_keys.METADATA: MetadataResponse(),
        api_keys.FIND_COORDINATOR: AddressResponse(api_keys.FIND_COORDINATOR),
        api_keys.DESCRIBE_CLUSTER: AddressResponse(api_keys.DESCRIBE_CLUSTER),
        api_keys.SASL_AUTHENTICATE: SaslAuthenticateResponse(),
    }
    for key, since in NODE_ENDPOINTS_SINCE.items():
        responses[key] = AddressResponse(key, since)
    observers: dict[int, ResponseObserver] = {}
    if groups is not None:
        for key in GROUP_APIS:
            requests[key] = GroupRequest(groups)
            responses[key] = GroupResponse(groups, key)
        fetch = FetchWatermarks(groups, responses.get(api_keys.FETCH))
        responses[api_keys.FETCH] = observers[api_keys.FETCH] = fetch
        responses[api_keys.METADATA] = MetadataTopicNames(groups, responses[api_keys.METADATA])
    return Handlers(requests, responses, observers)
