"""The container image, built and run for real: Debian's buildah builds it (or reuses the
image whose inputs hash is unchanged), podman runs it with host networking in front of a
real tansu broker, and real clients produce, consume and push telemetry through it.

Skipped, with the reason, only where buildah or podman cannot run at all.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker, wait_for_port

from ..support import free_port, value_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy"))
import image_build  # noqa: E402

pytestmark = pytest.mark.broker
# vfs: the storage buildah built into. cgroupfs and runc: no systemd here, and crun
# refuses the hybrid cgroup layout of these machines.
PODMAN = ["podman", "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
          "--runtime", "runc"]
NOFILE = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)


def unavailable() -> str | None:
    """Why the container tools cannot run here, or None when they can."""
    for tool in ("buildah", "podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make image-tools installs it)"
    proc = subprocess.run(["buildah", "--storage-driver", "vfs", "info"], capture_output=True,
                          text=True, timeout=60, check=False)
    if proc.returncode:
        return f"buildah cannot run here: {proc.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def image(pytestconfig: pytest.Config) -> str:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "deploy" / "image_build.py"),
                           "--engine", "buildah"], capture_output=True, text=True,
                          timeout=3000, check=False)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shows in `make test`'s output too
        print(f"\n{proc.stdout.strip()}\nimage: ready in {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return f"{image_build.REPO}:{image_build.inputs_hash()}"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


class Container:
    """One `podman run -d` of the image, on the host's network."""

    def __init__(self, name: str, http_port: int, listen_port: int) -> None:
        self.name, self.http_port, self.listen_port = name, http_port, listen_port

    def inspect(self) -> dict[str, object]:
        out = podman("inspect", self.name)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout)[0])

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics",
                                    timeout=5) as resp:
            return str(resp.read().decode())

    def logs(self) -> str:
        out = podman("logs", self.name)
        return out.stdout + out.stderr


@pytest.fixture
def container(image: str, tansu: TansuBroker, tmp_path: Path) -> Iterator[Container]:
    listen, http, base = free_port(), free_port(), free_port()
    config = tmp_path / "kproxy.toml"
    config.write_text('[[telemetry.subscriptions]]\nname = "all"\nmetrics = ["*"]\n'
                      "interval_ms = 1000\n")
    config.chmod(0o644)
    name = f"kproxy-test-{uuid.uuid4().hex[:8]}"
    started = podman(
        "run", "-d", "--name", name, "--network", "host",
        # Limits no higher than this sandbox allows; the HEALTHCHECK is run by hand
        # below (podman's timer for it needs systemd).
        "--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "nproc=4096:4096",
        "--health-interval", "disable",
        "--volume", f"{config}:/etc/kproxy/kproxy.toml:ro",
        "-e", f"KPROXY_UPSTREAM={tansu.bootstrap}", "-e", f"KPROXY_LISTEN=127.0.0.1:{listen}",
        "-e", f"KPROXY_HTTP=127.0.0.1:{http}", "-e", f"KPROXY_BROKER_PORT_BASE={base}",
        "-e", "KPROXY_NODE_ID_RANGE=111-111", "-e", "KPROXY_ADVERTISED_HOST=127.0.0.1",
        image, "--config", "/etc/kproxy/kproxy.toml")
    assert started.returncode == 0, started.stderr
    box = Container(name, http, listen)
    try:
        if not wait_for_port("127.0.0.1", listen, 60):
            raise AssertionError("the container's proxy did not listen:\n" + box.logs())
        yield box
    finally:
        podman("rm", "-f", "-t", "0", name)


# A cold build (base made with debootstrap, then both stages) takes minutes on a loaded
# 2-core machine; it is paid once, later runs reuse the image while its inputs match.
@pytest.mark.timeout(3600)
def test_image_runs_proxies_drains_and_reports(container: Container, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = f"127.0.0.1:{container.listen_port}"
    # The image's own configuration: HEALTHCHECK on /healthz, kproxy run, non-root user.
    config = container.inspect()["Config"]
    assert isinstance(config, dict)
    health = podman("image", "inspect", "--format", "{{json .HealthCheck}}",
                    str(container.inspect()["ImageName"]))
    assert "/healthz" in health.stdout, health.stdout + health.stderr

    # The HEALTHCHECK command itself, run in the container as the engine would.
    checked = podman("healthcheck", "run", container.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr + container.logs()

    # The proxy process runs as uid 10001 (read from the host's /proc).
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", container.name).stdout)
    status = Path(f"/proc/{pid}/status").read_text()
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
    assert uids and uids.groups() == ("10001", "10001"), status
    assert "kproxy" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")

    # Nothing the build borrowed from this host is left in the image: no pip
    # configuration, no secrets folder, no CA bundle copy, and no pip at all.
    leftovers = podman("exec", container.name, "python3", "-c",
                       "import os; print([p for p in ('/etc/pip.conf', '/etc/xdg/pip', "
                       "'/root/.config/pip', '/run/secrets', '/opt/kproxy/bin/pip') "
                       "if os.path.lexists(p)])")
    assert leftovers.stdout.strip() == "[]", leftovers.stdout + leftovers.stderr
    assert not [e for e in config.get("Env") or [] if str(e).startswith("PIP_")]

    # Produce and consume through it with a real client; the client's telemetry is
    # pushed through kproxy and shows on /metrics.
    topic = f"img-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    got: list[bytes] = []
    sent = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            producer.produce(topic, f"m{sent}".encode())
            sent += 1
            producer.poll(0.05)
            msg = consumer.poll(0.05)
            if msg is not None and not msg.error():
                got.append(value_of(msg))
            if got and "org_apache_kafka_producer_" in container.metrics() \
                    and "org_apache_kafka_consumer_" in container.metrics():
                break
        assert producer.flush(30) == 0
    finally:
        consumer.close()
    assert got and got[0] == b"m0", "nothing consumed through the container"
    text = container.metrics()
    assert 'client_software_name="confluent-kafka-python"' in text
    assert re.search(r'kproxy_requests_total\{api="Produce"\} [1-9]', text)

    # SIGTERM: the proxy drains and exits 0.
    killed = podman("kill", "--signal", "TERM", container.name)
    assert killed.returncode == 0, killed.stderr
    waited = podman("wait", container.name, timeout=90)
    assert waited.stdout.strip() == "0", waited.stdout + waited.stderr + container.logs()
    logs = container.logs()
    assert "draining" in logs and "kproxy stopped" in logs, logs[-2000:]
