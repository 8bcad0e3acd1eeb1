"""Rewritten responses, remembered by the bytes they were made from.

Clients poll Metadata, and a steady cluster answers with the same bytes every time,
the correlation id aside. Decoding, rewriting and encoding such a response is the
largest per-request cost of the relay, so the result is kept, keyed by everything
it depends on: the backend's bytes after the correlation id, the versions read and
written, and the port map (named by ``ProxyState.port_map_generation``, which moves
when the map does, so a moved port misses the old entries). The
cache is bounded in entries and in bytes, least recently used out first.

The backend's bytes depend on what clients ask (topic names), so they are not kept
as the key: an entry is found by a 32-byte BLAKE2b digest of them (with the versions
and the port map beside it), and only the rewritten body is stored. An entry costs
its rewritten body plus a fixed overhead, whatever the key's size.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from kproxy.policies.rewrite import Seen

DEFAULT_MAX_ENTRIES = 64
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
ENTRY_OVERHEAD = 256  # bytes of bookkeeping per entry, counted against max_bytes
# A digest of the backend's bytes, the versions read and written, the port map's name.
RewriteKey = tuple[bytes, int, int, Hashable]


@dataclass(frozen=True, slots=True)
class CachedRewrite:
    tail: bytes  # the rewritten response body after its correlation id
    seen: Seen  # what the backend's response said (never mutated once cached)


def rewrite_key(upstream: bytes | memoryview, read_version: int, written_version: int,
                context: Hashable) -> RewriteKey:
    """The key of the rewrite of ``upstream`` (the backend's response body after its
    correlation id) read at one version, written at another, in a ``context`` (the port
    map): a plain tuple, made for every Metadata answer, so one call."""
    return (hashlib.blake2b(upstream, digest_size=32).digest(), read_version,
            written_version, context)


class RewriteCache:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # Larger responses are rewritten each time rather than crowd out the rest.
        self.max_entry_bytes = max_bytes // 4
        self._entries: OrderedDict[RewriteKey, CachedRewrite] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: RewriteKey) -> CachedRewrite | None:
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def put(self, key: RewriteKey, value: CachedRewrite) -> None:
        size = _size(value)
        if size > self.max_entry_bytes or key in self._entries:
            return
        self._entries[key] = value
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= _size(old)


def _size(value: CachedRewrite) -> int:
    return len(value.tail) + ENTRY_OVERHEAD
