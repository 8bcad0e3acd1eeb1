"""The issuer's JWKS for OAUTHBEARER: fetched at start, refreshed, cached, bounded.

One task per process fetches ``jwks_url`` (through ``kproxy.http.client``) and swaps
the parsed keys in whole (``policies.auth.oauth.JwksKeys``); logins read whatever is
current and never wait on the network. A fetch that fails (no answer within the
timeout, an HTTP error, more than ``MAX_JWKS_BYTES``, not a JWKS) keeps the keys it
had and is retried with exponential backoff, 1 s doubling to the refresh interval; a
login that names an unknown ``kid`` asks for an early fetch, at most one per
``MIN_REFETCH_S``. A hanging or hostile endpoint therefore costs one task's time,
never a client connection's.
"""

from __future__ import annotations

import logging
import random

import trio

from kproxy.http.client import Endpoint, HttpClient, HttpError
from kproxy.policies.auth.oauth import JwksKeys, parse_jwks

log = logging.getLogger("kproxy.auth")
MAX_JWKS_BYTES = 256 * 1024
FETCH_TIMEOUT_S = 5.0
MIN_REFETCH_S = 10.0
FIRST_BACKOFF_S = 1.0


class JwksCache:
    def __init__(self, url: str, refresh_s: float) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.current = JwksKeys({})
        self.failures = 0
        self.fetches = 0
        self.last_error: str | None = None
        self._wake = trio.Event()
        self._last_fetch = -MIN_REFETCH_S

    def keys(self) -> JwksKeys:
        return self.current

    def unknown_kid(self) -> None:
        """A login named a key not in the set: fetch again soon (rate limited)."""
        self._wake.set()

    async def run(self) -> None:
        client = HttpClient(Endpoint.parse(self.url), max_response_bytes=MAX_JWKS_BYTES)
        backoff = FIRST_BACKOFF_S
        try:
            while True:
                ok = await self.fetch_once(client)
                wait = self.refresh_s if ok else backoff
                backoff = FIRST_BACKOFF_S if ok else min(backoff * 2, self.refresh_s)
                with trio.move_on_after(wait * random.uniform(0.9, 1.1)):
                    await self._wake.wait()
                    # An early fetch for an unknown kid, no sooner than MIN_REFETCH_S
                    # after the last one: a client cannot make the proxy hammer the issuer.
                    await trio.sleep_until(self._last_fetch + MIN_REFETCH_S)
                self._wake = trio.Event()
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    async def fetch_once(self, client: HttpClient) -> bool:
        self._last_fetch = trio.current_time()
        self.fetches += 1
        try:
            answer = await client.get([("accept", "application/json")], FETCH_TIMEOUT_S)
            if answer.status != 200:
                raise ValueError(f"HTTP {answer.status}")
            if answer.truncated:
                raise ValueError(f"larger than {MAX_JWKS_BYTES} bytes")
            keys = parse_jwks(answer.body)
            if not keys:
                raise ValueError("no RS256 or ES256 signing key with a kid")
        except (HttpError, ValueError) as exc:
            self.failures += 1
            self.last_error = str(exc)
            log.warning("JWKS fetch failed; keeping the keys held", extra={"fields": {
                "url": self.url, "error": str(exc), "keys_held": len(self.current.keys)}})
            return False
        if set(keys) != set(self.current.keys):
            log.info("JWKS keys loaded", extra={"fields": {"url": self.url,
                                                            "kids": ",".join(sorted(keys))}})
        self.current = JwksKeys(keys, fetched=True)
        self.last_error = None
        return True
