"""Opening the one upstream connection a client connection maps to (and discovery's):
TCP, TLS when on, and the proxy's own SASL login when ``[sasl.upstream]`` sets one.

**The proxy's SCRAM login** derives its salted password off the event loop
(``kproxy.auth.derivations``).

**Upstream names** (``AddressCache``): resolved now and then, not at every client
connection. Every client connection opens an upstream connection of its own. When
the upstream is a name (a Kubernetes Service, the host a broker advertises),
resolving it each time costs a thread hop and, on a real network, one DNS round trip
or several (a pod's resolver tries its search domains first). On the bench machine,
with the name in /etc/hosts, that was 0.27 ms of proxy CPU per connection, a quarter
of all a short connection cost.

So an answer is kept for ``upstream_dns_ttl`` seconds (by default 30, as long as the
JVM keeps one for Kafka's own clients; 0 resolves at every connection, as trio's
``open_tcp_stream`` does). getaddrinfo does not say how long an answer is valid, so a
kept answer that fails is dropped at once: a connect refused at every kept address is
tried again with a fresh answer, and one that timed out leaves the next connection
to resolve afresh. A name's addresses are tried in order, and one that accepts after
others did not is tried first from then on. Connections that find a name unknown at
once wait for one resolution together. At most ``MAX_NAMES`` names are kept, the
least recently used dropped first: the names come from the configuration and from
the backend's answers.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import ssl
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from kproxy.auth.derivations import derive
from kproxy.config.settings import HostPort
from kproxy.policies.auth.upstream import UpstreamCredentials, UpstreamLogin, UpstreamLoginFailed
from kproxy.policies.connection import ConnectionState
from kproxy.policies.proxy_state import ProxyState
from kproxy.runtime.tls import connect_tls
from kproxy.session.events import SessionEvents

MAX_NAMES = 1024  # upstream names whose answers are kept (LRU)

Address = tuple[int, Any]  # (address family, socket address)
Resolve = Callable[[str, int], Awaitable[list[Address]]]


async def getaddrinfo(host: str, port: int) -> list[Address]:
    """The addresses of ``host`` for a TCP connection, in the system's preferred order."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos]


@dataclass
class _Pending:
    """One resolution in flight; connections asking for the same name wait for it."""

    done: trio.Event = field(default_factory=trio.Event)
    addresses: list[Address] | None = None
    error: OSError | None = None


class AddressCache:
    def __init__(self, ttl: float, resolve: Resolve = getaddrinfo,
                 max_names: int = MAX_NAMES) -> None:
        self.ttl = ttl  # read at each lookup: a reload applies
        self._resolve = resolve
        self._max_names = max_names
        self._kept: OrderedDict[tuple[str, int], tuple[float, list[Address]]] = OrderedDict()
        self._pending: dict[tuple[str, int], _Pending] = {}

    def __len__(self) -> int:
        return len(self._kept)

    async def lookup(self, host: str, port: int) -> tuple[list[Address], bool]:
        """``host``'s addresses, and whether they were resolved for this call (else kept)."""
        key = (host, port)
        while True:
            kept = self._kept.get(key)
            if kept is not None and kept[0] > trio.current_time():
                self._kept.move_to_end(key)
                return kept[1], False
            pending = self._pending.get(key)
            if pending is None:
                return await self._resolve_now(key), True
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            if pending.addresses is not None:
                return pending.addresses, True
            # The resolving connection was cancelled: the next one resolves.

    def forget(self, host: str, port: int) -> None:
        self._kept.pop((host, port), None)

    def prefer(self, host: str, port: int, address: Address) -> None:
        """``address`` accepted where the ones before it did not: tried first from now
        on, so that only one connection pays for an address that does not answer."""
        kept = self._kept.get((host, port))
        if kept is not None and address in kept[1]:
            self._kept[host, port] = (kept[0], [address] + [a for a in kept[1] if a != address])

    def reconfigure(self, ttl: float) -> None:
        """A reload: a changed time to keep applies to the answers kept so far too."""
        if ttl != self.ttl:
            self.ttl = ttl
            self._kept.clear()

    async def _resolve_now(self, key: tuple[str, int]) -> list[Address]:
        pending = self._pending[key] = _Pending()
        try:
            addresses = await self._resolve(*key)
            if not addresses:
                raise OSError(f"{key[0]} resolved to no address")
            pending.addresses = addresses
        except OSError as exc:
            pending.error = exc
            raise
        finally:
            del self._pending[key]
            pending.done.set()
        if self.ttl > 0:
            self._kept[key] = (trio.current_time() + self.ttl, addresses)
            self._kept.move_to_end(key)
            while len(self._kept) > self._max_names:
                self._kept.popitem(last=False)
        return addresses


