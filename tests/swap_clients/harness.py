"""Blue/green swaps through kproxy, measured per client library.

Several real producers (each its own process, its own topic) stream through one
kproxy while its upstream is switched between two tansu clusters by editing the
config file and sending SIGHUP, ``swaps`` times, alternating. Afterwards every
topic is read back from both clusters, directly. Per client: the time from each
SIGHUP to the first acknowledged message that is on the new cluster, failed
deliveries, and lost and duplicated messages.

Shared by ``tests/e2e/test_rebootstrap_clients.py`` (asserts) and the ``make bench``
rebootstrap row (reports).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..support import value_of

HERE = Path(__file__).resolve().parent
JS_MODULES = HERE.parent / "js" / "node_modules"
PYTHON_CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
JS_CLIENTS = ("@platformatic/kafka", "kafkajs")
ALL_CLIENTS = PYTHON_CLIENTS + JS_CLIENTS

# Bounds, not targets: on a loaded machine these only cut off a run that is stuck.
START_S = 90.0  # every client acknowledged something before the first swap
SWAP_S = 60.0  # every client's messages are landing on the new cluster
LANDED = 30  # messages on the new cluster that show a client is through a swap
# Steady streaming before each swap, as between two real swaps (minutes apart): a
# client is not caught in the middle of recovering from the previous one.
DWELL_S = 2.0
STOP_S = 90.0  # a client's final flush (its own bound is 45 s) and exit


@dataclass
class SwapResult:
    """One client's figures over a run."""

    client: str
    version: str = ""
    metadata_version: int | None = None
    stalls: list[float | None] = field(default_factory=list)  # per swap, seconds
    sent: int = 0
    acked: int = 0
    failed: list[str] = field(default_factory=list)
    unreported: int = 0  # sent but without any delivery report
    lost: int = 0  # acknowledged, yet on neither cluster
    lost_sample: list[int] = field(default_factory=list)
    duplicated: int = 0  # copies beyond the first, over both clusters
    injected: int = 0  # REBOOTSTRAP_REQUIRED answers the proxy logged for this client

    @property
    def measured(self) -> list[float]:
        return [s for s in self.stalls if s is not None]

    @property
    def median_stall(self) -> float | None:
        return statistics.median(self.measured) if self.measured else None

    @property
    def max_stall(self) -> float | None:
        return max(self.measured) if len(self.measured) == len(self.stalls) else None

    def row(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f}"
        return (f"| {self.client} | {self.version} | v{self.metadata_version} | "
                f"{ms(self.median_stall)} | {ms(self.max_stall)} | {len(self.failed)} | "
                f"{self.lost} | {self.duplicated} |")


@dataclass
class SwapRun:
    """A run's figures: per client, and what the proxy counted."""

    results: dict[str, SwapResult]
    topology_changes: dict[str, float]  # kproxy_topology_changes_total by reason
    rebootstrap: dict[str, float]  # kproxy_rebootstrap_total by outcome


