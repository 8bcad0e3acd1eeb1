"""Helpers for tests that run the real proxy: as a subprocess, or in-process under trio."""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.headers import RequestHeader, write_request_header
from kproxy.codecs.interpreter import encode_into
from kproxy.codecs.messages import Response, decode_response
from kproxy.codecs.primitives import Writer
from kproxy.codecs.registry import spec_for
from kproxy.config import settings as config_mod
from kproxy.embedded_broker import free_port as ephemeral_port
from kproxy.embedded_broker import wait_for_port

if TYPE_CHECKING:
    from confluent_kafka import Message

BROKER_PORTS_CHECKED = 16  # the brokers a test's range uses, from the base up


def _lane_ports() -> tuple[int, int, int]:
    """This xdist lane's slice of the ports below the kernel's range of ephemeral
    ports: (first, where single ports start, end). Below that range only an explicit
    bind takes a port: an ephemeral one, handed out by binding port 0 and closing, may be
    any lane's outgoing connection's source port by the time a proxy binds it (a
    listener once failed to open that way). Broker ranges take the lower three quarters
    of the slice, single ports the rest."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    lane = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    lanes = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    start, end = 10_000, max(10_001, low - 1024)  # room for a range of 1,024 brokers
    width = (end - start) // lanes
    first = start + lane * width
    return first, first + 3 * width // 4, first + width


def broker_port_base() -> int:
    """A base for per-broker listeners whose first ports are free (``_lane_ports``)."""
    first, singles, _ = _lane_ports()
    for _ in range(100):
        base = random.randrange(first, max(first + 1, singles - BROKER_PORTS_CHECKED))
        if all(_bindable(base + n) for n in range(BROKER_PORTS_CHECKED)):
            return base
    return ephemeral_port()  # no free block found: fall back to the old choice


# Ports handed out lately in this process: free when checked, maybe not bound yet (a
# command line takes two at once).
_HANDED: collections.deque[int] = collections.deque(maxlen=256)


def free_port() -> int:
    """A loopback port that is free now, from this lane's single ports (``_lane_ports``),
    not one handed out lately."""
    _, singles, end = _lane_ports()
    for _ in range(200):
        port = random.randrange(singles, end)
        if port not in _HANDED and _bindable(port):
            _HANDED.append(port)
            return port
    return ephemeral_port()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def make_config(upstream: str, config_file: Path | None = None, /,
                **overrides: Any) -> config_mod.Config:
    """A Config with free loopback ports, as `kproxy run` flags would build it. Each
    override names an option; anything else is a mistake, refused (it would be
    dropped without a word)."""
    unknown = sorted(set(overrides) - {o.name for o in config_mod.OPTIONS})
    if unknown:
        raise TypeError(f"make_config: not options: {', '.join(unknown)}")
    values: dict[str, Any] = {"upstream": upstream, "listen": "127.0.0.1:0",
                              "http": "127.0.0.1:0",
                              "broker_port_base": str(broker_port_base()),
                              "node_id_range": "111-111", "discovery_interval": "2"}
    values.update({k: str(v) for k, v in overrides.items()})
    ns = argparse.Namespace(config=str(config_file) if config_file else None,
                            **{o.name: None for o in config_mod.OPTIONS})
    for key, value in values.items():
        setattr(ns, key, value)
    return config_mod.load(ns, env={})


def encode_request(api_key: int, api_version: int, correlation_id: int,
                   body: dict[str, Any], client_id: str = "kproxy-test") -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(api_key, api_version, correlation_id, client_id))
    spec = spec_for(api_key, api_version, response=False)
    assert spec is not None
    encode_into(spec, api_version, body, w)
    data = w.getvalue()
    return struct.pack(">i", len(data)) + data


def push_error(frame: bytes | memoryview) -> int:
    """A PushTelemetry (v0) answer's error code, read where it lies (after the
    correlation id, the header's tags and throttle_time_ms) without decoding the rest."""
    return int(struct.unpack_from(">h", frame, 4 + 1 + 4)[0])