class UpstreamUnavailable(Exception):
    def __init__(self, tried: list[tuple[HostPort, str]]) -> None:
        self.tried = tried
        super().__init__("; ".join(f"{h}:{p}: {why}" for (h, p), why in tried))


MAX_SASL_ANSWER = 64 * 1024


async def connect(host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None,
                  login: UpstreamCredentials | None = None,
                  names: AddressCache | None = None) -> trio.abc.Stream:
    """A connection to one broker, TLS when ``tls`` is given, logged in with ``login``;
    the timeout covers each of the three. ``names``: answers kept for a name."""
    with trio.fail_after(timeout):
        stream = await _open_tcp(host, port, names)
    if tls is None:
        return await _logged_in(stream, login, timeout)
    try:
        return await _logged_in(await connect_tls(stream, tls, host, timeout), login, timeout)
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(stream)
        why = exc.__cause__ if isinstance(exc.__cause__, ssl.SSLError) else exc
        raise OSError(f"TLS handshake failed: {why}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def _open_tcp(host: str, port: int, names: AddressCache | None = None
                    ) -> trio.SocketStream:
    """A TCP connection to ``host``. An IP address is connected to directly: trio's
    ``open_tcp_stream`` races a task per resolved address in a nursery of its own,
    which for the one address of a literal is a tenth of what a short connection
    costs the proxy. A name is looked up in ``names`` (``AddressCache``), or,
    when answers are not kept, resolved and raced as trio does."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        if names is None or names.ttl <= 0:
            return await trio.open_tcp_stream(host, port)
        return await _open_by_name(host, port, names)
    return await _connect_to(family, (host, port), host, port)


async def _open_by_name(host: str, port: int, names: AddressCache) -> trio.SocketStream:
    """Connected to one of ``host``'s addresses; a kept answer that fails is dropped,
    and a refused one tried again with a fresh answer (the broker may have moved)."""
    addresses, fresh = await names.lookup(host, port)
    try:
        return await _connect_any(addresses, host, port, names)
    except OSError:
        if fresh:
            raise
        names.forget(host, port)
    except BaseException:  # timed out (or cancelled) at a kept answer
        if not fresh:
            names.forget(host, port)
        raise
    addresses, _ = await names.lookup(host, port)
    return await _connect_any(addresses, host, port, names)


async def _connect_any(addresses: list[Address], host: str, port: int,
                       names: AddressCache) -> trio.SocketStream:
    """The first of ``addresses`` that accepts, tried in order, as Kafka's clients do;
    each try gets an equal share of the time left, the last one all of it. One that
    accepts after others did not is tried first next time (``AddressCache.prefer``)."""
    error: OSError | None = None
    for i, (family, sockaddr) in enumerate(addresses):
        left = trio.current_effective_deadline() - trio.current_time()
        with trio.move_on_after(left / (len(addresses) - i)) as attempt:
            try:
                stream = await _connect_to(family, sockaddr, host, port)
                if i:
                    names.prefer(host, port, (family, sockaddr))
                return stream
            except OSError as exc:
                error = exc
        if attempt.cancelled_caught:
            error = OSError(errno.ETIMEDOUT, f"connecting to {host}:{port} "
                            f"({sockaddr[0]}) timed out")
    assert error is not None  # a lookup never gives an empty answer
    raise error


async def _connect_to(family: int, sockaddr: Any, host: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect(sockaddr)
    except OSError as exc:
        sock.close()
        at = "" if sockaddr[0] == host else f" ({sockaddr[0]})"
        raise OSError(exc.errno, f"connecting to {host}:{port}{at} failed: "
                      f"{exc.strerror or exc}") from None
    except BaseException:  # cancelled, or timed out by the caller's deadline
        sock.close()
        raise
    return trio.SocketStream(sock)


async def _logged_in(stream: trio.abc.Stream, login: UpstreamCredentials | None,
                     timeout: float) -> trio.abc.Stream:
    """The stream, after the proxy's SASL login on it when one is configured."""
    if login is None:
        return stream
    exchange = UpstreamLogin(login)
    try:
        with trio.fail_after(timeout):
            out: bytes | None = exchange.start()
            while out is not None:
                await stream.send_all(out)
                answer = await _read_frame(stream)
                if exchange.derives_key:
                    out = await derive(partial(exchange.receive, answer))
                else:
                    out = exchange.receive(answer)
    except BaseException as exc:
        await trio.aclose_forcefully(stream)
        if isinstance(exc, UpstreamLoginFailed):
            raise OSError(str(exc)) from None
        if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
            raise OSError("the broker closed the connection during the SASL login") from None
        raise
    return stream


