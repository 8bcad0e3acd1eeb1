"""Client quotas per principal (KIP-13, KIP-124), without I/O: how long to throttle.

A broker measures each principal's rate over a window of samples (11 samples of 1 s
by default) and, once the rate is over the quota, tells the client to wait
``(rate - quota) / quota * window`` (bounded by the whole window): it sets
``throttle_time_ms`` in the response and mutes the channel for that long. This module
does the measuring and the arithmetic; the session (``kproxy.session``) mutes.

Three kinds: ``produce`` (request bytes), ``fetch`` (response bytes) and ``request``
(requests per second). Kafka's request quota is a share of broker handler time, which
a proxy does not see (it forwards, the broker works): a request rate is what the
proxy can measure honestly, so that is what it offers.

The state is shared by every connection of a principal in one process, and bounded
(least recently used principals are forgotten). With several worker processes each
enforces ``quota / workers`` (``share``): exact when connections spread evenly,
stricter for a principal whose connections all land on one worker.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader
from kproxy.codecs.schemas.node_endpoints import FETCH_RESPONSE, PRODUCE_RESPONSE
from kproxy.codecs.skipping import skip, skip_tags

PRODUCE = "produce"
FETCH = "fetch"
REQUEST = "request"
KINDS = (PRODUCE, FETCH, REQUEST)
# The configuration key of each kind.
KEYS = {PRODUCE: "produce_bytes_per_second", FETCH: "fetch_bytes_per_second",
        REQUEST: "requests_per_second"}
DEFAULT_PRINCIPAL = "*"
ANONYMOUS = "ANONYMOUS"  # a connection with no login (Kafka's User:ANONYMOUS)
MAX_PRINCIPALS = 10_000


class QuotaError(ValueError):
    """A bad ``[[quotas]]`` entry; ``key`` names the key for the one-line error."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class QuotaEntry:
    """One ``[[quotas]]`` table: the limits of one principal (or of every other: ``*``)."""

    principal: str
    limits: tuple[tuple[str, float], ...]  # (kind, per second), kinds set only

    def limit(self, kind: str) -> float | None:
        for k, value in self.limits:
            if k == kind:
                return value
        return None


def parse_quotas(entries: Any) -> tuple[QuotaEntry, ...]:
    """The ``quotas`` array of tables; ``QuotaError`` names the first bad key."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise QuotaError("quotas", "must be an array of tables ([[quotas]])")
    out: list[QuotaEntry] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"quotas[{i}]"
        principal = entry.get("principal")
        if not isinstance(principal, str) or not principal.strip():
            raise QuotaError(f"{at}.principal", "a principal (\"User:alice\") or \"*\" is "
                             "needed")
        principal = _name(principal)
        if principal in seen:
            raise QuotaError(f"{at}.principal", f"{principal!r} has two entries")
        seen.add(principal)
        limits: list[tuple[str, float]] = []
        for key in entry:
            if key == "principal":
                continue
            kind = next((k for k, name in KEYS.items() if name == key), None)
            if kind is None:
                if key == "request_percentage":
                    raise QuotaError(f"{at}.{key}", "not offered: the proxy cannot see "
                                     "broker handler time; use requests_per_second")
                raise QuotaError(f"{at}.{key}", f"unknown key ({', '.join(KEYS.values())})")
            value = entry[key]
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise QuotaError(f"{at}.{key}", "must be a number above 0")
            limits.append((kind, float(value)))
        if not limits:
            raise QuotaError(at, f"sets no limit ({', '.join(KEYS.values())})")
        out.append(QuotaEntry(principal, tuple(limits)))
    return tuple(out)


def _name(principal: str) -> str:
    """Kafka writes ``User:alice``; the proxy's logins name ``alice``: both match."""
    return principal.strip().removeprefix("User:")


class Rate:
    """Amounts in fixed time samples; the rate over the samples still in the window."""

    __slots__ = ("_sample_s", "_samples", "_starts", "_values")

    def __init__(self, samples: int, sample_s: float) -> None:
        self._samples = samples
        self._sample_s = sample_s
        self._starts: list[float] = []
        self._values: list[float] = []

    def record(self, amount: float, now: float) -> None:
        if not self._starts or now >= self._starts[-1] + self._sample_s:
            self._starts.append(now)
            self._values.append(0.0)
            if len(self._starts) > self._samples:
                del self._starts[0], self._values[0]
        self._values[-1] += amount

    def rate(self, now: float) -> tuple[float, float]:
        """The rate per second and the window it was measured over (seconds)."""
        horizon = now - self._samples * self._sample_s
        while self._starts and self._starts[0] + self._sample_s <= horizon:
            del self._starts[0], self._values[0]
        if not self._starts:
            return 0.0, self._window_floor()
        # As Kafka's Rate: the elapsed time, but never less than samples - 1 full ones,
        # so a new principal's first burst is not measured over a few milliseconds.
        window = max(now - self._starts[0], self._window_floor())
        return sum(self._values) / window, window

    def _window_floor(self) -> float:
        return max(1, self._samples - 1) * self._sample_s