def counters(metrics: str, name: str, label: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^{name}_total\{{{label}="([^"]+)"\}} (\S+)$', metrics, re.M)}


def slug(client: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", client.lower()).strip("-")


def node_binary() -> str | None:
    return shutil.which("node")


def client_command(client: str, bootstrap: str, topic: str, out: Path, stop: Path,
                   *extra: str) -> list[str]:
    common = ["--client", client, "--bootstrap", bootstrap, "--topic", topic,
              "--client-id", f"swap-{slug(client)}", "--out", str(out), "--stop", str(stop),
              *extra]
    if client in PYTHON_CLIENTS:
        return [sys.executable, str(HERE / "py_producer.py"), *common]
    node = node_binary()
    if node is None or not (JS_MODULES / client).is_dir():
        raise RuntimeError(f"{client} is not installed: `make test-js` installs it")
    return [node, str(HERE / "js_producer.mjs"), *common]


def read_reports(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a client wrote so far (a half-written last line is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


class Cluster:
    """Direct access to one tansu cluster: topics, high watermarks, read-back."""

    def __init__(self, name: str, bootstrap: str, work: Path) -> None:
        from confluent_kafka import Consumer

        self.name, self.bootstrap = name, bootstrap
        self.work = work
        self.probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                               "enable.auto.commit": False})

    def create_topics(self, topics: list[str]) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(t, num_partitions=1)
                                           for t in topics]).values():
            future.result(30)

    def high_watermark(self, topic: str) -> int:
        from confluent_kafka import TopicPartition

        return int(self.probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])

    def read(self, topic: str) -> list[int]:
        """Every value of partition 0, by assignment, to the partition's end (one broker)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "unused",
                      "enable.auto.commit": False, "enable.partition.eof": True})
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[int] = []
        now = time.monotonic()
        cap, quiet_until = now + 200, now + 60  # bounded; the clock restarts on progress
        try:
            while (now := time.monotonic()) < min(cap, quiet_until):
                msg = c.poll(0.5)
                if msg is None:
                    continue
                if (error := msg.error()) is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    continue
                quiet_until = time.monotonic() + 60
                out.append(int(value_of(msg)))
        finally:
            c.close()
        return out

    def close(self) -> None:
        self.probe.close()


def wait_until(condition: Any, bound_s: float, what: str, running: Running) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        running.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (after {bound_s:.0f} s)")
        time.sleep(0.05)


def stalls(reports: list[dict[str, Any]], swaps: list[tuple[float, str]],
           on: dict[str, set[int]]) -> list[float | None]:
    """Per swap: from the SIGHUP to the first ack of a message on the new cluster."""
    out: list[float | None] = []
    for i, (at, cluster) in enumerate(swaps):
        until = swaps[i + 1][0] if i + 1 < len(swaps) else float("inf")
        firsts = [r["t"] - at for r in reports if "s" in r and r["e"] is None
                  and at <= r["t"] < until and r["s"] in on[cluster]]
        out.append(min(firsts) if firsts else None)
    return out


def metadata_versions(archive: Path) -> dict[str, int]:
    """The highest Metadata version each client id used, from kproxy's connection records."""
    out: dict[str, int] = {}
    for path in (archive / "connections").rglob("*part-*.jsonl*"):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            v, cid = rec.get("metadata_max_version"), rec.get("client_id")
            if isinstance(v, int) and isinstance(cid, str):
                out[cid] = max(v, out.get(cid, -1))
    return out


