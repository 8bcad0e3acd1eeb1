"""Connection admission: every new client connection is counted in or refused at accept.

Three limits apply, checked before anything else is done for the connection (no
TLS handshake, no upstream connect): ``max_connections`` over all listeners,
``max_connections_per_source`` per client address, and the open-file budget.

The budget: each proxied connection holds two descriptors (the client's socket
and its upstream socket), and the process needs some of its own (listeners, the
HTTP port and its scrapes, the archive, discovery, trio's wake-up sockets,
standard streams). At start the soft open-file limit is raised to the hard one
when allowed; what stays after the reserve, halved, is the most connections the
process can hold without ever meeting EMFILE. The effective cap is the smaller of
that and ``max_connections``; a refusal because of it counts under
``kproxy_limit_hits{limit="fds"}``.

The accept loop is our own rather than ``trio.serve_listeners``: a refused
connection is closed in the loop (no task, no half-opened session), the count is
taken before any await so no cancellation can slip between admit and release (the
handler owns the release from its first step: a session gives it back when it
closes, which for a parked session is long after its task returned), and
should EMFILE happen anyway (another process's descriptors, a budget set too
tight) it is counted and waited out instead of logged as an error every 100 ms.

Under a supervisor (``--workers N``) the two connection limits are global: after the
local count (which still guards this worker's descriptors), the connection's task
asks the supervisor for its verdict (``kproxy.runtime.admission_control``) before
anything else is done for it. With one worker there is no channel and no cost.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from prometheus_client import Gauge

from kproxy.config.settings import Config
from kproxy.http.server import MAX_CONNECTIONS as HTTP_MAX_CONNECTIONS
from kproxy.logs import RateLimitedLog
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.runtime.admission_control import UNANSWERED, AdmissionControl
from kproxy.runtime.listeners import peer_of
from kproxy.session.splice import PIPE_FDS

log = logging.getLogger("kproxy")

# Descriptors the process holds whatever it serves: standard streams, trio's epoll
# and wake-up socket pair, the signal wake-up fd, Python's own (urandom), a config
# file being read on reload, TLS files being read, a transient accept to refuse.
BASE_FDS = 24
ARCHIVE_FDS = 4  # the open file, a directory scan while pruning, a rename
DISCOVERY_FDS = 2  # one connection at a time; a second while happy eyeballs races
MARGIN_FDS = 64  # room for what the list above forgets
ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
ACCEPT_BACKOFF = 0.1  # longest wait after EMFILE before trying accept again

Handler = Callable[[trio.SocketStream, tuple[str, int], str], Awaitable[None]]


@dataclass(frozen=True)
class FdBudget:
    """How the open-file limit is shared out; ``connections`` is what fits."""

    soft: int
    hard: int
    raised_from: int | None  # the soft limit before kproxy raised it, if it did
    reserved: int
    connections: int

    def describe(self) -> dict[str, object]:
        return {"open_file_limit": self.soft, "hard_limit": self.hard,
                "raised_from": self.raised_from, "reserved_fds": self.reserved,
                "connections_that_fit": self.connections}


def raise_open_file_limit() -> tuple[int, int, int | None]:
    """Raise the soft RLIMIT_NOFILE to the hard one when allowed; (soft, hard, before)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:  # the kernel's own ceiling on a process's descriptors
            with open("/proc/sys/fs/nr_open") as fh:
                target = int(fh.read())
        except (OSError, ValueError):
            return soft, hard, None
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target, hard, soft
        except (ValueError, OSError):
            pass
    return soft, hard, None


