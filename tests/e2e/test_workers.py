"""--workers: N kproxy processes on the same ports under one supervisor.

The end-to-end test runs two workers in front of a real tansu broker, kills one
while a confluent-kafka producer and consumer run, and checks that the clients
keep working, the worker comes back, and /metrics is one combined exposition.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker
from kproxy.metrics.merge import merge_expositions

from ..support import kproxy_process, worker_pids


def test_merge_sums_shares_and_keeps_one_line_per_series() -> None:
    a = ("# HELP kproxy_requests Requests\n# TYPE kproxy_requests counter\n"
         'kproxy_requests_total{api="Produce"} 3.0\n'
         "# HELP kproxy_topology_epoch Epoch\n# TYPE kproxy_topology_epoch gauge\n"
         "kproxy_topology_epoch 2.0\n"
         "# HELP kproxy_ready Ready\n# TYPE kproxy_ready gauge\nkproxy_ready 1.0\n"
         "# HELP client_bytes Client counter\n# TYPE client_bytes counter\n"
         'client_bytes_total{client_instance_id="x"} 10.0\n')
    b = a.replace("3.0", "4.0").replace("epoch 2.0", "epoch 1.0").replace(
        "ready 1.0", "ready 0.0").replace("10.0", "12.0")
    merged = merge_expositions([a, b])
    assert 'kproxy_requests_total{api="Produce"} 7.0' in merged  # each worker's share
    assert "kproxy_topology_epoch 2.0" in merged  # one backend: the newest view
    assert "kproxy_ready 0.0" in merged
    # A client that moved between workers: one series, its newest cumulative value.
    assert merged.count("client_bytes_total") == 1
    assert 'client_bytes_total{client_instance_id="x"} 12.0' in merged
    assert merged.count("# TYPE kproxy_requests counter") == 1


def _metric(text: str, line_start: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(line_start))


@pytest.mark.broker
def test_two_workers_survive_one_killed_mid_traffic(tansu: TansuBroker,
                                                    tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic("w", num_partitions=1)])["w"].result(30)
    with kproxy_process(tansu.bootstrap, tmp_path, "--workers", "2") as kp:
        deadline = time.monotonic() + 60
        while len(worker_pids(kp.process.pid)) < 2:
            assert time.monotonic() < deadline, "two workers did not start"
            time.sleep(0.1)
        producer = Producer({"bootstrap.servers": kp.bootstrap, "enable.idempotence": True,
                             "message.timeout.ms": 60000, "linger.ms": 5})
        consumer = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": "w",
                             "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
        consumer.subscribe(["w"])
        failed: list[str] = []
        consumed = 0

        def report(err: object, _msg: object) -> None:
            if err:
                failed.append(str(err))

        def traffic(n: int, start: int) -> None:
            nonlocal consumed
            for i in range(start, start + n):
                producer.produce("w", str(i).encode(), on_delivery=report)
                producer.poll(0)
                msg = consumer.poll(0.01)
                if msg is not None and not msg.error():
                    consumed += 1

        traffic(300, 0)
        victim = worker_pids(kp.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        traffic(300, 300)
        assert producer.flush(90) == 0 and not failed, failed[:3]
        deadline = time.monotonic() + 120
        while consumed < 600:
            assert time.monotonic() < deadline, f"consumed {consumed} of 600"
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                consumed += 1
        consumer.close()
        # The supervisor started a new worker in place of the killed one.
        deadline = time.monotonic() + 60
        while True:
            pids = worker_pids(kp.process.pid)
            if len(pids) == 2 and victim not in pids:
                break
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.2)
        _, metrics = kp.http_get("/metrics", timeout=30)
        assert _metric(metrics, "kproxy_worker_restarts_total") >= 1
        assert _metric(metrics, "kproxy_workers_alive") == 2
        assert _metric(metrics, 'kproxy_requests_total{api="Produce"}') >= 1
        series = [line.split(" ")[0] for line in metrics.splitlines()
                  if line and not line.startswith("#")]
        assert len(series) == len(set(series)), "a series appears twice"
        status, text = kp.http_get("/readyz", timeout=30)
        assert status == 200 and "workers ready" in text
