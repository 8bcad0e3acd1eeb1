"""--workers 2: one consumer-group model and one telemetry series per client instance.

A real `kproxy run --workers 2` in front of a real tansu broker. The kernel spreads
connections over the workers; a test finds which worker a connection landed on by
reading each worker's own /metrics on its loopback HTTP port (the supervisor started
it with ``--http 127.0.0.1:<port>``), and opens connections, a bounded number of
times, until it has what it needs on both. The supervisor's /metrics must then show
what one process would. The OTLP collector is the named fake (no collector binary
can be installed here).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker

from ..fake_otlp_collector import fake_collector
from ..hostile_pusher import Conn
from ..support import KproxyProcess, kproxy_process, worker_pids

pytestmark = pytest.mark.broker
SAMPLE = re.compile(r"^(?P<series>[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?) (?P<value>\S+)$")


def samples(text: str, start: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m["series"].startswith(start):
            assert m["series"] not in out, f"{m['series']} appears twice"
            out[m["series"]] = float(m["value"])
    return out


def worker_ports(kp: KproxyProcess, count: int = 2) -> list[int]:
    """The workers' own HTTP ports, from their command lines (once all have started)."""
    return list(workers(kp, count))


def workers(kp: KproxyProcess, count: int = 2) -> dict[int, int]:
    """Each worker's HTTP port and pid, once all have started and are ready."""
    deadline = time.monotonic() + 60
    while True:
        pids = worker_pids(kp.process.pid)
        ports = {}
        for pid in pids:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            at = len(argv) - 1 - argv[::-1].index(b"--http")  # the last one wins
            ports[int(argv[at + 1].rsplit(b":", 1)[1])] = int(pid)
        if len(ports) == count and all(_get(p, "/readyz")[0] == 200 for p in ports):
            return ports
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return 0, ""


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60,
             show: Callable[[], object] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what} {show()}"
        time.sleep(0.2)


# ---------------------------------------------------------------- consumer groups


@contextmanager
def consumers(bootstrap: str, group: str) -> Iterator[Callable[[], Any]]:
    """Start consumers of ``group`` one at a time, each polled by its own thread."""
    from confluent_kafka import Consumer

    stop = threading.Event()
    started: list[tuple[Any, threading.Thread, threading.Event]] = []

    def poll(c: Any, mine: threading.Event) -> None:
        while not stop.is_set() and not mine.is_set():
            c.poll(0.1)
        c.close()  # a LeaveGroup

    def add() -> tuple[Any, threading.Event]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                      "auto.offset.reset": "earliest"})
        c.subscribe(["m"])
        mine = threading.Event()
        t = threading.Thread(target=poll, args=(c, mine), daemon=True)
        t.start()
        started.append((c, t, mine))
        return c, mine

    try:
        yield add
    finally:
        stop.set()
        for _, t, _ in started:
            t.join(30)


def group_view(port: int, group: str) -> tuple[float, float]:
    """(members, generation) on one /metrics; (0, -1) where the group is unknown."""
    text = _get(port, "/metrics")[1]
    members = samples(text, f'kproxy_group_members{{group="{group}"}}')
    generation = samples(text, f'kproxy_group_generation{{group="{group}"}}')
    return (sum(members.values()), max(generation.values(), default=-1))


def member_generations(ports: list[int], group: str) -> list[int]:
    """The generation each member last joined, as the worker holding it saw it."""
    found = []
    for port in ports:
        groups = json.loads(_get(port, "/internal/facts")[1]).get("groups", {})
        found += [int(m[2]) for m in groups.get(group, {}).get("members", [])]
    return found


