"""OAUTHBEARER checks without sockets: signatures (RS256, ES256), exp, iat, nbf, iss,
aud, unknown kids, algorithm confusion, malformed messages, and JWKS parsing."""

from __future__ import annotations

import base64
import hmac
import json

import jwt
import pytest

from kproxy.policies.auth.oauth import (
    JwksKeys,
    OAuthExchange,
    OAuthSettings,
    bearer_token,
    parse_jwks,
)

from ..oauth_keys import AUDIENCE, ISSUER, Keys, client_message

NOW = 1_900_000_000.0
KEYS = Keys()


def _login(token: str | bytes, claim: str = "sub") -> tuple[str | None, str | None, int, int]:
    asked: list[int] = []
    keys = JwksKeys(parse_jwks(json.dumps(KEYS.jwks()).encode()), fetched=True)
    exchange = OAuthExchange(OAuthSettings(ISSUER, AUDIENCE, claim, 30), lambda: keys,
                             lambda: NOW, lambda: asked.append(1))
    step = exchange.step(token if isinstance(token, bytes) else client_message(token))
    return step.principal, step.detail, step.lifetime_ms, len(asked)


def test_rs256_and_es256_tokens_log_in_for_their_lifetime() -> None:
    assert _login(KEYS.token(NOW, ttl=600)) == ("svc-a", None, 600_000, 0)
    assert _login(KEYS.token(NOW, kid="ec-1", sub="svc-b"))[0] == "svc-b"
    assert _login(KEYS.token(NOW, client="team-x"), claim="client")[0] == "team-x"


@pytest.mark.parametrize("token, detail", [
    (KEYS.token(NOW, ttl=-60), "expired"),
    (KEYS.token(NOW, nbf=int(NOW + 600)), "not yet valid"),
    (KEYS.token(NOW, aud="other"), "wrong audience"),
    (KEYS.token(NOW, iss="https://evil.test"), "wrong issuer"),
    (KEYS.token(NOW, sub=""), "no principal"),
    (KEYS.token(NOW, iat=None), "no iat"),
    (KEYS.token(NOW, iat="yesterday"), "malformed iat"),
    (KEYS.token(NOW, iat=True), "malformed iat"),
    (KEYS.token(NOW, exp=None), "no exp"),
    (KEYS.token(NOW)[:-4] + "AAAA", "bad signature"),
    ("not-a-jwt", "malformed token"),
])
def test_bad_tokens_are_refused(token: str, detail: str) -> None:
    principal, why, _, _ = _login(token)
    assert principal is None and why == detail


def test_within_the_clock_skew_an_expired_token_still_passes() -> None:
    assert _login(KEYS.token(NOW, ttl=-10))[0] == "svc-a"


def test_unknown_kid_is_refused_and_asks_for_a_fetch() -> None:
    principal, why, _, asked = _login(KEYS.token(NOW, kid="gone"))
    assert principal is None and why == "unknown key id" and asked == 1


def test_algorithm_confusion_is_refused() -> None:
    # HS256 signed with the RSA public key's bytes: a classic confusion attack.
    # (made by hand: PyJWT itself refuses to sign so).
    public = json.dumps(KEYS.jwks()["keys"][0]).encode()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
    body = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "root",
                           "exp": int(NOW + 60)}).encode())
    mac = hmac.digest(public, f"{head}.{body}".encode(), "sha256")
    assert _login(f"{head}.{body}.{b64(mac)}")[1] == "algorithm HS256"
    none_alg = jwt.encode({"sub": "root"}, "", algorithm="none", headers={"kid": "rsa-1"})
    assert _login(none_alg)[0] is None


@pytest.mark.parametrize("message", [b"", b"n,,", b"n,,\x01auth=Basic x\x01\x01",
                                     b"n,,\x01auth=Bearer t\x01", b"\xff\x01\x01"])
def test_malformed_messages(message: bytes) -> None:
    assert bearer_token(message) is None
    assert _login(message)[1] == "malformed"


def test_jwks_parsing_skips_what_it_cannot_use() -> None:
    doc = KEYS.jwks()
    doc["keys"] += [{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}, {"kty": "RSA"}, "junk",
                    {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"}]
    assert sorted(parse_jwks(json.dumps(doc).encode())) == ["ec-1", "rsa-1"]
    for bad in (b"<html>", b"[]", b'{"keys": 3}', b"\xff"):
        with pytest.raises(ValueError):
            parse_jwks(bad)
