"""``kproxy run --workers N``: N proxy processes on the same ports, one supervisor.

One kproxy process uses one core. The supervisor starts N workers — each a plain
``kproxy run`` with the same configuration, ``--reuse-port on`` and an HTTP listener of
its own on loopback, opened by the supervisor and handed down — so the kernel spreads
client connections over them (SO_REUSEPORT). It restarts a worker that dies (with a
growing pause if it keeps dying), passes SIGHUP on to every worker (each reloads), and
on SIGTERM/SIGINT asks every worker to drain and waits for them; a second SIGTERM/SIGINT
kills them (stop now). Workers run in their own session
(``kproxy.supervisor.worker_link``), so a signal to the supervisor's process group reaches
them once, through the supervisor. It serves the configured HTTP address itself
(``kproxy.supervisor.http``): ``/metrics`` is every worker's exposition combined
into one, with their facts (``/internal/facts``: groups, telemetry instances) merged
into one group model and one series per client instance
(``kproxy.metrics.worker_merge``); ``/`` and ``/status.json`` every worker's status
merged; ``/readyz`` is ready while any worker is ready (a dead worker's listener is
closed, so no connection reaches it); and ``/admin/rebootstrap`` is passed to every
worker.

Besides the ports, the workers share one thing: the connection counts, kept by the
supervisor (``kproxy.supervisor.admission_hub``; each worker asks over its own socket
pair before it serves a connection). A client connection and its upstream connection
live in one worker, telemetry rate limits are per connection as a broker's are per
broker, and subscription ids are a function of the subscription and the instance id,
so any worker answers a client the same way.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass

import trio

from kproxy.auth.admin_token import AdminToken
from kproxy.auth.audit import open_audit
from kproxy.config.settings import Config
from kproxy.http.auth import guard
from kproxy.http.history import History
from kproxy.http.server import Handler, HttpRequest, HttpResponse, HttpServer
from kproxy.metrics.worker_merge import WorkerMerge
from kproxy.policies.groups import GroupLimits
from kproxy.supervisor import http as supervisor_http
from kproxy.supervisor import worker_link
from kproxy.supervisor.admission_hub import AdmissionHub, channel_pair, worker_flags

log = logging.getLogger("kproxy.workers")
RESTART_PAUSE = 1.0  # first pause before restarting a worker that died
RESTART_PAUSE_MAX = 30.0
HEALTHY_AFTER = 60.0  # a worker up this long resets its pause
FAILED_START = 10.0  # a worker that exits this soon after its first start: give up
START_ERRORS = (1, 2)  # `kproxy run`: 2 a bad configuration, 1 a port it cannot bind
SCRAPE_TIMEOUT = 10.0


def usable_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota (a
    Kubernetes CPU limit), rounded up. A pod limited to 1.5 CPUs gets 2 workers."""
    count = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def worker_count(cfg: Config) -> int:
    return cfg.workers or usable_cpus()


HTTP_FD_FLAG = "--http-fd"


