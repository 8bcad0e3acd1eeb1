"""Rewriting every broker address a backend response carries into a proxy address.

Pure functions over decoded bodies (and, for Produce/Fetch, over the raw frame):
they change hosts and ports in place and report what they saw, so the proxy shell
can learn backend addresses and open listeners before the client sees the ports.
A node outside the configured id range is left out (or its coordinator marked not
available) rather than handed out unreachable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.canonical import omit_default_tags
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.interpreter import (
    UNKNOWN_TAGS,
    decode_top_level_tags,
    encode_top_level_tags,
    read_top_level_tags,
)
from kproxy.codecs.messages import Response, decode_response, encode_response
from kproxy.codecs.partial.tail import encode_tail, read_tail
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schemas import metadata
from kproxy.policies.addressing import BrokerAddress, PortMap

COORDINATOR_NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE

Body = dict[str, Any]


@dataclass
class Seen:
    """What a response told us about the backend."""

    nodes: dict[int, BrokerAddress] = field(default_factory=dict)
    out_of_range: set[int] = field(default_factory=set)
    # True when the response lists every live broker (Metadata does), so nodes
    # missing from it have left the cluster.
    complete: bool = False
    cluster_id: str | None = None


def _map(node_id: int, host: str, port: int, rack: str | None, pm: PortMap,
         seen: Seen) -> tuple[str, int] | None:
    """Record a backend node and return its proxy address, or None when out of range."""
    seen.nodes[node_id] = BrokerAddress(host, port, rack)
    address = pm.advertised(node_id)
    if address is None:
        seen.out_of_range.add(node_id)
    return address


def rewrite_broker_list(brokers: list[Body], pm: PortMap, seen: Seen,
                        id_key: str = "node_id") -> list[Body]:
    kept = []
    for b in brokers:
        address = _map(b[id_key], b["host"], b["port"], b.get("rack"), pm, seen)
        if address is not None:
            kept.append({**b, "host": address[0], "port": address[1]})
    return kept


# The part of a Metadata response no rewrite reads: the topics, by far its largest
# part, are skipped rather than decoded and copied back as bytes. Their encoding is
# the same in v12 and v13, so this also holds across the v12->v13 bridge.
METADATA_OPAQUE = frozenset({"topics"})


def rewrite_metadata(body: Body, pm: PortMap) -> Seen:
    omit_default_tags(metadata.RESPONSE, body)  # re-encoded anyway: canonical form
    seen = Seen(complete=True, cluster_id=body.get("cluster_id"))
    body["brokers"] = rewrite_broker_list(body["brokers"], pm, seen)
    return seen


def rewrite_describe_cluster(body: Body, pm: PortMap) -> Seen:
    seen = Seen(cluster_id=body.get("cluster_id"))
    body["brokers"] = rewrite_broker_list(body["brokers"], pm, seen, id_key="broker_id")
    return seen


def _rewrite_coordinator(c: Body, pm: PortMap, seen: Seen) -> None:
    if c["error_code"] != 0 or c["node_id"] < 0:
        return
    address = _map(c["node_id"], c["host"], c["port"], None, pm, seen)
    if address is None:
        # Unreachable through this proxy: the client retries FindCoordinator later.
        c.update(error_code=COORDINATOR_NOT_AVAILABLE, node_id=-1, host="", port=-1)
        if "error_message" in c:
            c["error_message"] = "coordinator is outside the proxy's node id range"
    else:
        c.update(host=address[0], port=address[1])


def rewrite_find_coordinator(body: Body, api_version: int, pm: PortMap) -> Seen:
    seen = Seen()
    if api_version >= 4:
        for c in body["coordinators"]:
            _rewrite_coordinator(c, pm, seen)
    else:
        _rewrite_coordinator(body, pm, seen)
    return seen


# ----------------------------------------------------------------------------- frames

# Metadata is rewritten by its own handler (cache, v13 bridge, rebootstrap injection).
_DECODED_REWRITES: dict[int, Callable[[Body, int, PortMap], Seen]] = {
    api_keys.DESCRIBE_CLUSTER: lambda body, _v, pm: rewrite_describe_cluster(body, pm),
    api_keys.FIND_COORDINATOR: rewrite_find_coordinator,
}

# First version of responses that may carry NodeEndpoints (KIP-951, KIP-932).
NODE_ENDPOINTS_SINCE: dict[int, int] = {api_keys.PRODUCE: 10, api_keys.FETCH: 16,
                                        api_keys.SHARE_FETCH: 0, api_keys.SHARE_ACKNOWLEDGE: 0}
# Where NodeEndpoints is a regular field (the last one) rather than a top-level tag.
_REGULAR_ENDPOINTS = frozenset({api_keys.SHARE_FETCH, api_keys.SHARE_ACKNOWLEDGE})


@dataclass
class Rewritten:
    frame: bytes | None  # None: the original frame goes out unchanged
    seen: Seen
    response: Response | None = None  # the decoded response, when it was decoded


def rewrite_response_frame(api_key: int, api_version: int, frame: bytes | memoryview,
                           pm: PortMap) -> Rewritten:
    """Rewrite one response frame body; raises CodecError when it cannot be read."""
    rewrite = _DECODED_REWRITES.get(api_key)
    if rewrite is not None:
        resp = decode_response(frame, api_key, api_version)
        # Re-encoded anyway, so written in Kafka's canonical form (see codecs.canonical).
        omit_default_tags(DECODED[api_key].response, resp.body)
        seen = rewrite(resp.body, api_version, pm)
        return Rewritten(encode_response(resp), seen, resp)
    return _rewrite_node_endpoints(api_key, api_version, frame, pm)


def _rewrite_node_endpoints(api_key: int, api_version: int, frame: bytes | memoryview,
                            pm: PortMap) -> Rewritten:
    """Walk a response to its NodeEndpoints; records are skipped, not copied.

    Produce/Fetch keep them in the top-level tag section, ShareFetch/ShareAcknowledge
    as the last regular field: either way everything before them is kept as bytes
    and only they (and what follows them) are re-encoded.
    """
    spec = DECODED[api_key].response
    r = Reader(frame)
    read_response_header(r, api_key, api_version)
    if api_key in _REGULAR_ENDPOINTS:
        start, tail = read_tail(spec, api_version, r, "node_endpoints")
    else:
        start, tail = read_top_level_tags(spec, api_version, r)
    endpoints = tail.get("node_endpoints")
    seen = Seen()
    if not endpoints:
        return Rewritten(None, seen)
    tail["node_endpoints"] = rewrite_broker_list(endpoints, pm, seen)
    if api_key in _REGULAR_ENDPOINTS:
        encoded = encode_tail(spec, api_version, "node_endpoints", tail)
    else:
        encoded = encode_top_level_tags(spec, api_version, tail)
    return Rewritten(bytes(memoryview(frame)[:start]) + encoded, seen)


# The unknown tag that pads a section rewritten in place to its original size: no Kafka
# message defines it (their tags count up from 0), and clients skip tags they do not know.
PAD_TAG = 0x3FFF


def rewrite_tags_in_place(api_key: int, api_version: int, section: bytes | memoryview,
                          pm: PortMap) -> Rewritten:
    """Rewrite the top-level tagged section of a response whose size has already gone
    to the client (its records were relayed as they came): the result has exactly
    ``len(section)`` bytes. NodeEndpoints that no longer fit are left out (the section
    padded instead): the client then finds the new leader with a Metadata request, as
    it did before KIP-951. Raises CodecError on a section it cannot read."""
    spec = DECODED[api_key].response
    tags = decode_top_level_tags(spec, api_version, Reader(section))
    endpoints = tags.get("node_endpoints")
    seen = Seen()
    if not endpoints:
        return Rewritten(None, seen)
    tags["node_endpoints"] = rewrite_broker_list(endpoints, pm, seen)
    fitted = _fit(api_key, api_version, tags, len(section))
    if fitted is None:
        del tags["node_endpoints"]
        fitted = _fit(api_key, api_version, tags, len(section))
    if fitted is None:
        raise CodecError(f"a tagged section of {len(section)} bytes cannot be rewritten "
                         "in place", what=spec.name)
    return Rewritten(fitted, seen)


def _fit(api_key: int, api_version: int, tags: Body, size: int) -> bytes | None:
    """``tags`` encoded in exactly ``size`` bytes (padded with ``PAD_TAG``), or None."""
    spec = DECODED[api_key].response
    encoded = encode_top_level_tags(spec, api_version, tags)
    if len(encoded) == size:
        return encoded
    unknown: dict[int, bytes] = dict(tags.get(UNKNOWN_TAGS) or {})
    pad = max([PAD_TAG, *(tag + 1 for tag in unknown)])
    # One pad cannot make every size: its length field takes a byte more once it holds
    # 128 bytes (and 16,384), so one total is skipped there. A second, empty pad moves
    # the total the first must make off that skipped size.
    for empty in ({}, {pad + 1: b""}):
        fill = size - len(encoded)
        for _ in range(4):  # the pads' own length fields settle within a few tries
            if fill < 0:
                break
            padded = {**unknown, pad: bytes(fill), **empty}
            out = encode_top_level_tags(spec, api_version, {**tags, UNKNOWN_TAGS: padded})
            if len(out) == size:
                return out
            fill -= len(out) - size
    return None