def plan_budget(soft: int, hard: int, raised_from: int | None, *, listener_fds: int,
                broker_listener_fds: int, archive: bool) -> FdBudget:
    reserved = (BASE_FDS + listener_fds + broker_listener_fds + HTTP_MAX_CONNECTIONS
                + (ARCHIVE_FDS if archive else 0) + DISCOVERY_FDS + MARGIN_FDS + PIPE_FDS)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 30
    return FdBudget(soft, hard, raised_from, reserved, max(0, (limit - reserved) // 2))


async def addresses(host: str) -> int:
    """How many sockets a listener on ``host`` opens (one per address it resolves to)."""
    try:
        infos = await trio.socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM,
                                              flags=socket.AI_PASSIVE)
    except OSError:
        return 2
    return max(1, len({info[0] for info in infos}))


def already_gone(stream: trio.SocketStream) -> bool:
    """True when the client closed or reset the connection before sending anything."""
    try:
        probe = socket.socket(fileno=stream.socket.fileno())
    except OSError:
        return True  # not a usable socket any more
    try:
        return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, nothing sent yet: the usual case
    except OSError:
        return True  # reset
    finally:
        probe.detach()


class Admission:
    """Owns the count of admitted connections, in all and by source address."""

    def __init__(self, config: Config, metrics: ProxyMetrics, ratelog: RateLimitedLog) -> None:
        self.config = config  # replaced on reload
        self.metrics = metrics
        self.ratelog = ratelog
        # Connections admitted and not yet closed (TLS handshakes included).
        self.open = 0
        self.by_source: dict[str, int] = {}
        self.budget: FdBudget | None = None
        self._released = trio.Event()
        # The supervisor's global count, when this process is one of several workers.
        self.control: AdmissionControl | None = None
        r = metrics.registry
        Gauge("kproxy_client_connections_admitted", "Client connections counted against "
              "the connection limits now (TLS handshakes included)", registry=r,
              ).set_function(lambda: float(self.open))
        Gauge("kproxy_max_connections_effective", "Client connections admitted at most: "
              "max_connections, or fewer when the open-file limit cannot hold that many "
              "(two descriptors per proxied connection)", registry=r,
              ).set_function(lambda: float(self.max_connections))
        Gauge("kproxy_open_file_limit", "The process's open-file limit (RLIMIT_NOFILE soft)",
              registry=r).set_function(lambda: float(self.budget.soft if self.budget else 0))

    @property
    def max_connections(self) -> int:
        configured = self.config.max_connections
        if self.budget is None:
            return configured
        return min(configured, self.budget.connections)

    async def plan(self, cfg: Config) -> FdBudget:
        """At start: raise the open-file limit, reserve the process's own, log the cap."""
        soft, hard, before = raise_open_file_limit()
        listener_fds = await addresses(cfg.listen[0]) + await addresses(cfg.http[0])
        broker_fds = 0
        if cfg.port_map.sni is None:
            first, last = cfg.node_id_range
            broker_host = cfg.broker_bind_host or cfg.listen[0]
            broker_fds = (last - first + 1) * await addresses(broker_host)
        budget = self.budget = plan_budget(soft, hard, before, listener_fds=listener_fds,
                                           broker_listener_fds=broker_fds,
                                           archive=bool(cfg.archive))
        fields = {**budget.describe(), "max_connections": cfg.max_connections,
                  "effective_max_connections": self.max_connections}
        if budget.connections < 1:
            log.error("the open-file limit leaves no room for client connections; raise it "
                      "(ulimit -n) or narrow --node-id-range", extra={"fields": fields})
        elif budget.connections < cfg.max_connections and self.control is None:
            # (A worker's own descriptors; over all workers the supervisor reports it.)
            log.warning("max_connections lowered to what the open-file limit holds (two "
                        "descriptors per proxied connection)", extra={"fields": fields})
        else:
            log.info("connection limit", extra={"fields": fields})
        return budget

    # ------------------------------------------------------------------ counting

    def admit(self, source: str, listener: str) -> bool:
        """Count the connection in, or refuse it when a connection limit is reached."""
        cfg = self.config
        cap = self.max_connections
        controlled = self.control is not None and self.budget is not None
        if controlled and self.budget is not None:
            # The two limits are the supervisor's, over every worker; what is left here
            # is what this worker's descriptors hold (counting connections still
            # waiting for a verdict, so a local limit here would refuse too early).
            cap = self.budget.connections
        if self.open >= cap:
            by_fds = controlled or cap < cfg.max_connections
            self.refuse("fds" if by_fds else "max_connections", "max_connections",
                        "connection limit reached; new connection closed", (source, 0),
                        listener=listener, maximum=cap,
                        reason="open-file limit" if by_fds else "max_connections")
            return False
        held = self.by_source.get(source, 0)
        if held >= cfg.max_connections_per_source and not controlled:
            self.refuse("max_connections_per_source", "max_connections_per_source",
                        "per-source connection limit reached; new connection closed",
                        (source, 0), listener=listener, maximum=cfg.max_connections_per_source)
            return False
        self.by_source[source] = held + 1
        self.open += 1
        return True

    def release(self, source: str) -> None:
        self._release_here(source)
        if self.control is not None:
            self.control.release(source)

    def _release_here(self, source: str) -> None:
        self.open -= 1
        left = self.by_source.get(source, 1) - 1
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)
        self._released.set()

    def refuse(self, limit_name: str | None, key: str, msg: str, peer: tuple[str, int],
               **fields: object) -> None:
        if limit_name is not None:
            self.metrics.limits_hit.labels(limit_name).inc()
        self.ratelog(logging.WARNING, key, msg, client=f"{peer[0]}:{peer[1]}", **fields)

    # ------------------------------------------------------------------ accepting

    async def serve(self, listeners: list[trio.SocketListener], name: str, handler: Handler,
                    nursery: trio.Nursery) -> None:
        """Accept on every listener until cancelled; admitted connections run ``handler``,
        which closes each and calls ``release`` for it when it ends."""
        async with trio.open_nursery() as loops:
            for listener in listeners:
                loops.start_soon(self._accept_loop, listener, name, handler, nursery)

    async def _accept_loop(self, listener: trio.SocketListener, name: str, handler: Handler,
                           nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                await self._out_of_descriptors(exc, name)
                continue
            if already_gone(stream):
                # Closed or reset by the client before it sent a byte (a port scan, a
                # health check, churn): it needs no session and no upstream connection.
                stream.socket.close()
                continue
            peer = peer_of(stream)
            if not self.admit(peer[0], name):
                stream.socket.close()  # refused at accept: nothing was started for it
                continue
            try:
                # A task name given, not made: trio would format a new string per task.
                nursery.start_soon(self._run, stream, peer, name, handler,
                                   name=Admission._run.__qualname__)
            except BaseException:  # a nursery closing under us: the count must not leak
                self._release_here(peer[0])  # the supervisor was not asked yet
                stream.socket.close()
                raise

    async def _run(self, stream: trio.SocketStream, peer: tuple[str, int], name: str,
                   handler: Handler) -> None:
        # The handler owns the connection from its first step: it closes it and calls
        # ``release`` once, when the connection ends (for a parked session, long after
        # the handler returned).
        if self.control is not None:
            try:
                admitted = await self._admit_globally(peer, name)
            except BaseException:
                self._release_here(peer[0])
                stream.socket.close()
                raise
            if not admitted:
                self._release_here(peer[0])
                stream.socket.close()
                return
        try:
            await handler(stream, peer, name)
        except Exception:  # a bug in one connection must not take the listener down
            self.metrics.internal_errors.inc()
            log.exception("internal error serving a connection; closed",
                          extra={"fields": {"listener": name,
                                            "client": f"{peer[0]}:{peer[1]}"}})

    async def _admit_globally(self, peer: tuple[str, int], name: str) -> bool:
        """The supervisor's verdict on a connection counted here already; on no answer,
        this worker's share of each limit decides."""
        assert self.control is not None
        cfg = self.config
        verdict = await self.control.ask(peer[0], cfg.max_connections,
                                         cfg.max_connections_per_source)
        if verdict == "admitted":
            return True
        if verdict == UNANSWERED:
            share = self.control.share(cfg.max_connections)
            per_source = self.control.share(cfg.max_connections_per_source)
            # The local counts include this connection already.
            if self.open <= share and self.by_source.get(peer[0], 0) <= per_source:
                self.control.admitted_alone(peer[0])
                return True
            verdict = ("max_connections" if self.open > share
                       else "max_connections_per_source")
        if verdict == "max_connections":
            self.refuse("max_connections", "max_connections", "connection limit reached "
                        "(all workers); new connection closed", peer, listener=name,
                        maximum=cfg.max_connections)
        else:
            self.refuse("max_connections_per_source", "max_connections_per_source",
                        "per-source connection limit reached (all workers); new "
                        "connection closed", (peer[0], 0), listener=name,
                        maximum=cfg.max_connections_per_source)
        return False

    async def _out_of_descriptors(self, exc: OSError, name: str) -> None:
        """EMFILE despite the budget: count it, say so once in a while, wait for a close."""
        self.metrics.limits_hit.labels("fds").inc()
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.ratelog(logging.WARNING, "accept-fds", f"out of file descriptors at accept "
                         f"({code}); connections wait in the listen backlog until one closes",
                         listener=name, open_connections=self.open)
        self._released = trio.Event()
        with trio.move_on_after(ACCEPT_BACKOFF):
            await self._released.wait()
