"""One proxy at --workers 2: one status page, /metrics as one process answers it,
reload and admin actions on every worker, and a drain whoever sends the signal.

Real tansu broker, real confluent-kafka clients, `kproxy run --workers 2`; the OTLP
collector is the named fake (tests/fake_otlp_collector.py).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from kproxy.embedded_broker import TansuBroker
from kproxy.http.status import MAX_CLIENTS, MAX_VALUES

from ..fake_otlp_collector import fake_collector
from ..support import KproxyProcess, kproxy_process, wait_until

pytestmark = pytest.mark.broker
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


def get(port: int, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {},
                                 method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def status(port: int) -> dict[str, Any]:
    return dict(json.loads(get(port, "/status.json")[2]))


def client_ids(snap: dict[str, Any]) -> set[str]:
    return {c["client_id"] for g in snap["clients"]["groups"] for c in g["clients"]}


def listed_within_bound(listed: set[str], more: int, held: set[str], every: set[str],
                        bound: int) -> bool:
    """Every one of ``held`` (what the workers list) listed; or, when the clients
    (``every``) are more than a list holds (``bound``), a full list of them and the
    rest counted as ``more`` (a client a worker counted there and another listed may
    count in both)."""
    if len(every) <= bound:
        return listed >= held
    return listed <= every and len(listed) == bound and len(listed) + more >= len(every)


def both_ready(kp: KproxyProcess) -> list[dict[str, Any]]:
    """The supervisor's worker lines, once both workers answer and are ready."""
    rows: list[dict[str, Any]] = []

    def ready() -> bool:
        rows[:] = status(kp.http_port)["workers"]
        return len(rows) == 2 and all(r["ready"] for r in rows)

    wait_until(ready, 60, "two ready workers")
    return rows


