"""The cache of rewritten responses: keyed by everything the rewrite depends on, bounded."""

from __future__ import annotations

from kproxy.policies.addressing import PortMap
from kproxy.policies.rewrite import Seen
from kproxy.policies.rewrite_cache import (
    ENTRY_OVERHEAD,
    CachedRewrite,
    RewriteCache,
    RewriteKey,
    rewrite_key,
)

PM = PortMap("proxy.local", 9192, 9192, 1, 3)


def key(upstream: bytes, pm: PortMap = PM, read: int = 12, written: int = 13) -> RewriteKey:
    return rewrite_key(upstream, read, written, pm)


def value(tail: bytes) -> CachedRewrite:
    return CachedRewrite(tail, Seen(complete=True, cluster_id="c"))


def test_a_hit_needs_the_same_bytes_versions_and_port_map() -> None:
    cache = RewriteCache()
    cache.put(key(b"answer"), value(b"rewritten"))
    found = cache.get(key(b"answer"))
    assert found is not None and found.tail == b"rewritten"
    assert cache.get(key(b"answer", read=13)) is None
    assert cache.get(key(b"answer", written=12)) is None
    assert cache.get(key(b"answer", pm=PortMap("proxy.local", 9292, 9292, 1, 3))) is None
    assert cache.get(key(b"other")) is None
    assert (cache.hits, cache.misses) == (1, 4)


def test_least_recently_used_entries_leave_first_within_the_entry_bound() -> None:
    cache = RewriteCache(max_entries=2)
    cache.put(key(b"a"), value(b"A"))
    cache.put(key(b"b"), value(b"B"))
    assert cache.get(key(b"a")) is not None  # a is now the most recent
    cache.put(key(b"c"), value(b"C"))
    assert len(cache) == 2
    assert cache.get(key(b"b")) is None
    assert cache.get(key(b"a")) is not None and cache.get(key(b"c")) is not None


def test_bytes_are_bounded_and_huge_responses_are_not_kept() -> None:
    cache = RewriteCache(max_entries=100, max_bytes=4000)
    assert cache.max_entry_bytes == 1000
    cache.put(key(b"x" * 10), value(b"y" * 900))  # 900 + overhead: over the entry bound
    assert len(cache) == 0
    for i in range(10):
        cache.put(key(bytes([i]) * 400), value(b"t" * 400))  # 400 + overhead each
    assert cache.size_bytes <= 4000 and len(cache) == 4000 // (400 + ENTRY_OVERHEAD)
    assert cache.get(key(bytes([9]) * 400)) is not None
    assert cache.get(key(bytes([0]) * 400)) is None


def test_the_backend_bytes_are_not_kept_as_the_key() -> None:
    """Keys depend on what clients ask for; an entry costs its body, not its key."""
    cache = RewriteCache(max_entries=1000, max_bytes=1_000_000)
    for i in range(100):
        cache.put(key(i.to_bytes(4, "big") * 25_000), value(b"t" * 10))  # 100 KB keys
    assert len(cache) == 100
    assert cache.size_bytes == 100 * (10 + ENTRY_OVERHEAD)
    assert cache.get(key((7).to_bytes(4, "big") * 25_000)) is not None