def push_body(got: Any, metrics: bytes, compression_type: int = 0) -> dict[str, Any]:
    """A PushTelemetry (v0) body for the instance ``got`` names (a Get's answer)."""
    return {"client_instance_id": got["client_instance_id"],
            "subscription_id": got["subscription_id"], "terminating": False,
            "compression_type": compression_type, "metrics": metrics}


async def http_get(port: int, path: str, headers: dict[str, str] | None = None,
                   raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """A minimal HTTP/1.1 GET (or raw bytes) against the proxy's endpoint, read to EOF."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    await stream.send_all(raw or f"GET {path} HTTP/1.1\r\nhost: t\r\n{extra}\r\n".encode())
    data = bytearray()
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, hdrs, body


class RawClient:
    """A Kafka client that speaks frames directly (trio), for protocol-level tests."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader()

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1",
                      source: str | None = None) -> RawClient:
        return cls(await trio.open_tcp_stream(host, port, local_address=source))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_frame(self, timeout: float = 10) -> bytes | None:
        """The next response frame body, or None when the proxy closed the connection."""
        with trio.fail_after(timeout):
            while (frame := self.reader.next_frame()) is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.reader.feed(data)
            return frame

    async def request(self, api_key: int, api_version: int, correlation_id: int,
                      body: dict[str, Any]) -> Response:
        await self.send(encode_request(api_key, api_version, correlation_id, body))
        frame = await self.read_frame()
        assert frame is not None, "connection closed"
        return decode_response(frame, api_key, api_version)

    async def aclose(self) -> None:
        await self.stream.aclose()


@dataclass
class KproxyProcess:
    """`kproxy run` as a subprocess, the way an operator runs it."""

    process: subprocess.Popen[bytes]
    bootstrap_port: int
    http_port: int
    broker_port_base: int
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.bootstrap_port}"

    def ready_status(self) -> int:
        """/readyz's status, 0 while the HTTP port does not answer yet (it opens after the
        bootstrap listener)."""
        try:
            return self.http_get("/readyz")[0]
        except (urllib.error.URLError, TimeoutError):
            return 0

    def all_ready(self) -> bool:
        """Ready, and with workers every one of them ("2/2 workers ready"): a test
        starts once the whole proxy serves, not the first worker."""
        try:
            status, body = self.http_get("/readyz")
        except (urllib.error.URLError, TimeoutError):  # not yet; on a loaded machine, slowly
            return False
        counts = re.match(r"(\d+)/(\d+) workers ready", body)
        return status == 200 and (counts is None or counts[1] == counts[2])

    def http_get(self, path: str, timeout: float = 5) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}",
                                        timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def log(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def worker_pids(self) -> list[int]:
        """The processes that hold client connections: the supervisor's workers, or the
        process itself when it runs as one (``--workers 1``)."""
        return worker_pids(self.process.pid) or [self.process.pid]


T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float = 30, what: str = "condition") -> T:
    """``cond()``'s first truthy answer, asked every 50 ms; AssertionError naming
    ``what`` after ``timeout`` seconds (a condition, never a fixed wait: CI machines are
    busy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := cond():
            return found
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout:g} s: {what}")


def value_of(msg: Message) -> bytes:
    """A consumed record's value: every record these tests produce has one."""
    value = msg.value()
    assert value is not None, f"no value at {msg.topic()}[{msg.partition()}]@{msg.offset()}"
    return value


