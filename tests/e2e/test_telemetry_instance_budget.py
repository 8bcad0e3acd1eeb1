"""A fleet larger than the telemetry instance budget, at the default worker count.

``kproxy run`` (one worker per core) in front of a real tansu broker, its instances'
byte budget set small; synthetic client instances (real KIP-714 requests over plain
sockets, ``tests/scrape_load``'s push shape) arrive over several connections, so the
kernel spreads them over the workers. What an operator must see when the fleet
outgrows the budget: every request still answered as a broker would, the instances
held within the budget in every worker, each one forgotten counted on the merged
/metrics and status page, a warning in the log; and a forgotten client's next push
accepted.
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_response
from kproxy.embedded_broker import TansuBroker

from ..otlp_samples import librdkafka_like_payload
from ..support import encode_request, kproxy_process, metric_value, push_body, push_error

BUDGET = 32 * 1024  # bytes of instances a worker remembers: about 20 of these
CONNECTIONS, PER_CONNECTION = 8, 40
INSTANCE_OVERHEAD = 1024  # policies.telemetry.state: an instance's least estimated size


class TelemetryClient:
    """One connection's synthetic client instances, one request at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = FrameReader(1 << 20)
        self.correlation = 0
        self.payload = librdkafka_like_payload(points=20)

    def _roundtrip(self, api: int, body: dict[str, object]) -> bytes:
        self.correlation += 1
        self.sock.sendall(encode_request(api, 0, self.correlation, body))
        while (frame := self.reader.next_frame()) is None:
            data = self.sock.recv(1 << 16)
            assert data, "kproxy closed the connection"
            self.reader.feed(data)
        return bytes(frame)

    def subscribe(self, instance_id: uuid.UUID) -> dict[str, object]:
        got = decode_response(self._roundtrip(71, {"client_instance_id": instance_id}),
                              71, 0).body
        assert got["error_code"] == 0, got
        return got

    def push(self, got: dict[str, object]) -> int:
        frame = self._roundtrip(72, push_body(got, self.payload))
        return push_error(frame)


def test_a_fleet_beyond_the_instance_budget_is_bounded_counted_and_still_served(
        shared_tansu: TansuBroker, tmp_path: Path) -> None:
    with kproxy_process(shared_tansu.bootstrap, tmp_path,
                        "--telemetry-max-instance-bytes", str(BUDGET)) as kp:
        workers = len(kp.worker_pids())
        clients = [TelemetryClient(kp.bootstrap_port) for _ in range(CONNECTIONS)]
        firsts = []
        for client in clients:
            subscribed = [client.subscribe(uuid.UUID(int=0)) for _ in range(PER_CONNECTION)]
            assert all(client.push(got) == 0 for got in subscribed)
            firsts.append(subscribed[0])
        # Each connection made twice what its worker holds: its first instance was
        # forgotten, and its client, pushing again at once, is taken as new (the same
        # subscription id, and a first push is never too early).
        assert all(client.push(first) == 0 for client, first in zip(clients, firsts, strict=True))
        for client in clients:
            client.sock.close()
        _, text = kp.http_get("/metrics")
        _, status = kp.http_get("/status.json")
        _, page = kp.http_get("/")
        log = kp.log()
    made = CONNECTIONS * PER_CONNECTION
    held = metric_value(text, "kproxy_telemetry_client_instances")
    by_bytes = metric_value(
        text, 'kproxy_telemetry_client_instances_evicted_total{bound="bytes"}')
    print(f"{workers} workers: {held:.0f} instances held, {by_bytes:.0f} evicted by bytes")
    assert 0 < held <= workers * BUDGET // INSTANCE_OVERHEAD, text
    assert by_bytes >= made - held, (held, by_bytes)
    assert metric_value(
        text, 'kproxy_telemetry_client_instances_evicted_total{bound="instances"}') == 0
    assert metric_value(text, 'kproxy_telemetry_requests_total{api="PushTelemetry",'
                              'error="none"}') == made + CONNECTIONS
    assert "client instances forgotten to make room" in log
    # The one status page (both workers' facts, merged) says so too.
    assert json.loads(status)["telemetry"]["client_instances_evicted"] == by_bytes
    assert "forgotten to make room" in page