def gone(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def config(tmp_path: Path, endpoint: str = "http://127.0.0.1:9/v1/metrics",
           interval_ms: int = 500, batch_age: float = 0.5) -> Path:
    path = tmp_path / "kproxy.toml"
    path.write_text(f"[telemetry]\n[telemetry.otlp]\nendpoint = \"{endpoint}\"\n"
                    f"max_batch_age = {batch_age}\n"
                    f"[[telemetry.subscriptions]]\nname = \"all\"\nmetrics = [\"*\"]\n"
                    f"interval_ms = {interval_ms}\n")
    return path


def test_one_status_page_metrics_reload_and_admin_at_two_workers(
        backend: TansuBroker, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    cfg = config(tmp_path)
    with kproxy_process(backend.bootstrap, tmp_path, "--workers", "2", "--admin", "on",
                        "--config", str(cfg)) as kp:
        rows = both_ready(kp)
        ports = [r["http_port"] for r in rows]
        producers = []
        try:
            # Clients join until each worker holds some. The kernel picks the worker for
            # each connection, and a librdkafka producer keeps only its broker connection
            # once it has Metadata (the bootstrap one is let go), so one worker holding all
            # of six clients is 1 in 32: add them one at a time, at most sixteen.
            own: list[dict[str, Any]] = []
            for n in range(1, 17):
                p = Producer({"bootstrap.servers": kp.bootstrap, "client.id": f"st-{n}"})
                p.produce("status", b"x")
                assert p.flush(30) == 0
                producers.append(p)

                def counted(n: int = n) -> bool:  # a worker's snapshot is at most 1 s old
                    own[:] = [status(port) for port in ports]
                    return bool(sum(s["clients"]["connections"] for s in own) >= n)

                wait_until(counted, 30, f"the workers do not count {n} clients")
                if all(s["clients"]["connections"] for s in own):
                    break
            assert all(s["clients"]["connections"] for s in own), "one worker got them all"
            held = [client_ids(s) for s in own]
            assert held[0] and held[1]
            every = {f"st-{n}" for n in range(1, len(producers) + 1)}

            # Up to MAX_CLIENTS clients are listed a group (all of them share one): past
            # that, a worker that got the first ten lists ten, and so does the merge.
            def merged_matches() -> bool:
                snap = status(kp.http_port)
                more = sum(g["clients_more"] for g in snap["clients"]["groups"])
                return (listed_within_bound(client_ids(snap), more, held[0] | held[1],
                                            every, MAX_CLIENTS)
                        and snap["clients"]["connections"]
                        == sum(status(port)["clients"]["connections"] for port in ports))

            wait_until(merged_matches, 30, "the merged status lacks a worker's clients")
            snap = status(kp.http_port)
            group = next(g for g in snap["clients"]["groups"]
                         if g["software_name"] == "confluent-kafka-python")
            assert listed_within_bound(set(group["client_ids"]), group["client_ids_more"],
                                       held[0] | held[1], every, MAX_VALUES)

            def pushes_noted() -> bool:  # by each worker, where it answered the push
                return all(any(g["last_push"] is not None for g in s["clients"]["groups"])
                           for s in (status(port) for port in ports))

            wait_until(pushes_noted, 30, "a worker noted no telemetry push of its clients")
            assert any(g["last_push"] is not None
                       for g in status(kp.http_port)["clients"]["groups"])
            assert snap["backend"]["brokers"][0]["node_id"] == 111
            assert [(r["pid"], r["restarts"]) for r in snap["workers"]] == [
                (r["pid"], 0) for r in rows]
            assert all(r["connections"] for r in snap["workers"])
            limits = {row["limit"]: row for row in snap["limits"]}
            assert limits["max_connections"]["in_use"] == snap["clients"]["connections"]
            assert "otlp" in snap["telemetry"]
            code, headers, html = get(kp.http_port, "/")
            assert code == 200 and headers["content-type"].startswith("text/html")
            page = html.decode()
            assert "<h2>Workers</h2>" in page
            assert all(str(r["pid"]) in page for r in rows)
            assert all(f"<code>{cid}</code>" in page for cid in held[0] | held[1])
        finally:
            for p in producers:
                p.flush(5)

        # /metrics as one process answers it: text 0.0.4 that promtool finds clean,
        # OpenMetrics when asked, gzip when accepted.
        _, headers, text = get(kp.http_port, "/metrics")
        assert headers["content-type"].startswith("text/plain;")  # as one process says
        lint = subprocess.run(["promtool", "check", "metrics"], input=text,
                              capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
        assert b"kproxy_worker_restarts_total 0.0" in text
        _, headers, om = get(kp.http_port, "/metrics", {"accept": OPENMETRICS})
        assert headers["content-type"].startswith("application/openmetrics-text")
        assert om.endswith(b"# EOF\n") and om.count(b"# EOF") == 1
        families = {f.name: f for f in text_string_to_metric_families(  # type: ignore[no-untyped-call]
            om.decode())}
        assert families["kproxy_worker_restarts"].type == "counter"
        assert families["kproxy_workers"].samples[0].value == 2
        assert all(f.documentation for f in families.values())
        _, headers, packed = get(kp.http_port, "/metrics", {"accept-encoding": "gzip"})
        assert headers["content-encoding"] == "gzip"
        assert b"# HELP kproxy_workers_alive" in gzip.decompress(packed)
        _, headers, packed = get(kp.http_port, "/metrics",
                                 {"accept": OPENMETRICS, "accept-encoding": "gzip"})
        assert gzip.decompress(packed).endswith(b"# EOF\n")

        # /admin/rebootstrap reaches every worker: the one backend view's epoch moves.
        epochs = [status(port)["backend"]["topology_epoch"] for port in ports]
        code, _, body = get(kp.http_port, "/admin/rebootstrap", method="POST")
        assert code == 200 and body.count(b"topology epoch is now") == 2
        wait_until(lambda: all(status(port)["backend"]["topology_epoch"] > epoch
                               for port, epoch in zip(ports, epochs, strict=True)), 10,
                   "a worker's topology epoch did not move")

        # SIGHUP reloads every worker: each one's config generation shows it.
        cfg.write_text(cfg.read_text().replace("interval_ms = 500", "interval_ms = 700"))
        kp.signal(signal.SIGHUP)
        wait_until(lambda: [r["config_generation"] for r in status(kp.http_port)["workers"]]
                   == [1, 1], 30, "a worker did not reload")
        assert status(kp.http_port)["proxy"]["config_generation"] == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_to_the_whole_group_drains_and_flushes(
        backend: TansuBroker, tmp_path: Path, signum: int) -> None:
    """Ctrl-C (or an init signalling the group) reaches every process of the group;
    the proxy drains once, writes its archive, flushes its OTLP export, exits 0."""
    from confluent_kafka import Producer

    archive = tmp_path / "archive"
    with fake_collector() as fake:
        # Batches wait long for company: only the drain sends what the workers hold.
        cfg = config(tmp_path, fake.url, batch_age=300)
        with kproxy_process(backend.bootstrap, tmp_path, "--workers", "2",
                            "--config", str(cfg), "--archive", str(archive),
                            preexec=os.setsid) as kp:
            both_ready(kp)
            producer = Producer({"bootstrap.servers": kp.bootstrap, "client.id": "grp"})
            deadline = time.monotonic() + 60
            while not status(kp.http_port)["telemetry"]["otlp"]["queued_pushes"]:
                assert time.monotonic() < deadline, "no telemetry push queued"
                producer.produce("drain", b"x")
                producer.poll(0.2)
            assert producer.flush(30) == 0
            assert not fake.snapshot()  # nothing exported before the drain
            workers = [r["pid"] for r in status(kp.http_port)["workers"]]
            os.killpg(kp.process.pid, signum)
            assert kp.process.wait(60) == 0, kp.log()
            log = kp.log()
            assert log.count("kproxy stopped") == 2, log
            assert "stopping now" not in log
            assert all(gone(pid) for pid in workers)
        assert list(archive.rglob("part-*.jsonl")), "no archive file written"
        assert fake.snapshot(), "the OTLP export was not flushed on drain"


def test_workers_drain_when_the_supervisor_is_killed(backend: TansuBroker,
                                                     tmp_path: Path) -> None:
    """No orphan: a SIGKILLed supervisor cannot pass a drain on, so each worker
    notices it is gone (its own session keeps it out of the group's signals)."""
    with kproxy_process(backend.bootstrap, tmp_path, "--workers", "2") as kp:
        workers = [r["pid"] for r in both_ready(kp)]
        kp.process.kill()
        kp.process.wait(10)

        wait_until(lambda: all(gone(pid) for pid in workers), 60, "a worker outlived it")
        log = kp.log()
        assert log.count("the supervisor is gone") == 2 and log.count("kproxy stopped") == 2


def test_a_second_signal_from_the_operator_stops_at_once(backend: TansuBroker,
                                                         tmp_path: Path) -> None:
    """A drain that cannot end (a worker stopped with SIGSTOP never drains): the
    operator's second SIGTERM kills the workers and the supervisor exits 1."""
    with kproxy_process(backend.bootstrap, tmp_path, "--workers", "2") as kp:
        stuck, other = [r["pid"] for r in both_ready(kp)]
        os.kill(stuck, signal.SIGSTOP)
        try:
            kp.signal(signal.SIGTERM)
            # The first one was taken: the other worker drained and stopped.
            wait_until(lambda: "kproxy stopped" in kp.log(), 60, "no worker drained")
            assert kp.process.poll() is None  # still waiting for the stuck one
            kp.signal(signal.SIGTERM)
            assert kp.process.wait(30) == 1
            assert "stopping now" in kp.log()
            wait_until(lambda: gone(stuck) and gone(other), 10, "a worker survived")
        finally:
            if not gone(stuck):  # never leave a stopped process behind
                os.kill(stuck, signal.SIGKILL)
