"""ApiVersions rewriting: never let a client pick a version the proxy cannot read.

Every API the proxy decodes is capped to the versions its schemas know; an API
whose whole range is above that is removed. That includes every response that
carries broker addresses (share groups' NodeEndpoints too, since they are rewritten),
so a client never learns a backend address through a version the proxy cannot read.
An API listed in ``HIDDEN_APIS`` would be left out entirely; none is today.

The response is written in Kafka's canonical form (tagged fields at their default
left out): tansu writes all four ApiVersions tags even at their defaults, and
librdkafka 2.0.2 (Debian 12's kcat) fails to read such a response.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.canonical import omit_default_tags
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import Versions
from kproxy.codecs.schemas import api_versions
from kproxy.policies.metadata_bridge import advertised_metadata_max

# APIs that name no topic, group or transactional id (the handshake, SASL, the
# telemetry the proxy answers itself, DescribeCluster): what a filter that must see
# every name (a virtual cluster, the ACLs) offers unchecked, at these versions.
NAMELESS: dict[int, Versions] = {
    api_keys.API_VERSIONS: Versions(0, 4),
    api_keys.SASL_HANDSHAKE: Versions(0, 1),
    api_keys.SASL_AUTHENTICATE: Versions(0, 2),
    api_keys.DESCRIBE_CLUSTER: Versions(0, 2),
    api_keys.GET_TELEMETRY_SUBSCRIPTIONS: Versions(0, 0),
    api_keys.PUSH_TELEMETRY: Versions(0, 0),
}

# APIs kept from clients altogether. ShareFetch and ShareAcknowledge were, until their
# NodeEndpoints were rewritten; they are now capped like every decoded API.
HIDDEN_APIS: frozenset[int] = frozenset()


def default_caps() -> dict[int, int]:
    return {key: api.versions.hi for key, api in DECODED.items()}


def cap_api_versions(body: dict[str, Any], caps: Mapping[int, int],
                     hidden: frozenset[int] = HIDDEN_APIS,
                     add: Mapping[int, tuple[int, int]] | None = None) -> None:
    """Cap, hide and add entries of a decoded ApiVersions response in place.

    ``add`` lists APIs the proxy serves itself (key -> (min, max)); they replace
    whatever the broker said about them. Tagged fields at their default are dropped,
    so the response goes out in canonical form.
    """
    omit_default_tags(api_versions.RESPONSE, body)
    add = add or {}
    kept = []
    for entry in body["api_keys"]:
        key = entry["api_key"]
        if key in hidden or key in add:
            continue
        cap = caps.get(key)
        if cap is not None:
            if entry["min_version"] > cap:
                continue
            entry = {**entry, "max_version": min(entry["max_version"], cap)}
        kept.append(entry)
    for key, (lo, hi) in sorted(add.items()):
        kept.append({"api_key": key, "min_version": lo, "max_version": hi})
    kept.sort(key=lambda e: e["api_key"])
    body["api_keys"] = kept


def offer_only(body: dict[str, Any], offered: Callable[[int], Versions | None]) -> None:
    """Keep, in place, only the entries of a decoded ApiVersions response that a filter
    which must see every request can handle (``offered``: an API's versions, None for
    one it hides), capped at them: what it cannot read, no client is offered."""
    kept = []
    for entry in body["api_keys"]:
        allowed = offered(entry["api_key"])
        if allowed is None or entry["min_version"] > allowed.hi:
            continue
        kept.append({**entry, "max_version": min(entry["max_version"], allowed.hi)})
    body["api_keys"] = kept


def bridge_metadata_version(body: dict[str, Any]) -> int | None:
    """Offer Metadata v13 over a v12 backend; returns the backend's own Metadata max."""
    for entry in body["api_keys"]:
        if entry["api_key"] == api_keys.METADATA:
            backend_max = int(entry["max_version"])
            entry["max_version"] = advertised_metadata_max(backend_max)
            return backend_max
    return None