class Running:
    """The client processes: where each writes its reports, and whether any died."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.outs: dict[str, Path] = {}

    def check(self) -> None:
        """Raise if a client exited while it should still be producing."""
        for c, p in self.procs.items():
            if p.poll() is not None:
                err = (self.work / f"{slug(c)}.stderr").read_text(errors="replace")
                raise RuntimeError(f"{c} exited early ({p.returncode}):\n{err[-2000:]}")


@contextmanager
def clients_running(clients: tuple[str, ...], bootstrap: str, work: Path,
                    *extra: str) -> Iterator[Running]:
    """Each client streaming to its own topic; stopped (flushed) on leaving."""
    stop = work / "stop"
    stop.unlink(missing_ok=True)
    running = Running(work)
    procs = running.procs
    try:
        for c in clients:
            running.outs[c] = out = work / f"{slug(c)}.jsonl"
            with open(work / f"{slug(c)}.stderr", "wb") as err:
                procs[c] = subprocess.Popen(
                    client_command(c, bootstrap, f"swap-{slug(c)}", out, stop, *extra),
                    stdout=err, stderr=subprocess.STDOUT)
        yield running
    finally:
        stop.touch()
        deadline = time.monotonic() + STOP_S
        for p in procs.values():
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def run_swaps(blue_bootstrap: str, green_bootstrap: str, work: Path,
              clients: tuple[str, ...] = ALL_CLIENTS, swaps: int = 5) -> SwapRun:
    """Stream through kproxy, swap ``swaps`` times, read back; figures per client."""
    from tests.support import kproxy_process

    topics = {c: f"swap-{slug(c)}" for c in clients}
    clusters = {"blue": Cluster("blue", blue_bootstrap, work),
                "green": Cluster("green", green_bootstrap, work)}
    cfg, archive = work / "kproxy.toml", work / "archive"
    for cl in clusters.values():
        cl.create_topics(list(topics.values()))
    cfg.write_text(f'upstream = "{blue_bootstrap}"\n')
    swapped: list[tuple[float, str]] = []
    with ExitStack() as stack:
        for cl in clusters.values():
            stack.callback(cl.close)
        kp = stack.enter_context(kproxy_process(None, work, "--config", str(cfg),
                                                "--archive", str(archive)))
        with clients_running(clients, kp.bootstrap, work) as running:
            outs = running.outs

            def acked(c: str) -> bool:
                return any("s" in r and r["e"] is None for r in read_reports(outs[c]))
            wait_until(lambda: all(acked(c) for c in clients), START_S,
                       "a client acknowledged nothing before the first swap", running)
            steady_since = time.monotonic()
            for i in range(swaps):
                target = "green" if i % 2 == 0 else "blue"
                new = clusters[target]
                wait_until(lambda t=steady_since: time.monotonic() >= t + DWELL_S,
                           DWELL_S + 1, "steady streaming", running)
                base = {c: new.high_watermark(topics[c]) for c in clients}
                cfg.write_text(f'upstream = "{new.bootstrap}"\n')
                swapped.append((time.time(), target))
                kp.signal(signal.SIGHUP)
                wait_until(lambda n=new, b=base: all(
                    n.high_watermark(topics[c]) >= b[c] + LANDED for c in clients),
                    SWAP_S, f"swap {i + 1} to {target}: a client is not producing there", running)
                steady_since = time.monotonic()
        log = kp.log()
        _, metrics = kp.http_get("/metrics")
        results = {c: summarize(c, read_reports(outs[c]), swapped, clusters, topics[c], log)
                   for c in clients}
    versions = metadata_versions(archive)  # written out when kproxy stopped
    for c, r in results.items():
        r.metadata_version = versions.get(f"swap-{slug(c)}")
    return SwapRun(results, counters(metrics, "kproxy_topology_changes", "reason"),
                   counters(metrics, "kproxy_rebootstrap", "outcome"))


def summarize(client: str, reports: list[dict[str, Any]], swaps: list[tuple[float, str]],
              clusters: dict[str, Cluster], topic: str, log: str) -> SwapResult:
    r = SwapResult(client)
    head = reports[0] if reports else {}
    r.version = str(head.get("version", "?"))
    if "librdkafka" in head:
        r.version += f" (librdkafka {head['librdkafka']})"
    tail = reports[-1] if reports else {}
    deliveries = [x for x in reports if "s" in x]
    r.sent = int(tail.get("sent", len(deliveries)))
    ok = {x["s"] for x in deliveries if x["e"] is None}
    r.acked = len(ok)
    r.failed = [x["e"] for x in deliveries if x["e"] is not None]
    r.unreported = r.sent - len({x["s"] for x in deliveries})
    values = {name: cl.read(topic) for name, cl in clusters.items()}
    (clusters["blue"].work / f"{slug(client)}.readback.json").write_text(json.dumps(values))
    on = {name: set(v) for name, v in values.items()}
    everywhere = Counter(v for vs in values.values() for v in vs)
    lost = sorted(ok - set(everywhere))
    r.lost, r.lost_sample = len(lost), lost[:20]
    r.duplicated = sum(n - 1 for n in everywhere.values())
    r.stalls = stalls(reports, swaps, on)
    r.injected = sum(1 for line in log.splitlines()
                     if "told to bootstrap again" in line and f"swap-{slug(client)}" in line)
    return r


def table(results: dict[str, SwapResult]) -> str:
    head = ("| client | version | Metadata | median stall (ms) | max stall (ms) | failed | "
            "lost | duplicated |\n|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *(r.row() for r in results.values())])


def stalls_line(results: dict[str, SwapResult]) -> str:
    """Every swap's stall per client, in ms, for the test's output."""
    return "\n".join(f"{r.client}: " + ", ".join("-" if s is None else f"{s * 1000:.0f}"
                                                 for s in r.stalls) for r in results.values())
