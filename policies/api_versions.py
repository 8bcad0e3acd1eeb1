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

from collections import OrderedDict
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


# Distinct ApiVersions answers remembered: one per backend software and version asked,
# so a few; more only while brokers of several versions (a rolling upgrade) answer.
MAX_ANSWERS = 16
# A backend answer longer than this is rewritten every time (a real one is under 1 KB).
MAX_ANSWER_BYTES = 8192


class ApiVersionsAnswers:
    """Rewritten ApiVersions answers, by the backend's bytes they were made from.

    Every new connection asks ApiVersions first, and a backend answers the same bytes
    every time, the correlation id aside: decoding, capping and encoding that answer
    was an eighth of the proxy's CPU for a connection that asks it and closes (1.00
    against 0.87 ms).
    An entry holds the rewritten body after the correlation id and the backend's own
    Metadata maximum; entries made under other caps or served APIs (a reload) are
    dropped, least recently used out first beyond ``MAX_ANSWERS``.
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[int, bytes], tuple[bytes, int | None]] = OrderedDict()
        self._made_under: tuple[object, object] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, api_version: int, upstream: bytes, caps: object, served: object
            ) -> tuple[bytes, int | None] | None:
        """(rewritten body after the correlation id, backend Metadata max), or None."""
        made_under = self._made_under
        if made_under is None or made_under[0] is not caps or made_under[1] is not served:
            self._entries.clear()
            self._made_under = (caps, served)
            return None
        found = self._entries.get((api_version, upstream))
        if found is not None:
            self._entries.move_to_end((api_version, upstream))
        return found

    def put(self, api_version: int, upstream: bytes, tail: bytes,
            backend_max: int | None) -> None:
        if len(upstream) > MAX_ANSWER_BYTES:
            return
        self._entries[api_version, upstream] = (tail, backend_max)
        while len(self._entries) > MAX_ANSWERS:
            self._entries.popitem(last=False)


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
