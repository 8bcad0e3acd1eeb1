"""Bounds on what a client chooses: how long a value may be once the proxy keeps it.

A client picks its client id, software name and version, metric names and
attribute values, and can make each of them as long as a frame allows. Wherever
such a value becomes a label, a key or a stored field it goes through ``bounded``
first, so that what the proxy retains per client is small and fixed whatever the
client sends. Long values keep a readable prefix and end in a short digest of the
whole value, so two long values that differ only at the end stay distinct.

The counts (how many clients, series, instances, log keys) are bounded where the
state lives; the constants here are the per-value bounds they multiply with.
"""

from __future__ import annotations

import hashlib

# A label value or a stored attribute (client id, software name/version, data-point
# attribute values): at most this many characters.
MAX_LABEL_CHARS = 256
# A key into per-client memory (rebootstrap's (address, client id)): shorter still,
# since it exists only to tell clients apart.
MAX_KEY_CHARS = 64
# A metric name or label name taken from a push.
MAX_NAME_CHARS = 200
# A metric's description and unit (the HELP and UNIT text of its family).
MAX_HELP_CHARS = 512
MAX_UNIT_CHARS = 64
# A field of a log line or an archive record that came from a client.
MAX_FIELD_CHARS = 256

_DIGEST_CHARS = 16  # hex characters of the digest that ends a shortened value


def bounded(value: str, limit: int = MAX_LABEL_CHARS) -> str:
    """``value`` itself if short enough, else a prefix, ``~`` and a digest of the whole.

    The result has at most ``limit`` characters (``limit`` >= 24). The digest makes
    the shortening injective in practice: distinct long values stay distinct keys.
    """
    if len(value) <= limit:
        return value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"),
                             digest_size=_DIGEST_CHARS // 2).hexdigest()
    return value[: limit - _DIGEST_CHARS - 1] + "~" + digest


def bounded_opt(value: str | None, limit: int = MAX_LABEL_CHARS) -> str | None:
    return None if value is None else bounded(value, limit)


def clipped(value: str, limit: int) -> str:
    """A prefix of ``value`` for text meant for people (help, units): no digest needed."""
    return value if len(value) <= limit else value[: limit - 1] + "…"