async def _read_frame(stream: trio.abc.Stream) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        if len(data) >= 4 and not 0 <= struct.unpack(">i", data[:4])[0] <= MAX_SASL_ANSWER:
            raise UpstreamLoginFailed("the broker's SASL answer is not a sane frame")
        chunk = await stream.receive_some(MAX_SASL_ANSWER)
        if not chunk:
            raise trio.BrokenResourceError("closed")
        data += chunk
    return data[4:]


class BootstrapRotation:
    """Connects to the first reachable bootstrap server, in the configured order.

    Always starting from the first keeps one answer authoritative: were new
    connections spread over servers that disagree (a broker being replaced),
    the proxy's view of the backend would flip between their answers.
    """

    def __init__(self, servers: Sequence[HostPort], tls: ssl.SSLContext | None = None,
                 login: UpstreamCredentials | None = None,
                 names: AddressCache | None = None) -> None:
        self.servers = list(servers)
        self.tls = tls
        self.login = login  # the proxy's own SASL login at the brokers, if any
        self.names = names  # upstream names' answers, kept a while (also for brokers)

    async def connect(self, timeout: float) -> tuple[trio.abc.Stream, HostPort]:
        tried: list[tuple[HostPort, str]] = []
        for host, port in list(self.servers):
            try:
                return await connect(host, port, timeout, self.tls, self.login,
                                     self.names), (host, port)
            except trio.TooSlowError:
                tried.append(((host, port), f"no answer within {timeout:g}s"))
            except OSError as exc:
                tried.append(((host, port), exc.strerror or str(exc)))
        raise UpstreamUnavailable(tried)


class UpstreamConnector:
    """Opens a session's upstream: a bootstrap server, or the broker its listener serves."""

    def __init__(self, state: ProxyState, rotation: BootstrapRotation, timeout: float,
                 events: SessionEvents) -> None:
        self.state = state
        self.rotation = rotation
        self.timeout = timeout
        self.events = events

    async def connect(self, conn: ConnectionState) -> tuple[trio.abc.Stream, HostPort] | None:
        """The stream and the address it reached, or None (counted and logged)."""
        try:
            if conn.node_id is None:
                return await self.rotation.connect(self.timeout)
            return await self._broker(conn.node_id)
        except UpstreamUnavailable as exc:
            self.events.upstream_unreachable(conn, str(exc))
            return None

    async def _broker(self, node_id: int) -> tuple[trio.abc.Stream, HostPort]:
        addr = self.state.view.address_of(node_id)
        if addr is None:
            raise UpstreamUnavailable([(("?", 0), f"node {node_id} is not a known broker")])
        where = (addr.host, addr.port)
        try:
            return await connect(addr.host, addr.port, self.timeout, self.rotation.tls,
                                 self.rotation.login, self.rotation.names), where
        except trio.TooSlowError:
            raise UpstreamUnavailable([(where, f"no answer within {self.timeout:g}s")]) from None
        except OSError as exc:
            raise UpstreamUnavailable([(where, exc.strerror or str(exc))]) from None