class Quotas:
    """Every principal's rates in this process, against the configured quotas."""

    def __init__(self, entries: Sequence[QuotaEntry] = (), samples: int = 11,
                 sample_s: float = 1.0, share: int = 1,
                 max_principals: int = MAX_PRINCIPALS) -> None:
        self._rates: OrderedDict[tuple[str, str], Rate] = OrderedDict()
        self.max_principals = max_principals
        self.share = max(1, share)
        self._shape = (samples, sample_s)
        self.reconfigure(entries, samples, sample_s)

    def reconfigure(self, entries: Sequence[QuotaEntry], samples: int,
                    sample_s: float) -> None:
        """New quotas (a reload): the rates measured so far are kept unless the window
        changed shape."""
        self._exact = {e.principal: e for e in entries if e.principal != DEFAULT_PRINCIPAL}
        self._default = next((e for e in entries if e.principal == DEFAULT_PRINCIPAL), None)
        # Whether any quota applies: read for every relayed frame, so a plain attribute.
        self.enabled = bool(self._exact) or self._default is not None
        if (samples, sample_s) != self._shape:
            self._rates.clear()
        self._shape = (samples, sample_s)
        self.max_throttle_s = samples * sample_s

    def entry_for(self, principal: str | None) -> QuotaEntry | None:
        """The principal's own entry, else the default one (``*``)."""
        return self._exact.get(_name(principal) if principal else ANONYMOUS, self._default)

    def quota(self, principal: str | None, kind: str) -> float | None:
        """This process's share of the principal's quota of ``kind``, per second."""
        entry = self.entry_for(principal)
        limit = entry.limit(kind) if entry is not None else None
        return None if limit is None else limit / self.share

    def record(self, principal: str | None, kind: str, amount: float, now: float) -> float:
        """Count ``amount`` (bytes, or 1 request) for the principal; the seconds the
        client must now wait (0: within its quota). The amount counts even when the
        client is throttled: a broker records, then throttles."""
        quota = self.quota(principal, kind)
        if quota is None:
            return 0.0
        key = (_name(principal) if principal else ANONYMOUS, kind)
        rate = self._rates.get(key)
        if rate is None:
            samples, sample_s = self._shape
            rate = self._rates[key] = Rate(samples, sample_s)
            while len(self._rates) > self.max_principals * len(KINDS):
                self._rates.popitem(last=False)
        else:
            self._rates.move_to_end(key)
        rate.record(amount, now)
        observed, window = rate.rate(now)
        if observed <= quota:
            return 0.0
        return min((observed - quota) / quota * window, self.max_throttle_s)

    def tracked(self) -> int:
        """Rates held (principal and kind), for tests and the status page."""
        return len(self._rates)


def set_throttle(api_key: int, api_version: int, response: memoryview | bytes,
                 throttle_ms: int) -> bytes | None:
    """``response`` (header included, no size prefix) with its ``throttle_time_ms`` raised
    to ``throttle_ms`` (the broker's own throttle is kept when longer); None when the
    API or version has no such field, or the response cannot be walked."""
    spec = {0: PRODUCE_RESPONSE, 1: FETCH_RESPONSE}.get(api_key)
    if spec is None or api_version < 1 or throttle_ms <= 0:
        return None
    r = Reader(response)
    try:
        r.int32()  # correlation id
        if spec.is_flexible(api_version):
            skip_tags(r)  # response header v1
        if api_key == 1:  # Fetch: the first field
            at = r.pos
        else:  # Produce: the last regular field
            skip(spec, api_version, r, stop_before_tags=True)
            at = r.pos - 4
    except CodecError:
        return None
    if at < 0 or at + 4 > len(response):
        return None
    out = bytearray(response)
    old = int.from_bytes(out[at:at + 4], "big", signed=True)
    out[at:at + 4] = max(old, min(throttle_ms, 2**31 - 1)).to_bytes(4, "big", signed=True)
    return bytes(out)
