"""Telemetry subscriptions: what a policy file says, and what one client gets of it.

A subscription names metric prefixes, an interval and attribute regexes to match;
a client instance gets the union of the matching ones' metrics at the smallest
interval, with a subscription id derived from both and its instance id, as a broker
derives it. Parsing fails with ``PolicyError`` naming the entry and field.
"""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kproxy.codecs.crc32c import crc32c
from kproxy.codecs.otlp.decode import DEFAULT_LIMITS, DecodeLimits

MATCH_KEYS = ("client_instance_id", "client_id", "client_software_name",
              "client_software_version", "client_source_address", "client_source_port")
COMPRESSION_NAMES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
ALL_METRICS = "*"
# What a policy file may write for "every metric": "*", or the empty prefix (which the
# proxy once sent on the wire and so accepted). On the wire it is always ["*"], as a
# broker sends it (librdkafka and the Java client treat exactly "*" as all).
ALL_METRICS_SPELLINGS = frozenset({ALL_METRICS, ""})
# What the instance memory may hold in all, estimated (``TelemetryState.instance_bytes``);
# the least recently seen instances go first once it is passed.
DEFAULT_MAX_INSTANCE_BYTES = 16 * 1024 * 1024


class PolicyError(ValueError):
    """A bad telemetry policy; the message names the entry and field."""


@dataclass(frozen=True)
class Subscription:
    name: str
    metrics: tuple[str, ...]
    interval_ms: int = DEFAULT_INTERVAL_MS
    match: tuple[tuple[str, re.Pattern[str]], ...] = ()

    def matches(self, attrs: dict[str, str]) -> bool:
        return all(p.fullmatch(attrs.get(k, "")) for k, p in self.match)


def parse_subscriptions(entries: Iterable[dict[str, Any]]) -> tuple[Subscription, ...]:
    subs = []
    for i, entry in enumerate(entries):
        name = str(entry.get("name") or f"subscription-{i}")
        where = f"telemetry.subscriptions[{i}] ({name})"
        unknown = set(entry) - {"name", "metrics", "interval_ms", "match"}
        if unknown:
            raise PolicyError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        metrics = entry.get("metrics", [])
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise PolicyError(f"{where}: metrics must be a list of prefixes ('*' for all)")
        interval = entry.get("interval_ms", DEFAULT_INTERVAL_MS)
        if not isinstance(interval, int) or not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise PolicyError(f"{where}: interval_ms must be {MIN_INTERVAL_MS}.."
                              f"{MAX_INTERVAL_MS}, got {interval!r}")
        match = entry.get("match", {})
        if not isinstance(match, dict):
            raise PolicyError(f"{where}: match must be a table of attribute = regex")
        compiled = []
        for key, pattern in sorted(match.items()):
            if key not in MATCH_KEYS:
                raise PolicyError(f"{where}: match.{key}: not one of {', '.join(MATCH_KEYS)}")
            try:
                compiled.append((key, re.compile(str(pattern))))
            except re.error as exc:
                raise PolicyError(f"{where}: match.{key}: bad regex ({exc})") from None
        subs.append(Subscription(name, tuple(metrics), interval, tuple(compiled)))
    return tuple(subs)


@dataclass(frozen=True)
class TelemetrySettings:
    subscriptions: tuple[Subscription, ...] = ()
    max_bytes: int = 1024 * 1024  # TelemetryMaxBytes: largest compressed push accepted
    max_decompressed_bytes: int = 16 * 1024 * 1024
    delta_temporality: bool = False
    compression_types: tuple[int, ...] = (4, 3, 1, 2)  # zstd, lz4, gzip, snappy
    max_instances: int = 100_000
    max_instance_bytes: int = DEFAULT_MAX_INSTANCE_BYTES
    decode_limits: DecodeLimits = DEFAULT_LIMITS
    # How long a connection's telemetry requests are held after one of its pushes was
    # refused as INVALID_RECORD (0: not at all).
    refused_push_hold_ms: int = 1000

    def told_to_clients(self) -> tuple[object, ...]:
        """What a GetTelemetrySubscriptions answer says: when it changes, a subscription
        handed out before is stale. The proxy's own bounds are not in it."""
        return (self.subscriptions, self.max_bytes, self.delta_temporality,
                self.compression_types)


class Resolved(NamedTuple):
    """The subscription one client instance gets: what it sends, and how often
    (``ClientInstance`` keeps the three fields, not this object)."""

    requested_metrics: tuple[str, ...]
    interval_ms: int
    subscription_id: int


def resolve(settings: TelemetrySettings, instance_id: uuid.UUID,
            attrs: dict[str, str]) -> Resolved:
    """Union of matching subscriptions' metrics, the smallest interval, a derived id."""
    matching = [s for s in settings.subscriptions if s.matches(attrs)]
    prefixes = sorted({m for s in matching for m in s.metrics})
    # On the wire ["*"] subscribes to everything, as from a broker; an empty list to nothing.
    everything = not ALL_METRICS_SPELLINGS.isdisjoint(prefixes)
    requested: tuple[str, ...] = (ALL_METRICS,) if everything else tuple(prefixes)
    interval = min((s.interval_ms for s in matching), default=DEFAULT_INTERVAL_MS)
    digest = crc32c(("\n".join(requested) + f"\n{interval}").encode())
    instance_hash = crc32c(instance_id.bytes)
    sub_id = struct.unpack(">i", struct.pack(">I", digest ^ instance_hash))[0]
    return Resolved(requested, interval, sub_id)
