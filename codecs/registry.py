"""Which APIs the proxy decodes, and up to which version.

Everything not listed here is relayed as an opaque frame. The version ranges are
what the proxy caps ApiVersions to, so a broker upgrade can never hand a client a
version of a decoded API that this code cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.codecs import api_keys
from kproxy.codecs.schema import MessageSpec, Versions
from kproxy.codecs.schemas import (
    api_versions,
    describe_cluster,
    find_coordinator,
    groups,
    metadata,
    node_endpoints,
    offsets,
    sasl,
    streams_groups,
    telemetry,
)


@dataclass(frozen=True)
class DecodedApi:
    api_key: int
    request: MessageSpec | None
    response: MessageSpec

    @property
    def versions(self) -> Versions:
        return self.response.valid


DECODED: dict[int, DecodedApi] = {
    api.api_key: api
    for api in (
        DecodedApi(api_keys.API_VERSIONS, api_versions.REQUEST, api_versions.RESPONSE),
        DecodedApi(api_keys.METADATA, metadata.REQUEST, metadata.RESPONSE),
        DecodedApi(api_keys.FIND_COORDINATOR, find_coordinator.REQUEST,
                   find_coordinator.RESPONSE),
        DecodedApi(api_keys.DESCRIBE_CLUSTER, describe_cluster.REQUEST,
                   describe_cluster.RESPONSE),
        DecodedApi(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, telemetry.GET_SUBSCRIPTIONS_REQUEST,
                   telemetry.GET_SUBSCRIPTIONS_RESPONSE),
        DecodedApi(api_keys.PUSH_TELEMETRY, telemetry.PUSH_REQUEST, telemetry.PUSH_RESPONSE),
        # Relayed untouched; only the authenticate response's error code is read.
        DecodedApi(api_keys.SASL_HANDSHAKE, sasl.HANDSHAKE_REQUEST, sasl.HANDSHAKE_RESPONSE),
        DecodedApi(api_keys.SASL_AUTHENTICATE, sasl.AUTHENTICATE_REQUEST,
                   sasl.AUTHENTICATE_RESPONSE),
        # Group membership and offsets: relayed byte for byte, decoded to observe groups.
        DecodedApi(api_keys.JOIN_GROUP, groups.JOIN_GROUP_REQUEST, groups.JOIN_GROUP_RESPONSE),
        DecodedApi(api_keys.SYNC_GROUP, groups.SYNC_GROUP_REQUEST, groups.SYNC_GROUP_RESPONSE),
        DecodedApi(api_keys.HEARTBEAT, groups.HEARTBEAT_REQUEST, groups.HEARTBEAT_RESPONSE),
        DecodedApi(api_keys.LEAVE_GROUP, groups.LEAVE_GROUP_REQUEST,
                   groups.LEAVE_GROUP_RESPONSE),
        DecodedApi(api_keys.CONSUMER_GROUP_HEARTBEAT, groups.CONSUMER_GROUP_HEARTBEAT_REQUEST,
                   groups.CONSUMER_GROUP_HEARTBEAT_RESPONSE),
        DecodedApi(api_keys.SHARE_GROUP_HEARTBEAT, groups.SHARE_GROUP_HEARTBEAT_REQUEST,
                   groups.SHARE_GROUP_HEARTBEAT_RESPONSE),
        # Streams groups (KIP-1071): observed like consumer groups, relayed untouched.
        DecodedApi(api_keys.STREAMS_GROUP_HEARTBEAT,
                   streams_groups.STREAMS_GROUP_HEARTBEAT_REQUEST,
                   streams_groups.STREAMS_GROUP_HEARTBEAT_RESPONSE),
        DecodedApi(api_keys.OFFSET_COMMIT, offsets.OFFSET_COMMIT_REQUEST,
                   offsets.OFFSET_COMMIT_RESPONSE),
        DecodedApi(api_keys.OFFSET_FETCH, offsets.OFFSET_FETCH_REQUEST,
                   offsets.OFFSET_FETCH_RESPONSE),
        # Produce and Fetch bodies are only walked for NodeEndpoints, never rebuilt.
        DecodedApi(api_keys.PRODUCE, None, node_endpoints.PRODUCE_RESPONSE),
        DecodedApi(api_keys.FETCH, None, node_endpoints.FETCH_RESPONSE),
        # Share groups (KIP-932): walked the same way, NodeEndpoints a regular field.
        DecodedApi(api_keys.SHARE_FETCH, None, node_endpoints.SHARE_FETCH_RESPONSE),
        DecodedApi(api_keys.SHARE_ACKNOWLEDGE, None, node_endpoints.SHARE_ACKNOWLEDGE_RESPONSE),
    )
}


def spec_for(api_key: int, api_version: int, *, response: bool) -> MessageSpec | None:
    """The schema for one body, or None when the proxy does not decode it."""
    api = DECODED.get(api_key)
    if api is None:
        return None
    spec = api.response if response else api.request
    if spec is None or api_version not in spec.valid:
        return None
    return spec
