"""``kproxy run --workers N``: N proxy processes on the same ports, one supervisor.

One kproxy process uses one core. The supervisor starts N workers — each a plain
``kproxy run`` with the same configuration, ``--reuse-port on`` and an HTTP port of
its own on loopback — so the kernel spreads client connections over them
(SO_REUSEPORT). It restarts a worker that dies (with a growing pause if it keeps
dying), passes SIGHUP on to every worker (each reloads), and on SIGTERM/SIGINT asks
every worker to drain and waits for them. It serves the configured HTTP address
itself: ``/metrics`` is every worker's exposition combined into one, with their
facts (``/internal/facts``: groups, telemetry instances) merged into one group model
and one series per client instance (``kproxy.metrics.worker_merge``), ``/readyz``
is ready while any worker is ready (a dead worker's listener is closed, so no
connection reaches it), and ``/admin/rebootstrap`` is passed to every worker.

Nothing is shared between workers but the ports: a client connection and its
upstream connection live in one worker, telemetry rate limits are per connection
as a broker's are per broker, and subscription ids are a function of the
subscription and the instance id, so any worker answers a client the same way.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import trio

from kproxy.config.settings import Config
from kproxy.embedded_broker import free_port
from kproxy.http.server import Handler, HttpRequest, HttpResponse, HttpServer
from kproxy.metrics.worker_merge import WorkerMerge
from kproxy.policies.groups import GroupLimits

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


@dataclass
class Worker:
    index: int
    http_port: int
    process: trio.Process | None = None
    started: float = 0.0
    restarts: int = 0


class Supervisor:
    def __init__(self, cfg: Config, run_argv: list[str], count: int) -> None:
        self.cfg = cfg
        self.run_argv = run_argv  # the arguments given to `kproxy run`
        self.workers = [Worker(i, free_port()) for i in range(count)]
        self.stopping = False
        self.exit_code = 0
        self._stop = trio.Event()
        self._limiter = trio.CapacityLimiter(max(4, count))
        self.merger = WorkerMerge(GroupLimits(cfg.group_max_groups, cfg.group_max_members))

    def command(self, worker: Worker) -> list[str]:
        # Later flags win: every worker is one process, on shared ports, its own HTTP.
        return [sys.executable, "-m", "kproxy.cli", "run", *self.run_argv,
                "--workers", "1", "--reuse-port", "on",
                "--http", f"127.0.0.1:{worker.http_port}"]

    async def run(self) -> int:
        log.info("starting workers", extra={"fields": {
            "workers": len(self.workers), "http": f"{self.cfg.http[0]}:{self.cfg.http[1]}"}})
        async with trio.open_nursery() as nursery:
            http = await trio.open_tcp_listeners(self.cfg.http[1], host=self.cfg.http[0])
            nursery.start_soon(trio.serve_listeners, HttpServer(self.routes()).handle, http)
            for worker in self.workers:
                nursery.start_soon(self._keep_running, worker)
            async with trio.open_nursery() as waiting:
                waiting.start_soon(self._signals)
                await self._stop.wait()
                waiting.cancel_scope.cancel()
            await self._stop_all()
            nursery.cancel_scope.cancel()
        log.info("workers stopped")
        return self.exit_code

    async def _keep_running(self, worker: Worker) -> None:
        pause = RESTART_PAUSE
        while not self.stopping:
            worker.started = time.monotonic()
            worker.process = await trio.lowlevel.open_process(self.command(worker))
            code = await worker.process.wait()
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
                self._stop.set()
                return

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

    # ------------------------------------------------------------------ http

    async def _ask(self, worker: Worker, path: str, method: str = "GET") -> tuple[int, bytes]:
        def fetch() -> tuple[int, bytes]:
            req = urllib.request.Request(f"http://127.0.0.1:{worker.http_port}{path}",
                                         method=method, data=b"" if method == "POST" else None)
            try:
                with urllib.request.urlopen(req, timeout=SCRAPE_TIMEOUT) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()
            except OSError as exc:
                return 0, str(exc).encode()

        return await trio.to_thread.run_sync(fetch, limiter=self._limiter)

    async def _ask_all(self, path: str, method: str = "GET") -> list[tuple[int, bytes]]:
        answers: list[tuple[int, bytes]] = [(0, b"")] * len(self.workers)

        async def one(i: int) -> None:
            answers[i] = await self._ask(self.workers[i], path, method)

        async with trio.open_nursery() as nursery:
            for i in range(len(self.workers)):
                nursery.start_soon(one, i)
        return answers

    def routes(self) -> dict[str, Handler]:
        async def healthz(req: HttpRequest) -> HttpResponse:
            alive = len(self._live())
            return HttpResponse(200 if alive else 503,
                                f"{alive}/{len(self.workers)} workers alive\n".encode())

        async def readyz(req: HttpRequest) -> HttpResponse:
            answers = await self._ask_all("/readyz")
            ready = sum(status == 200 for status, _ in answers)
            lines = "".join(f"worker {i}: {body.decode(errors='replace').strip() or status}\n"
                            for i, (status, body) in enumerate(answers))
            return HttpResponse(200 if ready else 503,
                                f"{ready}/{len(answers)} workers ready\n{lines}".encode())

        async def metrics(req: HttpRequest) -> HttpResponse:
            answers = await self._ask_all("/metrics")
            facts = await self._ask_all("/internal/facts")
            texts = [body.decode("utf-8", "replace") if status == 200 else None
                     for status, body in answers]
            own = self._own_metrics(scraped=sum(t is not None for t in texts))
            epochs = [w.restarts for w in self.workers]
            body = await trio.to_thread.run_sync(lambda: self.merger.merge(
                texts, [_json(b) if s == 200 else None for s, b in facts], epochs, own,
                time.monotonic()).encode())
            headers = []
            if "gzip" in req.headers.get("accept-encoding", ""):
                body = await trio.to_thread.run_sync(gzip.compress, body)
                headers.append(("content-encoding", "gzip"))
            return HttpResponse(200, body, "text/plain; version=0.0.4; charset=utf-8",
                                headers)

        async def rebootstrap(req: HttpRequest) -> HttpResponse:
            if req.method != "POST":
                return HttpResponse(405, b"use POST\n", headers=[("allow", "POST")])
            answers = await self._ask_all("/admin/rebootstrap", "POST")
            status = max((s for s, _ in answers if s != 200), default=200)
            return HttpResponse(status, b"".join(body for _, body in answers))

        return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics,
                "/admin/rebootstrap": rebootstrap}

    def _own_metrics(self, scraped: int) -> str:
        restarts = sum(w.restarts for w in self.workers)
        return ("# HELP kproxy_workers Worker processes configured\n"
                "# TYPE kproxy_workers gauge\n"
                f"kproxy_workers {len(self.workers)}\n"
                "# HELP kproxy_workers_alive Worker processes running now\n"
                "# TYPE kproxy_workers_alive gauge\n"
                f"kproxy_workers_alive {len(self._live())}\n"
                "# HELP kproxy_workers_scraped Workers whose /metrics are in this scrape\n"
                "# TYPE kproxy_workers_scraped gauge\n"
                f"kproxy_workers_scraped {scraped}\n"
                "# HELP kproxy_worker_restarts Workers restarted after they exited\n"
                "# TYPE kproxy_worker_restarts counter\n"
                f"kproxy_worker_restarts_total {restarts}\n")


def _json(body: bytes) -> dict[str, object] | None:
    try:
        found = json.loads(body)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def supervise(cfg: Config, run_argv: list[str], count: int) -> int:
    return trio.run(Supervisor(cfg, run_argv, count).run)