def produce_and_read_back(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    """confluent-kafka: create ``topic`` (one partition), produce ``values`` (up to 3 MB
    each) and read the partition back to its end."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "message.max.bytes": 3_000_000, "compression.type": "none"})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.max.bytes": 8_000_000,
                         "max.partition.fetch.bytes": 3_000_000})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(600):  # bounded: 600 polls of at most 0.1 s
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and len(got) >= len(values):
                    break
                assert err.code() == KafkaError._PARTITION_EOF, err
                continue
            got.append(value_of(msg))
    finally:
        consumer.close()
    return got


def audit_records(tmp: Path) -> list[dict[str, Any]]:
    """The records of ``tmp``/audit.log so far (none before it exists)."""
    path = tmp / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kernel_collapses() -> bool:
    """Linux 6.1 or later with transparent huge pages: ``MADV_COLLAPSE`` is known
    (``kproxy.commands.heap``)."""
    release = os.uname().release.split(".")
    major, minor = int(release[0]), int("".join(c for c in release[1] if c.isdigit()) or 0)
    return ((major, minor) >= (6, 1)
            and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"))


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant, from /proc (the children of each thread)."""
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*/children"):
            with suppress(OSError):  # exited since
                pids += [int(c) for c in task.read_text().split()]
        i += 1
    return pids


def worker_pids(supervisor: int) -> list[int]:
    """The child processes of ``supervisor`` (its workers), from /proc: the children of
    each of its threads (trio starts processes from a worker thread)."""
    pids: list[int] = []
    for task in Path(f"/proc/{supervisor}/task").glob("*"):
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(pids))


def metric_value(text: str, sample: str) -> float:
    """The value of the exposition line for ``sample`` (name and labels), 0 when absent."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return 0.0


def rss_kib(pid: int, field: str = "VmRSS", table: str = "status") -> int:
    """A process's resident memory (``VmRSS``) or its peak (``VmHWM``), in KiB; or
    another KiB field of ``/proc/<pid>/<table>`` (``AnonHugePages``, ``smaps_rollup``)."""
    for line in Path(f"/proc/{pid}/{table}").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


@contextmanager
def kproxy_process(upstream: str | None, tmp_path: Path, *extra: str,
                   node_id_range: str = "111-111", env: dict[str, str] | None = None,
                   preexec: Callable[[], None] | None = None) -> Iterator[KproxyProcess]:
    bootstrap, http, base = free_port(), free_port(), broker_port_base()
    log_path = tmp_path / f"kproxy-{bootstrap}.log"
    # What users run: `kproxy run` with its default worker count (one worker per usable
    # CPU: 2 on the 2-core machines CI runs on). A test that needs one process passes
    # "--workers", "1" in ``extra`` (later flags win) and says why.
    cmd = [sys.executable, "-m", "kproxy.cli", "run",
           *(["--upstream", upstream] if upstream else []),
           "--listen", f"127.0.0.1:{bootstrap}", "--http", f"127.0.0.1:{http}",
           "--broker-port-base", str(base), "--node-id-range", node_id_range,
           "--discovery-interval", "2", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, preexec_fn=preexec)
    kp = KproxyProcess(proc, bootstrap, http, base, log_path)
    try:
        if not wait_for_port("127.0.0.1", bootstrap, 60):
            raise RuntimeError(f"kproxy did not start:\n{kp.log()}")
        deadline = time.monotonic() + 60  # a loaded machine starts Python slowly
        while not kp.all_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield kp
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a drain), then SIGKILL if it has not exited within 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def direct_connections(pids: int | list[int], port: int) -> int:
    """TCP connections that the processes ``pids`` hold to ``port`` on loopback (from
    /proc)."""
    inodes = set()
    for pid in [pids] if isinstance(pids, int) else pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if remote_port == port and cols[9] in inodes:
                count += 1
    return count


@contextmanager
def busy_core(cpu: int | None = None, seconds: float = 120) -> Iterator[int]:
    """A process at ordinary priority that keeps ``cpu`` (else the last of this thread's
    usable CPUs) busy, for at most ``seconds`` (stopped on leaving): what an application
    beside a sidecar does when it uses every core it has. Yields that CPU; code under
    test pinned to it finds the kernel's idle class there given next to no time."""
    cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
    code = (f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nprint('busy', flush=True)\n"
            f"end = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"busy\n"
        yield cpu
    finally:
        proc.kill()
        proc.wait()