def worker_http_socket() -> socket.socket:
    """A worker's HTTP listener, opened by the supervisor and handed down: a port picked
    here and bound by the worker later could be taken in between (the worker then failed
    to start), and the same socket serves every restart of that worker."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@dataclass
class Worker:
    index: int
    http: socket.socket  # listening, on loopback; the worker accepts on it
    process: trio.Process | None = None
    started: float = 0.0
    restarts: int = 0

    @property
    def http_port(self) -> int:
        return int(self.http.getsockname()[1])

    @property
    def running(self) -> bool:
        """Started and not exited (``returncode`` polls the process)."""
        return self.process is not None and self.process.returncode is None


class Supervisor:
    def __init__(self, cfg: Config, run_argv: list[str], count: int) -> None:
        self.cfg = cfg
        self.run_argv = run_argv  # the arguments given to `kproxy run`
        self.workers = [Worker(i, worker_http_socket()) for i in range(count)]
        self.stopping = False
        self.exit_code = 0
        self._stop = trio.Event()
        self._limiter = trio.CapacityLimiter(max(4, count))
        self.merger = WorkerMerge(GroupLimits(cfg.group_max_groups, cfg.group_max_members))
        self.history = History()  # the whole proxy's last 15 minutes, for the status page
        # The one count of open connections across workers (kproxy.supervisor.admission_hub).
        self.hub = AdmissionHub(cfg.max_connections, cfg.max_connections_per_source)
        # Admin calls made here are audited here; the workers log their own logins.
        self.audit = open_audit(cfg.audit_log, cfg.audit_log_max_bytes, cfg.audit_log_backups,
                                "supervisor")
        self.admin_token = AdminToken(cfg.admin_token_file, cfg.identity.admin_token,
                                      self.audit.record if self.audit is not None else None)
        self.secret = secrets.token_urlsafe(32)  # its calls to the workers (worker_link)

    def stop(self) -> None:
        """As SIGTERM does: every worker drains, then ``run`` returns."""
        self._stop.set()

    def command(self, worker: Worker) -> list[str]:
        # Later flags win: every worker is one process, on shared ports, its own HTTP.
        return [sys.executable, "-m", "kproxy.cli", "run", *self.run_argv,
                "--workers", "1", "--reuse-port", "on",
                "--http", f"127.0.0.1:{worker.http_port}",
                HTTP_FD_FLAG, str(worker.http.fileno())]

    async def run(self) -> int:
        log.info("starting workers", extra={"fields": {
            "workers": len(self.workers), "http": f"{self.cfg.http[0]}:{self.cfg.http[1]}"}})
        async with trio.open_nursery() as nursery:
            http = await trio.open_tcp_listeners(self.cfg.http[1], host=self.cfg.http[0])
            routes = guard(self.routes(), self.admin_token.current, self.cfg.status_auth,
                           self.audit.record if self.audit is not None else None)
            nursery.start_soon(trio.serve_listeners, HttpServer(routes).handle, http)
            nursery.start_soon(self.admin_token.watch)
            for worker in self.workers:
                nursery.start_soon(self._keep_running, worker)
            nursery.start_soon(self._signals)
            nursery.start_soon(supervisor_http.record_history, self)
            await self._stop.wait()
            await self._stop_all()
            nursery.cancel_scope.cancel()
        log.info("workers stopped")
        return self.exit_code

    async def _keep_running(self, worker: Worker) -> None:
        pause = RESTART_PAUSE
        while not self.stopping:
            worker.started = time.monotonic()
            mine, theirs = channel_pair()  # the worker's admission channel
            with theirs:
                worker.process = await trio.lowlevel.open_process(
                    [*self.command(worker), *worker_flags(theirs.fileno(), len(self.workers))],
                    pass_fds=(theirs.fileno(), worker.http.fileno()), start_new_session=True,
                    env=worker_link.worker_env(self.secret))
            code = await self.hub.attend(worker.index, worker.process, mine)
            if self.stopping:
                return
            if (code in START_ERRORS and not worker.restarts
                    and time.monotonic() - worker.started < FAILED_START):
                # It never got going (a port in use, a file it cannot read): restarting
                # would fail the same way, so the whole proxy stops and says so.
                log.error("worker failed at start; stopping", extra={"fields": {
                    "worker": worker.index, "exit_code": code}})
                self.exit_code = code or 1
                self._stop.set()
                return
            if time.monotonic() - worker.started > HEALTHY_AFTER:
                pause = RESTART_PAUSE
            worker.restarts += 1
            log.error("worker exited; restarting it", extra={"fields": {
                "worker": worker.index, "exit_code": code, "restart_in_s": pause}})
            await trio.sleep(pause)
            pause = min(pause * 2, RESTART_PAUSE_MAX)

    def _live(self) -> list[trio.Process]:
        return [w.process for w in self.workers
                if w.process is not None and w.process.returncode is None]

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    for proc in self._live():
                        proc.send_signal(signal.SIGHUP)
                    continue
                if not self._stop.is_set():
                    self._stop.set()  # drain: workers are in their own session (worker_link)
                    continue
                log.warning("second %s: stopping now", signal.Signals(signum).name)
                self.exit_code = 1
                for proc in self._live():
                    proc.kill()

    async def _stop_all(self) -> None:
        """Every worker drains (SIGTERM); one still running after the drain time is killed."""
        self.stopping = True
        for proc in self._live():
            proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(self.cfg.drain_timeout + 15):
            for proc in self._live():
                await proc.wait()
        for proc in self._live():
            log.warning("worker did not drain in time; killed", extra={"fields": {
                "pid": proc.pid}})
            proc.kill()

    def worker_rows(self) -> list[dict[str, object]]:
        """Per worker: pid, alive, restarts, connections it holds, counts given back."""
        return self.hub.worker_rows([
            (w.index, w.process.pid if w.process else None, w.restarts,
             w.running) for w in self.workers])

    def limit_rows(self) -> list[dict[str, object]]:
        """The global connection limits: value, use now, refusals (status "limits" rows)."""
        return self.hub.limit_rows()

    # ------------------------------------------------------------------ http

    def routes(self) -> dict[str, Handler]:
        async def healthz(req: HttpRequest) -> HttpResponse:
            alive = len(self._live())
            return HttpResponse(200 if alive else 503,
                                f"{alive}/{len(self.workers)} workers alive\n".encode())

        async def readyz(req: HttpRequest) -> HttpResponse:
            answers = await supervisor_http.ask_all(self, "/readyz")
            ready = sum(status == 200 for status, _ in answers)
            lines = "".join(f"worker {i}: {body.decode(errors='replace').strip() or status}\n"
                            for i, (status, body) in enumerate(answers))
            return HttpResponse(200 if ready else 503,
                                f"{ready}/{len(answers)} workers ready\n{lines}".encode())

        async def metrics(req: HttpRequest) -> HttpResponse:
            return await supervisor_http.metrics(self, req)

        async def rebootstrap(req: HttpRequest) -> HttpResponse:
            if req.method != "POST":
                return HttpResponse(405, b"use POST\n", headers=[("allow", "POST")])
            answers = await supervisor_http.ask_all(self, "/admin/rebootstrap", method="POST")
            status = max((s for s, _ in answers if s != 200), default=200)
            return HttpResponse(status, b"".join(body for _, body in answers))

        return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics,
                "/admin/rebootstrap": rebootstrap, **supervisor_http.status_routes(self)}


def supervise(cfg: Config, run_argv: list[str], count: int) -> int:
    return trio.run(Supervisor(cfg, run_argv, count).run)
