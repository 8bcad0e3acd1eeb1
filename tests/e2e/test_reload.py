"""Config reload under a running `kproxy run`: a valid change applies without dropping
connections; an invalid one is rejected and the running config kept."""

from __future__ import annotations

import re
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import Response, decode_response
from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, encode_request, kproxy_process

pytestmark = pytest.mark.broker


class SyncClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader()
        self.cid = 0

    def request(self, key: int, version: int, body: dict[str, object]) -> Response:
        self.cid += 1
        self.sock.sendall(encode_request(key, version, self.cid, body))
        while (frame := self.reader.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "the proxy closed the connection"
            self.reader.feed(data)
        return decode_response(frame, key, version)

    def subscription(self) -> list[str]:
        body = self.request(71, 0, {"client_instance_id": uuid.UUID(int=7)}).body
        assert body["error_code"] == 0, body
        return list(body["requested_metrics"])


def subscriptions(*prefixes: str) -> str:
    metrics = ", ".join(f'"{p}"' for p in prefixes)
    return f"[[telemetry.subscriptions]]\nmetrics = [{metrics}]\ninterval_ms = 100\n"


def wait_for_log(kp: object, needle: str, timeout: float = 30, times: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while kp.log().count(needle) < times:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{needle!r} not {times} times in the log"
        time.sleep(0.1)


def workers(kp: KproxyProcess) -> int:
    """How many processes serve (and each reload): "2/2 workers ready", else one."""
    counts = re.match(r"(\d+)/(\d+) workers ready", kp.http_get("/readyz")[1])
    return 1 if counts is None else int(counts[2])


def test_file_watch_applies_valid_and_rejects_invalid(tmp_path: Path) -> None:
    cfg = tmp_path / "kproxy.toml"
    cfg.write_text(subscriptions("org.apache.kafka.producer."))
    with TansuBroker(log_path=tmp_path / "tansu.log") as broker, kproxy_process(
            broker.bootstrap, tmp_path, "--config", str(cfg),
            "--config-watch-interval", "0.2") as kp:
        client = SyncClient(kp.bootstrap_port)
        client.request(api_keys.API_VERSIONS, 3, {"client_software_name": "t",
                                                  "client_software_version": "1"})
        assert client.subscription() == ["org.apache.kafka.producer."]

        # A valid change, as a ConfigMap update would make it: written elsewhere, renamed in.
        staged = tmp_path / "staged.toml"
        staged.write_text(subscriptions("org.apache.kafka.consumer."))
        staged.replace(cfg)
        # Each worker watches the file: wait for all of them, whichever holds the client.
        wait_for_log(kp, "telemetry subscriptions reloaded", times=workers(kp))
        time.sleep(0.2)  # one push interval, so the next Get is not throttled
        assert client.subscription() == ["org.apache.kafka.consumer."]

        # An invalid change is rejected; the running config stays; nothing is dropped.
        cfg.write_text("[[telemetry.subscriptions]]\nmetrics = [\"x\"]\ninterval_ms = 1\n")
        wait_for_log(kp, "config reload rejected", times=workers(kp))
        assert "interval_ms must be 100..3600000" in kp.log()
        time.sleep(0.2)
        assert client.subscription() == ["org.apache.kafka.consumer."]
        metadata = client.request(api_keys.METADATA, 12, {
            "topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        assert metadata.body["brokers"]  # the same connection still works
        _, metrics = kp.http_get("/metrics")
        assert 'kproxy_config_reloads_total{outcome="applied"} 1.0' in metrics
        assert 'kproxy_config_reloads_total{outcome="rejected"} 1.0' in metrics
        assert kp.process.poll() is None
        client.sock.close()


def test_new_upstream_list_to_the_same_backend_is_one_forced_change(tmp_path: Path) -> None:
    """A reload's new list leads to the same cluster: one `upstream_reconfigured` epoch;
    a connection to a server no longer listed ends at its next request, unanswered;
    a connection opened after the change is not told to bootstrap again."""
    with TansuBroker(log_path=tmp_path / "tansu.log") as broker:
        cfg = tmp_path / "kproxy.toml"
        cfg.write_text(f'upstream = "127.0.0.1:{broker.port}"\n')
        with kproxy_process(None, tmp_path, "--config", str(cfg)) as kp:
            metadata = {"topics": [], "allow_auto_topic_creation": False,
                        "include_topic_authorized_operations": False}
            before = SyncClient(kp.bootstrap_port)
            assert before.request(api_keys.METADATA, 13, metadata).body["error_code"] == 0
            cfg.write_text(f'upstream = "localhost:{broker.port}"\n')  # same broker
            kp.signal(signal.SIGHUP)
            # Every worker applies it: wait for all of them, whichever holds `before`.
            wait_for_log(kp, "backend changed: upstream_reconfigured", times=workers(kp))
            before.cid += 1
            before.sock.sendall(encode_request(api_keys.METADATA, 13, before.cid, metadata))
            try:
                answer = before.sock.recv(65536)
            except ConnectionResetError:
                answer = b""
            assert answer == b"", "answered on a server no longer listed"
            after = SyncClient(kp.bootstrap_port)
            assert after.request(api_keys.METADATA, 13, metadata).body["error_code"] == 0
            _, metrics = kp.http_get("/metrics")
            assert 'kproxy_topology_changes_total{reason="upstream_reconfigured"} 1.0' in metrics
            assert 'reason="cluster_id"' not in metrics and 'reason="brokers"' not in metrics
            assert 'kproxy_rebootstrap_total{outcome="upstream_gone"} 1.0' in metrics
            after.sock.close()
            before.sock.close()
