"""The proxy logging in to a broker as itself (``[sasl.upstream]``), without I/O.

With SASL terminated at the proxy, the clients' credentials stop at the proxy; the
proxy's own connections to the brokers (clients' upstreams and discovery) either
need no authentication or log in with the proxy's credentials, PLAIN or SCRAM
(through ``scramp``'s client, which also checks the broker's proof). ``UpstreamLogin``
makes the frames to send and reads the broker's answers; the shell moves them.

SCRAM's proof needs the salted password: PBKDF2 over as many iterations as the broker
names (Kafka's 4096 to 16384: 1 to 10 ms of CPU). ``derives_key`` says which answer
costs that, so the shell can compute it off its event loop; a broker naming more than
``MAX_ITERATIONS`` is refused before any is computed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import scramp

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import RequestHeader, write_request_header
from kproxy.codecs.interpreter import encode_into
from kproxy.codecs.messages import decode_response
from kproxy.codecs.primitives import Writer
from kproxy.codecs.registry import spec_for
from kproxy.policies.auth.users import MAX_ITERATIONS

HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 1  # not flexible: any broker since Kafka 1.0 answers it
CLIENT_ID = "kproxy"


class UpstreamLoginFailed(Exception):
    """The broker refused the proxy's credentials, or answered nonsense."""


@dataclass(frozen=True)
class UpstreamCredentials:
    mechanism: str  # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    username: str
    password: str

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"UpstreamCredentials({self.mechanism!r}, {self.username!r}, ***)"


def _frame(api_key: int, version: int, correlation_id: int, body: dict[str, object]) -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(api_key, version, correlation_id, CLIENT_ID))
    spec = spec_for(api_key, version, response=False)
    assert spec is not None
    encode_into(spec, version, body, w)
    data = w.getvalue()
    return struct.pack(">i", len(data)) + data


class UpstreamLogin:
    """One login: ``start()`` is the first frame; ``receive(response body)`` the next
    frame to send, or None once logged in; ``UpstreamLoginFailed`` otherwise."""

    def __init__(self, credentials: UpstreamCredentials) -> None:
        self.credentials = credentials
        self._stage = 0
        self._scram: scramp.ScramClient | None = None

    @property
    def derives_key(self) -> bool:
        """Whether the next answer (the broker's first SCRAM message) makes the proxy
        derive its salted password: the one costly step of a login."""
        return self._stage == 1 and self._scram is not None

    def start(self) -> bytes:
        return _frame(api_keys.SASL_HANDSHAKE, HANDSHAKE_VERSION, 1,
                      {"mechanism": self.credentials.mechanism})

    def receive(self, body: bytes) -> bytes | None:
        try:
            return self._receive(body)
        except CodecError as exc:
            raise UpstreamLoginFailed(f"unreadable SASL answer from the broker: {exc}") from None

    def _receive(self, body: bytes) -> bytes | None:
        creds = self.credentials
        if self._stage == 0:
            resp = decode_response(body, api_keys.SASL_HANDSHAKE, HANDSHAKE_VERSION).body
            if resp["error_code"] != 0:
                raise UpstreamLoginFailed(f"the broker does not offer {creds.mechanism} "
                                          f"(it offers {', '.join(resp['mechanisms'])})")
            self._stage = 1
            if creds.mechanism == "PLAIN":
                token = f"\0{creds.username}\0{creds.password}".encode()
            else:
                self._scram = scramp.ScramClient([creds.mechanism], creds.username,
                                                 creds.password)
                token = self._scram.get_client_first().encode()
            return self._authenticate(2, token)
        resp = decode_response(body, api_keys.SASL_AUTHENTICATE, AUTHENTICATE_VERSION).body
        if resp["error_code"] != 0:
            raise UpstreamLoginFailed(f"the broker refused the proxy's {creds.mechanism} "
                                      f"login: {resp.get('error_message') or resp['error_code']}")
        scram = self._scram
        if scram is None:
            return None  # PLAIN: one step
        try:
            if self._stage == 1:
                self._stage = 2
                scram.set_server_first(bytes(resp["auth_bytes"]).decode())
                if int(scram.iterations) > MAX_ITERATIONS:
                    raise UpstreamLoginFailed(
                        f"the broker asks for {scram.iterations} SCRAM iterations; the "
                        f"proxy derives a key with at most {MAX_ITERATIONS}")
                return self._authenticate(3, scram.get_client_final().encode())
            scram.set_server_final(bytes(resp["auth_bytes"]).decode())
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise UpstreamLoginFailed(f"SCRAM exchange with the broker failed: {exc}") from None
        return None

    @staticmethod
    def _authenticate(correlation_id: int, token: bytes) -> bytes:
        return _frame(api_keys.SASL_AUTHENTICATE, AUTHENTICATE_VERSION, correlation_id,
                      {"auth_bytes": token})