def test_a_group_whose_members_sit_on_both_workers(tansu: TansuBroker, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic("m", num_partitions=4)])["m"].result(30)
    with kproxy_process(tansu.bootstrap, tmp_path, "--workers", "2") as kp, \
            consumers(kp.bootstrap, "split") as add:
        ports = worker_ports(kp)
        leavers = []
        # Members join until both workers hold some (each lands where the kernel puts
        # its coordinator connection, about evenly): at most 12. All on the first one's
        # worker has odds of 1 in 2,048 with 12; it had 1 in 128 with the earlier 8.
        for n in range(1, 13):
            leavers.append(add()[1])

            def joined(n: int = n) -> bool:
                return sum(group_view(p, "split")[0] for p in ports) >= n
            wait_for(f"{n} members", joined)
            if all(group_view(p, "split")[0] for p in ports):
                break
        assert all(group_view(p, "split")[0] for p in ports), "members on one worker only"

        def merged() -> tuple[float, float] | None:
            view = group_view(kp.http_port, "split")
            workers = [group_view(p, "split") for p in ports]
            newest = max(g for _, g in workers)
            # Settled: the supervisor shows every member and the newest generation, and
            # every member has joined that generation (a member leaving in the middle of
            # a round, another's join still open, left tansu waiting for it, for minutes).
            return view if view == (n, newest) and newest >= 0 and all(
                gen == newest for gen in member_generations(ports, "split")) else None

        members, generation = wait_for("the merged group", merged, show=lambda: (
            group_view(kp.http_port, "split"),
            [_get(p, "/internal/facts")[1] for p in ports]))
        assert members == n
        # One member leaves: the merged group follows, whichever worker it left through.
        leavers[0].set()
        members, generation_after = wait_for("the member gone", lambda: (
            (v := group_view(kp.http_port, "split"))[0] == n - 1
            and v[1] > generation and v), show=lambda: (
                generation, group_view(kp.http_port, "split"),
                [_get(p, "/internal/facts")[1] for p in ports]))
        seen = {gen for p in ports for gen, *_ in json.loads(
            _get(p, "/internal/facts")[1])["groups"]["split"]["completed"]}
        rebalances = samples(_get(kp.http_port, "/metrics")[1],
                             'kproxy_group_rebalances_total{group="split"}')
        # Counted once per generation (tansu's first is 0), not once per worker that saw
        # it complete: at least the generations the workers still list, at most all.
        assert len(seen) <= sum(rebalances.values()) <= generation_after + 1, (seen, rebalances)


# ---------------------------------------------------------------- telemetry


def payload(sent: int, queue: float) -> bytes:
    md = metrics_pb2.MetricsData()
    sm = md.resource_metrics.add().scope_metrics.add()
    m = sm.metrics.add(name="org.apache.kafka.producer.record.send.total")
    m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    m.sum.is_monotonic = True
    m.sum.data_points.add(as_int=sent, time_unix_nano=time.time_ns(), start_time_unix_nano=1)
    g = sm.metrics.add(name="org.apache.kafka.producer.record.queue.size")
    g.gauge.data_points.add(as_double=queue, time_unix_nano=time.time_ns())
    return md.SerializeToString()


def handled_by(ports: list[int], api: str) -> list[float]:
    """Requests of ``api`` each worker answered or relayed."""
    return [sum(samples(_get(p, "/metrics")[1], f'kproxy_requests_total{{api="{api}"').values())
            for p in ports]


def connect_to(kp: KproxyProcess, ports: list[int], worker: int) -> Conn:
    """A connection that landed on ``worker`` (ApiVersions counted there): bounded tries."""
    for _ in range(30):
        before = handled_by(ports, "ApiVersions")
        conn = Conn(kp.bootstrap_port)
        conn.request(api_keys.API_VERSIONS, {})

        def counted(before: list[float] = before) -> list[float] | None:
            a = handled_by(ports, "ApiVersions")
            return a if a != before else None
        after = wait_for("ApiVersions counted", counted, 10)
        if after[worker] > before[worker]:
            return conn
        conn.sock.close()
    raise AssertionError(f"no connection landed on worker {worker} in 30 tries")


