"""Signing keys and tokens made in the tests, for OAUTHBEARER (unit and end to end)."""

from __future__ import annotations

import json
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://issuer.test"
AUDIENCE = "kafka"


class Keys:
    """An RSA and an EC key with kids, their JWKS, and tokens signed with either."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key()))
        return {"keys": [{**rsa_jwk, "kid": "rsa-1", "use": "sig", "alg": "RS256"},
                         {**ec_jwk, "kid": "ec-1", "use": "sig", "alg": "ES256"}]}

    def token(self, now: float, sub: str = "svc-a", kid: str = "rsa-1", ttl: float = 600,
              **claims: Any) -> str:
        keys: dict[str, tuple[rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, str]] = {
            "rsa-1": (self.rsa, "RS256"), "ec-1": (self.ec, "ES256"),
            "gone": (self.other, "RS256")}
        key, alg = keys[kid]
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": int(now),
                "exp": int(now + ttl), **claims}
        return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def client_message(token: str) -> bytes:
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()
