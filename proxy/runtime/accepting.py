"""Accepting a client connection: admission, TLS (and SNI routing), then its session.

Every listener (bootstrap, per-broker, a virtual cluster's) serves through ``serve``:
``Admission`` admits the connection, ``serve_one`` shakes hands and hands it to a
``Session``, which from then on owns the admission and gives it back when it ends.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import trio

from kproxy.context import SessionServices
from kproxy.policies.auth.cert import cert_principal
from kproxy.runtime.tls import HandshakeFailed, accept_tls
from kproxy.runtime.virtual_clusters import VirtualCluster
from kproxy.session.session import Session

if TYPE_CHECKING:
    from kproxy.runtime.server import Proxy


async def serve(proxy: Proxy, listeners: list[trio.SocketListener], name: str,
                node_id: int | None, scope: trio.CancelScope,
                services: SessionServices | None = None,
                vcluster: VirtualCluster | None = None) -> None:
    """Accept on ``listeners`` until ``scope`` is cancelled, then close them."""
    # A partial, not a wrapping coroutine: every open connection waits inside its
    # handler, and each coroutine frame it waits in is memory it holds.
    handle = partial(serve_one, proxy, node_id=node_id, services=services, vcluster=vcluster)
    assert proxy.sessions_nursery is not None
    with scope:
        try:
            await proxy.admission.serve(listeners, name, handle, proxy.sessions_nursery)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)


async def serve_one(proxy: Proxy, stream: trio.SocketStream, peer: tuple[str, int], name: str,
                    node_id: int | None, services: SessionServices | None = None,
                    vcluster: VirtualCluster | None = None) -> None:
    """Serve an admitted connection. It owns its admission until a session takes it
    over: the session releases it when it ends, which may be long after this returns
    (a parked session has no task)."""
    session: Session | None = None
    try:
        accepted = await _handshake(proxy, stream, peer, name, node_id)
        if accepted is None:
            return
        client, name, node_id = accepted
        session = Session(services or proxy.services, client, name, node_id, peer,
                          proxy.session_ended)
        proxy.sessions.add(session)
        if vcluster is not None:
            vcluster.accepted += 1
        if isinstance(client, trio.SSLStream) and proxy.config.tls_client_auth != "none":
            _cert_login(proxy, session, client)
    finally:
        if session is None:
            stream.socket.close()  # idempotent: closed already when refused
            proxy.admission.release(peer[0])
    await session.run()


async def _handshake(proxy: Proxy, stream: trio.SocketStream, peer: tuple[str, int],
                     name: str, node_id: int | None,
                     ) -> tuple[trio.abc.Stream, str, int | None] | None:
    """The client stream (TLS when on, its server name picking the broker with SNI
    routing), the listener name and node; None when the connection was refused."""
    if proxy.server_tls is None:
        return stream, name, node_id
    try:
        client, server_name = await accept_tls(stream, proxy.server_tls,
                                               proxy.config.tls_handshake_timeout)
    except HandshakeFailed as exc:
        limit = "tls_handshake_timeout" if exc.timed_out else None
        proxy.admission.refuse(limit, "tls_handshake", "TLS handshake failed; "
                               "connection closed", peer, listener=name, error=str(exc))
        proxy.metrics.tls_handshake_failures.labels(name).inc()
        await trio.aclose_forcefully(stream)
        return None
    sni = proxy.state.port_map.sni
    if sni is not None:
        node_id = sni.node_for(server_name)
        if node_id is not None and node_id not in proxy.state.view.nodes:
            proxy.admission.refuse(None, "sni", "TLS server name names no known "
                                   "broker; connection closed", peer, listener=name,
                                   server_name=server_name)
            await trio.aclose_forcefully(client)
            return None
        name = f"broker-{node_id}" if node_id is not None else name
    return client, name, node_id


def _cert_login(proxy: Proxy, session: Session,
                client: trio.SSLStream[trio.SocketStream]) -> None:
    """A verified client certificate names the connection's principal (a SASL login
    on it, when SASL is terminated here, still comes first and names it then)."""
    principal = cert_principal(client.getpeercert(), proxy.config.tls_principal)
    if principal is None:
        return
    conn = session.conn
    conn.principal = principal
    proxy.audit_record({"event": "login", "outcome": "ok", "mechanism": "mTLS",
                        "principal": principal, "listener": conn.listener,
                        "source": f"{conn.info.source_address}:{conn.info.source_port}"})
