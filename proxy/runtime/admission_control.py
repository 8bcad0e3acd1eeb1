"""Worker side of global admission: ask the supervisor before serving a connection.

A worker under ``kproxy run --workers N`` gets one end of a Unix socket pair from the
supervisor (``kproxy.supervisor.admission_hub`` has the protocol). For each accepted
connection it sends ADMIT and waits for the verdict; when the connection closes it
sends RELEASE. Requests are multiplexed by id, so many connections wait at once and
the accept loop never waits on the supervisor.

Cancellation never leaks a count: a request given up (the connection's task
cancelled, or no answer in ``ANSWER_TIMEOUT``) stays known by its id, and an
"admitted" that arrives for it later is released at once.

When the supervisor does not answer in time, or the channel is gone, the worker
admits on its own within its share of each limit (the limit divided by the number
of workers, rounded up), so the sum over workers stays within the limit plus
(workers - 1). Connections admitted that way are never counted by the supervisor,
and their release is not sent to it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections import deque
from dataclasses import dataclass

import trio
from prometheus_client import Counter, Histogram

from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.supervisor.admission_hub import (
    ADMIT,
    ADMITTED,
    ANSWER,
    HELLO,
    MAX_MESSAGE,
    OP_ADMIT,
    OP_HELLO,
    OP_RELEASE,
    REASONS,
    U32_MAX,
    source_key,
)

log = logging.getLogger("kproxy")
ANSWER_TIMEOUT = 2.0  # longest a connection waits for the supervisor's verdict
MAX_PENDING = 4096  # verdicts awaited at once; past it, the share decides at once
UNANSWERED = "unanswered"


@dataclass
class _Pending:
    source: bytes
    done: trio.Event
    verdict: int | None = None
    abandoned: bool = False  # the asker left: a late "admitted" is released


class AdmissionControl:
    """One worker's channel to the supervisor's global count."""

    def __init__(self, sock: socket.socket, workers: int, metrics: ProxyMetrics) -> None:
        self.sock = trio.socket.from_stdlib_socket(sock)
        self.workers = max(1, workers)
        self.connected = True
        self._next = 0
        self._pending: dict[int, _Pending] = {}
        self._outbox: deque[bytes] = deque()
        self._wake = trio.Event()
        # Sources admitted by this worker's share alone: their releases stay here.
        self.unreported: dict[str, int] = {}
        self.fallbacks = Counter(
            "kproxy_admission_fallbacks", "Connections admitted by this worker's share of "
            "the limits because the supervisor did not answer in time",
            registry=metrics.registry)
        self.wait = Histogram(
            "kproxy_admission_wait_seconds", "Time a new connection waited for the "
            "supervisor's admission verdict", registry=metrics.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 2.5))

    @classmethod
    def from_fd(cls, fd: int, workers: int, metrics: ProxyMetrics) -> AdmissionControl:
        return cls(socket.socket(fileno=fd), workers, metrics)

    def _send(self, message: bytes) -> None:
        if self.connected:
            self._outbox.append(message)
            self._wake.set()

    # ------------------------------------------------------------------ asking

    async def ask(self, source: str, max_connections: int, max_per_source: int) -> str:
        """"admitted", the limit that refuses, or ``UNANSWERED`` (the share decides)."""
        if not self.connected or len(self._pending) >= MAX_PENDING:
            return UNANSWERED
        self._next = request = (self._next + 1) & U32_MAX
        key = source_key(source)
        pending = self._pending[request] = _Pending(key, trio.Event())
        self._send(ADMIT.pack(OP_ADMIT, request, min(max_connections, U32_MAX),
                              min(max_per_source, U32_MAX)) + key)
        started = trio.current_time()
        try:
            with trio.move_on_after(ANSWER_TIMEOUT):
                await pending.done.wait()
        except BaseException:
            self._give_up(request, pending)
            raise
        self.wait.observe(trio.current_time() - started)
        if pending.verdict is None:
            self._give_up(request, pending)
            return UNANSWERED
        return "admitted" if pending.verdict == ADMITTED else REASONS.get(
            pending.verdict, "max_connections")

    def _give_up(self, request: int, pending: _Pending) -> None:
        if pending.verdict is None and self.connected:
            pending.abandoned = True  # its answer, when it comes, is undone
        else:
            self._pending.pop(request, None)
            if pending.verdict == ADMITTED:
                self._send(bytes([OP_RELEASE]) + pending.source)

    def share(self, limit: int) -> int:
        """This worker's part of a limit when it must decide alone."""
        return math.ceil(limit / self.workers)

    def admitted_alone(self, source: str) -> None:
        self.unreported[source] = self.unreported.get(source, 0) + 1
        self.fallbacks.inc()

    def release(self, source: str) -> None:
        alone = self.unreported.get(source, 0)
        if alone > 0:
            if alone == 1:
                del self.unreported[source]
            else:
                self.unreported[source] = alone - 1
            return
        self._send(bytes([OP_RELEASE]) + source_key(source))

    # ------------------------------------------------------------------ the channel

    async def run(self, fits: int) -> None:
        """Say hello (pid, connections this worker's descriptors hold), then carry
        requests out and verdicts in until the channel closes."""
        self._outbox.appendleft(HELLO.pack(OP_HELLO, os.getpid(), min(fits, U32_MAX)))
        self._wake.set()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, nursery.cancel_scope)
                await self._read()
                nursery.cancel_scope.cancel()
        finally:
            self._disconnect()

    async def _write(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                while self._outbox:
                    await self.sock.send(self._outbox.popleft())
                self._wake = trio.Event()
                await self._wake.wait()
        except OSError as exc:
            log.warning("admission channel to the supervisor failed", extra={
                "fields": {"error": str(exc)}})
            scope.cancel()

    async def _read(self) -> None:
        while True:
            try:
                message = await self.sock.recv(MAX_MESSAGE)
            except OSError as exc:
                log.warning("admission channel to the supervisor failed", extra={
                    "fields": {"error": str(exc)}})
                return
            if not message:
                return
            if len(message) < ANSWER.size:
                continue
            request, verdict = ANSWER.unpack_from(message)
            pending = self._pending.pop(request, None)
            if pending is None:
                continue
            if pending.abandoned:
                if verdict == ADMITTED:
                    self._send(bytes([OP_RELEASE]) + pending.source)
                continue
            pending.verdict = verdict
            pending.done.set()

    def _disconnect(self) -> None:
        if not self.connected:
            return
        self.connected = False
        self._outbox.clear()
        log.warning("admission channel to the supervisor closed; this worker now admits "
                    "within its share of each limit", extra={"fields": {
                        "workers": self.workers}})
        for pending in self._pending.values():
            pending.done.set()  # no verdict: the share decides
        self._pending.clear()
