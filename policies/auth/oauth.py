"""OAUTHBEARER (RFC 7628, KIP-255) at the proxy: a JWT checked with PyJWT, no I/O.

The client's message is ``n,[a=authzid],^Aauth=Bearer TOKEN^A[key=value^A]*^A``. The
token must be a JWS signed RS256 or ES256 by a key of the issuer's JWKS (looked up by
its ``kid`` in what the shell fetched, ``JwksKeys``), with ``iss`` and ``aud`` as
configured, and ``exp`` and ``nbf`` holding at the clock passed in. The principal is
``sub`` or a configured claim; the session lasts until ``exp`` (KIP-368: the client
must log in again before then on the same connection).

An unknown ``kid`` fails this login and asks the shell to fetch the JWKS again
(``on_unknown_kid``, rate limited there): keys rotated at the issuer are learned
without a restart, and a client's retry succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import jwt

from kproxy.policies.auth.sasl import OAUTHBEARER, Step
from kproxy.policies.auth.users import MAX_NAME_BYTES

ALGORITHMS = ("RS256", "ES256")
MAX_JWKS_KEYS = 64
# A broker's OAUTHBEARER validator requires exp and iat; iss and aud are checked here
# because they are configured. jti is not: a broker keeps no replay cache either.
REQUIRED_CLAIMS = ["exp", "iat", "iss", "aud"]


@dataclass(frozen=True)
class OAuthSettings:
    issuer: str
    audience: str
    principal_claim: str = "sub"
    clock_skew_s: float = 30.0


@dataclass(frozen=True)
class JwksKeys:
    """The issuer's signing keys by ``kid``, as last fetched (replaced whole)."""

    keys: Mapping[str, jwt.PyJWK]
    fetched: bool = False  # False until a fetch succeeded once


def parse_jwks(data: bytes) -> dict[str, jwt.PyJWK]:
    """A JWKS document's usable signing keys (RSA and EC with a ``kid``), by ``kid``;
    ``ValueError`` for a document that is not a JWKS. Keys it cannot use are skipped."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("not a JWKS (no keys array)")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in doc["keys"][:MAX_JWKS_KEYS]:
        if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
            continue
        if entry.get("use", "sig") != "sig" or entry.get("kty") not in ("RSA", "EC"):
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError, KeyError):
            continue
        if key.algorithm_name in ALGORITHMS:
            keys[entry["kid"]] = key
    return keys


def bearer_token(message: bytes) -> str | None:
    """The token of a client's first OAUTHBEARER message, None when malformed."""
    try:
        text = message.decode("ascii")
    except UnicodeDecodeError:
        return None
    gs2, sep, rest = text.partition("\x01")
    if not sep or not gs2.startswith("n,") or not rest.endswith("\x01\x01"):
        return None
    for pair in rest[:-2].split("\x01"):
        key, eq, value = pair.partition("=")
        if eq and key == "auth":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class OAuthExchange:
    mechanism = OAUTHBEARER

    def __init__(self, settings: OAuthSettings, keys: Callable[[], JwksKeys],
                 clock: Callable[[], float], on_unknown_kid: Callable[[], None]) -> None:
        self.settings = settings
        self.keys = keys
        self.clock = clock  # wall-clock seconds: exp and nbf are Unix times
        self.on_unknown_kid = on_unknown_kid
        self.principal_hint: str | None = None

    def step(self, token: bytes) -> Step:
        raw = bearer_token(token)
        if raw is None:
            return _fail("malformed OAUTHBEARER message", "malformed")
        try:
            header = jwt.get_unverified_header(raw)
        except jwt.PyJWTError:
            return _fail("the token is not a JWS", "malformed token")
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            return _fail("token algorithm not accepted", f"algorithm {str(alg)[:16]}")
        jwks = self.keys()
        key = jwks.keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            self.on_unknown_kid()
            why = "unknown key id" if jwks.fetched else "issuer keys not fetched yet"
            return _fail(f"token signed by an {why}" if jwks.fetched else why, why)
        if key.algorithm_name != alg:
            return _fail("token algorithm does not match its key", "algorithm mismatch")
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                raw, key, algorithms=[alg], audience=s.audience, issuer=s.issuer,
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                         "require": REQUIRED_CLAIMS})
        except jwt.MissingRequiredClaimError as exc:
            return _fail(f"token has no {exc.claim} claim", f"no {exc.claim}")
        except jwt.InvalidAudienceError:
            return _fail("token audience not accepted", "wrong audience")
        except jwt.InvalidIssuerError:
            return _fail("token issuer not accepted", "wrong issuer")
        except jwt.InvalidSignatureError:
            return _fail("token signature invalid", "bad signature")
        except jwt.PyJWTError as exc:
            return _fail("token not accepted", type(exc).__name__)
        principal = claims.get(s.principal_claim)
        if isinstance(principal, str):
            self.principal_hint = principal[:MAX_NAME_BYTES]
        now = self.clock()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not _numeric(claims["iat"]):
            return _fail("token iat is not a time", "malformed iat")
        if not _numeric(exp) or exp + s.clock_skew_s <= now:
            return _fail("token expired", "expired")
        if nbf is not None and (not _numeric(nbf) or nbf - s.clock_skew_s > now):
            return _fail("token not valid yet", "not yet valid")
        if not isinstance(principal, str) or not principal or (
                len(principal.encode()) > MAX_NAME_BYTES):
            return _fail(f"token has no usable {s.principal_claim} claim", "no principal")
        lifetime_ms = max(1, int((exp - now) * 1000))
        return Step(principal=principal, lifetime_ms=lifetime_ms)


def _numeric(value: object) -> TypeGuard[int | float]:
    """A JWT NumericDate: a JSON number (not a boolean, which Python counts as one)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fail(message: str, detail: str) -> Step:
    return Step(error=f"Authentication failed: {message}", detail=detail)
