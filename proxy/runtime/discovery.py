"""Reading the backend's broker set with a Metadata request of the proxy's own, over
one connection kept open from round to round.

A connection per round cost the cluster a TCP accept, a TLS handshake and, with
``[sasl.upstream]``, a SASL login (a SCRAM key derived on both sides) every
``discovery_interval`` for each worker of each proxy: on a fleet of sidecars, a steady
stream of handshakes for one small request each. So the connection stays open, as a
Kafka client keeps its own, and each round is one round trip on it.

It is kept only to the first bootstrap server: a round that reached a later one (the
first did not answer) closes it, so the next round tries the first again, as before
(one answer stays authoritative; ``BootstrapRotation``). Where that server is a name,
the connection is kept only while the name's answer (``AddressCache``, renewed every
``upstream_dns_ttl``) still holds the address it reached: a name moved to another
cluster is followed as soon as before; with ``upstream_dns_ttl = 0`` nothing is kept.
A kept connection that fails (closed by the broker, a restart,
``connections.max.idle.ms``) is replaced within the same round; only a fresh
connection's failure fails the round. A new upstream list, upstream TLS or login (a
reload) closes it.
"""

from __future__ import annotations

import ipaddress
import struct

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.headers import RequestHeader, write_request_header
from kproxy.codecs.interpreter import encode_into
from kproxy.codecs.messages import decode_response
from kproxy.codecs.primitives import Writer
from kproxy.codecs.schemas import metadata
from kproxy.policies.addressing import BrokerAddress
from kproxy.policies.rewrite import Seen
from kproxy.runtime.listeners import peer_of
from kproxy.runtime.upstream import BootstrapRotation, UpstreamUnavailable

# Metadata v4 is the oldest version every current broker still serves (Kafka 4
# dropped v0-v3) and needs no flexible-version handling.
DISCOVERY_VERSION = 4
CLIENT_ID = "kproxy-discovery"
# What a round trip may fail with: on the kept connection, a fresh one is tried then;
# with ``UpstreamUnavailable`` (no server answered), what fails a round (logged).
KEPT_CONNECTION_FAILED = (OSError, trio.TooSlowError, trio.BrokenResourceError,
                          trio.ClosedResourceError, ConnectionError, CodecError)
ROUND_FAILED = (UpstreamUnavailable, *KEPT_CONNECTION_FAILED)


def metadata_request(correlation_id: int) -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(api_keys.METADATA, DISCOVERY_VERSION, correlation_id,
                                          CLIENT_ID))
    encode_into(metadata.REQUEST, DISCOVERY_VERSION,
                {"topics": [], "allow_auto_topic_creation": False}, w)
    body = w.getvalue()
    return struct.pack(">i", len(body)) + body


class Discovery:
    """Discovery's round trips, on a connection kept to the first bootstrap server."""

    def __init__(self, rotation: BootstrapRotation) -> None:
        self.rotation = rotation
        self._stream: trio.abc.Stream | None = None
        self._peer: tuple[str, int] | None = None  # the address the kept one reached
        self._made_with: tuple[object, ...] = ()  # what the kept connection was opened with
        self._correlation_id = 0
        self._lock = trio.Lock()

    async def discover(self, timeout: float, max_frame: int) -> Seen:
        """One Metadata round trip; raises on any failure (the caller logs and retries)."""
        async with self._lock:  # the kept connection carries one round trip at a time
            if self._stream is not None and (self._made_with != self._settings()
                                             or not await self._still_pointed_at()):
                await self.aclose()
            if self._stream is not None:
                try:
                    return await self._ask(self._stream, timeout, max_frame)
                except KEPT_CONNECTION_FAILED:
                    await self.aclose()  # gone since the last round: a fresh one
        # A fresh connection: a reload's round does not wait for a slow connect of the
        # periodic one (the old list's), as it did not before.
        made_with = self._settings()
        stream, server = await self.rotation.connect(timeout)
        try:
            seen = await self._ask(stream, timeout, max_frame)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if (self._stream is None and self.rotation.servers[:1] == [server]
                and made_with == self._settings()):
            self._stream, self._made_with, self._peer = stream, made_with, _peer_of(stream)
        else:  # a later server answered (the next round tries the first again), or
            await stream.aclose()  # another round's connection is kept already
        return seen

    async def aclose(self) -> None:
        """Close the kept connection (the proxy stops, or its upstream changed)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _still_pointed_at(self) -> bool:
        """Whether the first server still leads to the address the kept connection
        reached: always for an IP address, for a name while its answer holds it."""
        host, port = self.rotation.servers[0]
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            pass
        names = self.rotation.names
        if names is None or names.ttl <= 0 or self._peer is None:
            return False  # a name resolved at every connection: a fresh one each round
        try:
            addresses, _ = await names.lookup(host, port)
        except OSError:
            return False  # the fresh connection's attempt reports it
        return self._peer in {(sockaddr[0], sockaddr[1]) for _, sockaddr in addresses}

    def _settings(self) -> tuple[object, ...]:
        rotation = self.rotation
        return (tuple(rotation.servers), rotation.tls, rotation.login)

    async def _ask(self, stream: trio.abc.Stream, timeout: float, max_frame: int) -> Seen:
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        with trio.fail_after(timeout):
            await stream.send_all(metadata_request(correlation_id))
            reader = FrameReader(max_frame)
            while (frame := reader.next_frame()) is None:
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("broker closed the discovery connection")
                reader.feed(data)
        response = decode_response(frame, api_keys.METADATA, DISCOVERY_VERSION)
        if response.header.correlation_id != correlation_id:
            raise ConnectionError("discovery answer out of step with its request")
        body = response.body
        return Seen(
            nodes={b["node_id"]: BrokerAddress(b["host"], b["port"], b.get("rack"))
                   for b in body["brokers"]},
            complete=True, cluster_id=body.get("cluster_id"))


def _peer_of(stream: trio.abc.Stream) -> tuple[str, int] | None:
    """The (address, port) a connection reached, TLS or not."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    return peer_of(inner) if isinstance(inner, trio.SocketStream) else None
