"""TLS contexts for both sides, and the server-side handshake that learns the SNI name.

The files are read once at start (and on reload), so a bad certificate stops the
proxy with a clear message instead of failing every client handshake later.
"""

from __future__ import annotations

import ssl

import trio

from kproxy.config.settings import Config, ConfigError

# Modern clients (librdkafka, Java 11+) all speak TLS 1.2 or 1.3.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, what: str) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: cannot load {cert} with {key}: {exc}") from None


def _load_ca(ctx: ssl.SSLContext, cafile: str, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: cannot load CA bundle {cafile}: {exc}") from None


def server_context(cfg: Config) -> ssl.SSLContext | None:
    """The context client-facing listeners wrap connections in; None when TLS is off."""
    if not cfg.tls_cert or not cfg.tls_key:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    _load_chain(ctx, cfg.tls_cert, cfg.tls_key, "tls_cert")
    if cfg.tls_client_ca:
        _load_ca(ctx, cfg.tls_client_ca, "tls_client_ca")
    ctx.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[cfg.tls_client_auth]
    # Record the server name each client asked for; routing reads it after the
    # handshake. Returning None lets the handshake go on with this context.
    def remember_name(obj: ssl.SSLObject | ssl.SSLSocket, name: str | None,
                      _ctx: ssl.SSLContext) -> None:
        obj.kproxy_server_name = name  # type: ignore[union-attr]

    ctx.sni_callback = remember_name
    return ctx


def upstream_context(cfg: Config) -> ssl.SSLContext | None:
    """The context for connections to brokers; None when upstream TLS is off."""
    if not cfg.upstream_tls:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates by default
    ctx.minimum_version = MINIMUM_VERSION
    if cfg.upstream_tls_ca:
        _load_ca(ctx, cfg.upstream_tls_ca, "upstream_tls_ca")
    else:
        ctx.load_default_certs()
    ctx.check_hostname = cfg.upstream_tls_verify_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if cfg.upstream_tls_cert and cfg.upstream_tls_key:
        _load_chain(ctx, cfg.upstream_tls_cert, cfg.upstream_tls_key, "upstream_tls_cert")
    return ctx


class HandshakeFailed(Exception):
    """A client's TLS handshake failed or took too long; the message says why."""

    def __init__(self, why: str, *, timed_out: bool = False) -> None:
        super().__init__(why)
        self.timed_out = timed_out


async def accept_tls(stream: trio.SocketStream, ctx: ssl.SSLContext,
                     timeout: float) -> tuple[trio.SSLStream[trio.SocketStream], str | None]:
    """Run the server handshake; return the stream and the SNI name the client sent."""
    tls = trio.SSLStream(stream, ctx, server_side=True)
    try:
        with trio.fail_after(timeout):
            await tls.do_handshake()
    except trio.TooSlowError:
        raise HandshakeFailed(f"no TLS handshake within {timeout:g}s", timed_out=True
                              ) from None
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        raise HandshakeFailed(str(cause) if cause else "client left during the handshake"
                              ) from None
    # trio has no public accessor for the SSLObject the callback saw.
    name = getattr(getattr(tls, "_ssl_object", None), "kproxy_server_name", None)
    return tls, name


async def connect_tls(stream: trio.SocketStream, ctx: ssl.SSLContext, host: str,
                      timeout: float) -> trio.SSLStream[trio.SocketStream]:
    """Wrap an upstream connection; the broker's certificate is checked against ``host``."""
    tls = trio.SSLStream(stream, ctx, server_hostname=host)
    with trio.fail_after(timeout):
        await tls.do_handshake()
    return tls
