"""Rewritten responses, remembered by the bytes they were made from.

Clients poll Metadata, and a steady cluster answers with the same bytes every time,
the correlation id aside. Decoding, rewriting and encoding such a response is the
largest per-request cost of the relay, so the result is kept, keyed by everything
it depends on: the backend's bytes after the correlation id, the versions read and
written, and the port map (a reload that moves ports misses the old entries). The
cache is bounded in entries and in bytes, least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from kproxy.policies.rewrite import Seen

DEFAULT_MAX_ENTRIES = 64
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CachedRewrite:
    tail: bytes  # the rewritten response body after its correlation id
    seen: Seen  # what the backend's response said (never mutated once cached)


@dataclass(frozen=True, slots=True)
class RewriteKey:
    upstream: bytes  # the backend's response body after its correlation id
    read_version: int
    written_version: int
    context: Hashable  # whatever else the rewrite depends on (the port map)


class RewriteCache:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
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

    @property
    def max_entry_bytes(self) -> int:
        """Larger responses are rewritten each time rather than crowd out the rest."""
        return self.max_bytes // 4

    def put(self, key: RewriteKey, value: CachedRewrite) -> None:
        size = _size(key, value)
        if size > self.max_entry_bytes or key in self._entries:
            return
        self._entries[key] = value
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._bytes -= _size(old_key, old)


def _size(key: RewriteKey, value: CachedRewrite) -> int:
    return len(key.upstream) + len(value.tail)
