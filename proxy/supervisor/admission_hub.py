"""Supervisor side of global admission: one count of open connections for all workers.

With ``--workers N`` every worker accepts on its own SO_REUSEPORT listeners, so a
count kept in each worker would let N times the configured limit in. Instead each
worker asks the supervisor before it serves a connection, over a Unix socket pair
the supervisor made for it (``SOCK_SEQPACKET``: one message per send, no framing),
and tells it when the connection closes. The supervisor holds the only count of
open connections, in all and per source address, so ``max_connections`` and
``max_connections_per_source`` hold exactly across workers.

What each worker holds is kept in its ``Ledger``; when its channel or its process
ends (a crash, SIGKILL), every count it held is given back at once: the kernel
closed its connections with it.

The messages (network byte order; a source address is at most 64 bytes):

- worker → supervisor ``HELLO``: op 3, pid (u32), connections its descriptors hold (u32)
- worker → supervisor ``ADMIT``: op 1, request id (u32), its ``max_connections``
  and ``max_connections_per_source`` (u32 each, so a reload applies), source address
- worker → supervisor ``RELEASE``: op 2, source address
- supervisor → worker answer: request id (u32), verdict (u8: 0 admitted,
  1 ``max_connections``, 2 ``max_connections_per_source``)
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("kproxy.workers")

OP_ADMIT, OP_RELEASE, OP_HELLO = 1, 2, 3
ADMITTED, REFUSED_MAX, REFUSED_SOURCE = 0, 1, 2
REASONS = {REFUSED_MAX: "max_connections", REFUSED_SOURCE: "max_connections_per_source"}
MAX_SOURCE_BYTES = 64
MAX_MESSAGE = 1 + 12 + MAX_SOURCE_BYTES  # the longest message either side sends
ADMIT = struct.Struct("!BIII")
HELLO = struct.Struct("!BII")
ANSWER = struct.Struct("!IB")
U32_MAX = 0xFFFFFFFF
CONTROL_FD_FLAG = "--control-fd"
WORKER_COUNT_FLAG = "--control-workers"


def source_key(source: str) -> bytes:
    """The bytes that stand for a source address on the channel (bounded)."""
    return source.encode("utf-8", "replace")[:MAX_SOURCE_BYTES]


@dataclass
class Ledger:
    """What one worker process holds: its share of the global count."""

    index: int
    pid: int
    fd_connections: int | None = None  # from its HELLO: what its descriptors hold
    open: int = 0
    by_source: dict[bytes, int] = field(default_factory=dict)


@dataclass
class WorkerHistory:
    """What outlives a worker process, for the status page."""

    given_back: int = 0  # counts returned when its last process ended
    given_back_total: int = 0


class AdmissionHub:
    """The global count. The counting methods do no I/O (unit-tested without sockets)."""

    def __init__(self, max_connections: int, max_per_source: int) -> None:
        self.max_connections = max_connections  # as the workers last said (reload)
        self.max_per_source = max_per_source
        self.open = 0
        self.by_source: dict[bytes, int] = {}  # only sources with open connections
        self.ledgers: dict[int, Ledger] = {}  # by worker index: its current process
        self.history: dict[int, WorkerHistory] = {}
        self.refused = {"max_connections": 0, "max_connections_per_source": 0}
        self.admitted_total = 0

    # ------------------------------------------------------------------ counting

    def admit(self, ledger: Ledger, source: bytes, max_connections: int | None = None,
              max_per_source: int | None = None) -> int:
        """Count one connection in for ``ledger``'s worker, or say which limit refuses it."""
        if max_connections is not None:
            self.max_connections = max_connections
        if max_per_source is not None:
            self.max_per_source = max_per_source
        if self.open >= self.max_connections:
            self.refused["max_connections"] += 1
            return REFUSED_MAX
        held = self.by_source.get(source, 0)
        if held >= self.max_per_source:
            self.refused["max_connections_per_source"] += 1
            return REFUSED_SOURCE
        self.by_source[source] = held + 1
        ledger.by_source[source] = ledger.by_source.get(source, 0) + 1
        self.open += 1
        ledger.open += 1
        self.admitted_total += 1
        return ADMITTED

    def release(self, ledger: Ledger, source: bytes) -> None:
        """One of ``ledger``'s connections closed; a source it does not hold is ignored."""
        mine = ledger.by_source.get(source, 0)
        if mine <= 0:
            return
        self._drop(ledger, source, 1)

    def give_back(self, ledger: Ledger) -> int:
        """The worker is gone: every count it held returns. How many did."""
        returned = ledger.open
        for source, count in list(ledger.by_source.items()):
            self._drop(ledger, source, count)
        if self.ledgers.get(ledger.index) is ledger:
            del self.ledgers[ledger.index]
        history = self.history.setdefault(ledger.index, WorkerHistory())
        history.given_back = returned
        history.given_back_total += returned
        return returned

    def _drop(self, ledger: Ledger, source: bytes, count: int) -> None:
        left = ledger.by_source[source] - count
        if left > 0:
            ledger.by_source[source] = left
        else:
            del ledger.by_source[source]
        ledger.open -= count
        self.open -= count
        total = self.by_source.get(source, 0) - count
        if total > 0:
            self.by_source[source] = total
        else:
            self.by_source.pop(source, None)

    def handle(self, ledger: Ledger, message: bytes) -> bytes | None:
        """One message from a worker; the answer to send back, if any."""
        op = message[0] if message else 0
        if op == OP_ADMIT and len(message) >= ADMIT.size:
            _, request, max_connections, max_per_source = ADMIT.unpack_from(message)
            verdict = self.admit(ledger, message[ADMIT.size:][:MAX_SOURCE_BYTES],
                                 max_connections, max_per_source)
            return ANSWER.pack(request, verdict)
        if op == OP_RELEASE:
            self.release(ledger, message[1:][:MAX_SOURCE_BYTES])
        elif op == OP_HELLO and len(message) >= HELLO.size:
            _, _pid, fits = HELLO.unpack_from(message)
            ledger.fd_connections = fits
        else:
            log.warning("admission channel: message not understood; ignored",
                        extra={"fields": {"worker": ledger.index, "bytes": len(message)}})
        return None

    # ------------------------------------------------------------------ reporting

    def effective_max(self) -> int:
        """max_connections, or fewer when the live workers' descriptors hold fewer. A
        worker that has not said hello yet holds no connection and adds nothing."""
        fits = [ledger.fd_connections for ledger in self.ledgers.values()
                if ledger.fd_connections is not None]
        if not fits:
            return self.max_connections
        return min(self.max_connections, sum(fits))

    def limit_rows(self) -> list[dict[str, Any]]:
        """The global connection limits, shaped as the status page's ``limits`` rows
        (``hits``: refusals the supervisor made; descriptor refusals are each worker's)."""
        busiest = max(self.by_source.values(), default=0)
        effective = self.effective_max()
        return [
            {"limit": "max_connections", "value": effective, "in_use": self.open,
             "hits": self.refused["max_connections"], "hit_now": self.open >= effective},
            {"limit": "max_connections_per_source", "value": self.max_per_source,
             "in_use": busiest, "hits": self.refused["max_connections_per_source"],
             "hit_now": busiest >= self.max_per_source},
        ]

    def worker_rows(self, workers: list[tuple[int, int | None, int, bool]],
                    ) -> list[dict[str, Any]]:
        """One row per worker from (index, pid, restarts, alive): what it holds now."""
        rows = []
        for index, pid, restarts, alive in workers:
            ledger = self.ledgers.get(index)
            history = self.history.get(index, WorkerHistory())
            rows.append({"worker": index, "pid": pid, "alive": alive, "restarts": restarts,
                         "connections": ledger.open if ledger else 0,
                         "fd_connections": ledger.fd_connections if ledger else None,
                         "given_back_at_last_exit": history.given_back,
                         "given_back_total": history.given_back_total})
        return rows

    def families(self) -> Iterator[Metric]:
        """The supervisor's own admission families, for its merged /metrics.

        ``kproxy_max_connections_effective`` is merged by the highest value: every
        worker's own figure (its descriptors alone) is at most this global one."""
        given_back = sum(h.given_back_total for h in self.history.values())
        yield GaugeMetricFamily(
            "kproxy_max_connections_effective", "Client connections admitted at most: "
            "max_connections, or fewer when the open-file limit cannot hold that many (two "
            "descriptors per proxied connection)", value=self.effective_max())
        yield GaugeMetricFamily(
            "kproxy_admission_global_connections", "Client connections the supervisor "
            "counts open in all workers", value=self.open)
        yield CounterMetricFamily(
            "kproxy_admission_given_back", "Connection counts given back when a worker "
            "process ended", value=given_back)

    # ------------------------------------------------------------------ channels

    async def attend(self, index: int, process: trio.Process, channel: socket.socket) -> int:
        """Serve a worker's channel while its process runs; its exit code. When it ends,
        every count it held is given back."""
        ledger = self.ledgers[index] = Ledger(index, process.pid)
        sock = trio.socket.from_stdlib_socket(channel)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve, ledger, sock)
                code = await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            sock.close()
            returned = self.give_back(ledger)
            if returned:
                log.warning("worker ended; its connection counts given back", extra={
                    "fields": {"worker": index, "pid": ledger.pid, "given_back": returned}})
        return code

    async def _serve(self, ledger: Ledger, sock: trio.socket.SocketType) -> None:
        try:
            while True:
                message = await sock.recv(MAX_MESSAGE)
                if not message:
                    return  # the worker closed it (or died): counts returned at its exit
                answer = self.handle(ledger, message)
                if answer is not None:
                    await sock.send(answer)
        except OSError as exc:
            log.warning("admission channel to a worker failed", extra={"fields": {
                "worker": ledger.index, "error": str(exc)}})


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(the supervisor's end, the worker's end, inheritable for ``pass_fds``)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return mine, theirs


def worker_flags(fd: int, workers: int) -> list[str]:
    """The hidden ``kproxy run`` flags that hand a worker its end of the channel."""
    return [CONTROL_FD_FLAG, str(fd), WORKER_COUNT_FLAG, str(workers)]