def test_an_instance_whose_telemetry_moves_between_workers(tansu: TansuBroker,
                                                           tmp_path: Path) -> None:
    with fake_collector() as fake:
        cfg = tmp_path / "kproxy.toml"
        cfg.write_text(f'[telemetry.otlp]\nendpoint = "{fake.url}"\nmax_batch_age = 0.2\n'
                       '[[telemetry.subscriptions]]\nname = "all"\nmetrics = ["*"]\n'
                       "interval_ms = 300\n")
        with kproxy_process(tansu.bootstrap, tmp_path, "--workers", "2",
                            "--config", str(cfg)) as kp:
            ports = worker_ports(kp)
            first = connect_to(kp, ports, 0)
            got = first.request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS,
                                {"client_instance_id": uuid.UUID(int=0)})
            assert got["error_code"] == 0
            instance, sub = got["client_instance_id"], got["subscription_id"]

            def push(conn: Conn, sent: int, queue: float) -> int:
                answer = conn.request(api_keys.PUSH_TELEMETRY, {
                    "client_instance_id": instance, "subscription_id": sub,
                    "terminating": False, "compression_type": 0,
                    "metrics": payload(sent, queue)})
                return int(str(answer["error_code"]))

            assert push(first, 100, 7.0) == 0
            first.sock.close()
            # Reconnected, to the other worker, which never handed out the subscription.
            second = connect_to(kp, ports, 1)
            assert push(second, 150, 2.0) == 0
            label = f'client_instance_id="{instance}"'

            def merged() -> dict[str, float] | None:
                text = _get(kp.http_port, "/metrics")[1]
                sent = {k: v for k, v in samples(
                    text, "org_apache_kafka_producer_record_send").items() if label in k}
                queue = {k: v for k, v in samples(
                    text, "org_apache_kafka_producer_record_queue").items() if label in k}
                return {**sent, **queue} if list(sent.values()) == [150] else None

            found = wait_for("the newest push on the supervisor", merged, 30)
            # One series each (``samples`` refuses duplicates), with the newest values,
            # although worker 0 still holds the instance's older series.
            assert sorted(found.values()) == [2.0, 150.0], found
            assert any(label in line for line in _get(ports[0], "/metrics")[1].splitlines())

            # Every push exported once, whichever worker received it: wait until the
            # workers exported both, hold nothing more, and every request they sent
            # reached the collector; then count what it received.
            def settled() -> bool:
                text = _get(kp.http_port, "/metrics")[1]
                sent = samples(text, "kproxy_telemetry_export_requests_total")
                return (samples(text, 'kproxy_telemetry_export_total{outcome="exported"}')
                        == {'kproxy_telemetry_export_total{outcome="exported"}': 2.0}
                        and samples(text, "kproxy_telemetry_export_queue_bytes")
                        == {"kproxy_telemetry_export_queue_bytes": 0.0}
                        and sum(sent.values()) == len(fake.snapshot()))

            wait_for("both pushes exported", settled, 30)
            exported = [dp.as_int for r in fake.snapshot() for rm in r.request.resource_metrics
                        for sm in rm.scope_metrics for m in sm.metrics
                        if m.name.endswith("send.total") for dp in m.sum.data_points]
            assert sorted(exported) == [100, 150]

            # The worker with the newest push dies; the other still holds the older one.
            # No counter on the supervisor goes backwards, neither the client's nor the
            # proxy's own (the dead worker's share of them is carried).
            pushes = 'kproxy_telemetry_requests_total{api="PushTelemetry",error="none"}'
            assert samples(_get(kp.http_port, "/metrics")[1], pushes) == {pushes: 2.0}
            os.kill(workers(kp)[ports[1]], signal.SIGKILL)

            def replaced() -> str | None:
                text = _get(kp.http_port, "/metrics")[1]
                return text if samples(text, "kproxy_worker_restarts_total") == {
                    "kproxy_worker_restarts_total": 1.0} and samples(
                        text, "kproxy_workers_scraped") == {"kproxy_workers_scraped": 2.0} \
                    else None

            text = wait_for("the worker replaced", replaced, 60)
            sent = {k: v for k, v in samples(
                text, "org_apache_kafka_producer_record_send").items() if label in k}
            assert list(sent.values()) == [150], sent
            assert samples(text, pushes) == {pushes: 2.0}
