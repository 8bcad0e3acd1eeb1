"""SaslHandshake (key 17, v0-1) and SaslAuthenticate (key 36, v0-2; flexible from v2).

The proxy relays both untouched. It reads only a SaslAuthenticate response's
error code, to know whether the broker accepted the client; the schemas here also
let tests script a SASL broker and let ``kproxy decode`` show the exchange.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

HANDSHAKE_REQUEST = MessageSpec(
    "SaslHandshakeRequest", 17, "request", versions("0-1"), versions("none"),
    struct("SaslHandshakeRequest", f("mechanism", "string", "0+")),
)

HANDSHAKE_RESPONSE = MessageSpec(
    "SaslHandshakeResponse", 17, "response", versions("0-1"), versions("none"),
    struct(
        "SaslHandshakeResponse",
        f("error_code", "int16", "0+"),
        f("mechanisms", array("string"), "0+"),
    ),
)

AUTHENTICATE_REQUEST = MessageSpec(
    "SaslAuthenticateRequest", 36, "request", versions("0-2"), versions("2+"),
    struct("SaslAuthenticateRequest", f("auth_bytes", "bytes", "0+")),
)

AUTHENTICATE_RESPONSE = MessageSpec(
    "SaslAuthenticateResponse", 36, "response", versions("0-2"), versions("2+"),
    struct(
        "SaslAuthenticateResponse",
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("auth_bytes", "bytes", "0+"),
        f("session_lifetime_ms", "int64", "1+"),
    ),
)
