"""Soak: mixed traffic through `kproxy run` for a while; fail on loss or unbounded growth.

Traffic, all through the proxy in front of a real tansu broker:
  - an idempotent acks=all producer (confluent-kafka) sending numbered messages
    at a steady rate, pushing KIP-714 telemetry every second;
  - a consumer group member reading them back and committing;
  - churn: a short-lived client that connects, reads metadata and leaves, over and over.

The proxy's resident memory and open file descriptors are sampled throughout. The
run fails when an acknowledged message never reaches the group, when memory in the
last quarter of the run exceeds the second quarter by more than the allowance, or
when file descriptors are left behind once the churn stops.

    python tests/soak/run_soak.py --seconds 600        (make soak; SOAK_SECONDS=...)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from kproxy.embedded_broker import TansuBroker
from tests.support import kproxy_process, process_tree, rss_kib, value_of

TOPIC = "soak"


@dataclass
class Sample:
    t: float
    rss_mb: float
    fds: int


@dataclass
class Result:
    seconds: float
    produced_acked: int = 0
    produce_errors: int = 0
    consumed_unique: int = 0
    duplicates: int = 0
    lost: int = 0
    churn_connections: int = 0
    telemetry_pushes: float = 0.0
    rss_q2_mb: float = 0.0
    rss_q4_mb: float = 0.0
    fds_baseline: int = 0
    fds_end: int = 0
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def proc_sample(pid: int, start: float) -> Sample:
    """Resident memory and open descriptors of ``pid`` and every process under it: with
    the default worker count the supervisor holds none of the connections, its workers
    (and their telemetry vetting helpers) do."""
    rss_kb = fds = 0
    for one in process_tree(pid):
        try:
            rss_kb += rss_kib(one)
            fds += len(os.listdir(f"/proc/{one}/fd"))
        except (OSError, AssertionError):  # exited since (a helper replaced, say)
            continue
    return Sample(round(time.monotonic() - start, 1), round(rss_kb / 1024, 1), fds)



def metric_total(http_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def produce(bootstrap: str, stop: threading.Event, rate: int, acked: set[int],
            errors: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "client.id": "soak-producer"})

    def done(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.add(int(msg.value()))  # type: ignore[attr-defined]

    n = 0
    next_at = time.monotonic()
    while not stop.is_set():
        for _ in range(max(1, rate // 10)):
            producer.produce(TOPIC, str(n).encode(), on_delivery=done)
            n += 1
        producer.poll(0)
        next_at += 0.1
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(60)


def consume(bootstrap: str, stop: threading.Event, seen: list[int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-group",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "client.id": "soak-consumer"})
    consumer.subscribe([TOPIC])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                seen.append(int(value_of(msg)))
    finally:
        consumer.close()


def churn(bootstrap: str, stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "soak-churn"})
        admin.list_topics(timeout=5)
        del admin
        count[0] += 1
        stop.wait(0.5)


def run(seconds: float, rate: int, allowance_mb: float, sample_every: float) -> Result:
    result = Result(seconds)
    with tempfile.TemporaryDirectory() as tmp, \
            TansuBroker(log_path=Path(tmp) / "tansu.log") as broker, \
            kproxy_process(broker.bootstrap, Path(tmp), "--telemetry-default-interval-ms",
                           "1000", "--archive", str(Path(tmp) / "archive")) as kp:
        pid = kp.process.pid
        start = time.monotonic()
        result.fds_baseline = proc_sample(pid, start).fds
        acked: set[int] = set()
        seen: list[int] = []
        errors: list[str] = []
        churned = [0]
        stop_produce, stop_churn, stop_consume = (threading.Event() for _ in range(3))
        threads = [
            threading.Thread(target=produce, args=(kp.bootstrap, stop_produce, rate, acked,
                                                   errors)),
            threading.Thread(target=consume, args=(kp.bootstrap, stop_consume, seen)),
            threading.Thread(target=churn, args=(kp.bootstrap, stop_churn, churned)),
        ]
        for t in threads:
            t.start()
        try:
            while time.monotonic() - start < seconds:
                time.sleep(sample_every)
                result.samples.append(proc_sample(pid, start))
                if kp.process.poll() is not None:
                    result.failures.append("the proxy exited")
                    break
        finally:
            stop_churn.set()
            stop_produce.set()
            threads[0].join(90)
            threads[2].join(30)
            # Let the group read what was acknowledged, then stop it.
            deadline = time.monotonic() + 60
            while not acked <= set(seen) and time.monotonic() < deadline:
                time.sleep(0.5)
            stop_consume.set()
            threads[1].join(30)
        time.sleep(2)  # connections of the stopped clients close
        end = proc_sample(pid, start)
        result.fds_end = end.fds
        result.telemetry_pushes = metric_total(
            kp.http_port, 'kproxy_telemetry_requests_total{api="PushTelemetry"')
    result.produced_acked = len(acked)
    result.produce_errors = len(errors)
    result.consumed_unique = len(set(seen))
    result.duplicates = len(seen) - len(set(seen))
    result.lost = len(acked - set(seen))
    result.churn_connections = churned[0]
    judge(result, allowance_mb)
    return result


def judge(r: Result, allowance_mb: float) -> None:
    if r.produced_acked == 0:
        r.failures.append("nothing was produced")
    if r.lost:
        r.failures.append(f"{r.lost} acknowledged messages never reached the group")
    n = len(r.samples)
    if n >= 8:
        q2 = [s.rss_mb for s in r.samples[n // 4: n // 2]]
        q4 = [s.rss_mb for s in r.samples[3 * n // 4:]]
        r.rss_q2_mb, r.rss_q4_mb = round(median(q2), 1), round(median(q4), 1)
        if r.rss_q4_mb > r.rss_q2_mb + max(allowance_mb, 0.1 * r.rss_q2_mb):
            r.failures.append(f"memory kept growing: median {r.rss_q2_mb} MB in the second "
                              f"quarter, {r.rss_q4_mb} MB in the last")
    else:
        r.failures.append(f"only {n} memory samples; run longer")
    if r.fds_end > r.fds_baseline + 5:
        r.failures.append(f"file descriptors left behind: {r.fds_baseline} at start, "
                          f"{r.fds_end} after the clients left")
    if r.telemetry_pushes == 0:
        r.failures.append("no telemetry push reached the proxy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--rate", type=int, default=500, help="messages per second")
    ap.add_argument("--allowance-mb", type=float, default=15.0,
                    help="memory growth tolerated between the second and last quarter")
    ap.add_argument("--sample-every", type=float, default=None,
                    help="seconds between samples (default: seconds/40, 1..15)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    every = args.sample_every or min(15.0, max(1.0, args.seconds / 40))
    result = run(args.seconds, args.rate, args.allowance_mb, every)
    summary = {k: v for k, v in asdict(result).items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    print("rss_mb:", " ".join(str(s.rss_mb) for s in result.samples))
    print("fds:   ", " ".join(str(s.fds) for s in result.samples))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    print("SOAK FAILED: " + "; ".join(result.failures) if result.failures else "SOAK PASSED")
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
