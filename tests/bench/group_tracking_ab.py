"""Group tracking on vs off through a real proxy: produce and consume the same data,
alternating runs, and report wall time and the proxy's CPU seconds per GB.

Run: .venv/bin/python tests/bench/group_tracking_ab.py [--messages N] [--reps R]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_measure import process_cpu_seconds

from kproxy.embedded_broker import TansuBroker
from tests.support import kproxy_process


def one_run(broker: TansuBroker, tmp: Path, tracking: str, n: int, size: int) -> tuple[float,
                                                                                      float]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with kproxy_process(broker.bootstrap, tmp, "--group-tracking", tracking) as kp:
        topic = f"ab-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": kp.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=4)])[topic].result(20)
        cpu0, t0 = process_cpu_seconds(kp.process.pid), time.monotonic()
        p = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 10})
        payload = b"x" * size
        for _ in range(n):
            while True:
                try:
                    p.produce(topic, payload)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(60) == 0
        c = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": topic,
                      "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                      "enable.partition.eof": True})
        c.subscribe([topic])
        got, eof = 0, set[int | None]()
        deadline = time.monotonic() + 300
        while (got < n or len(eof) < 4) and time.monotonic() < deadline:
            for msg in c.consume(1000, timeout=0.5):
                if msg.error():
                    eof.add(msg.partition())
                else:
                    got += 1
                    if got % 5000 == 0:
                        c.commit(asynchronous=True)
        c.close()
        assert got == n
        return time.monotonic() - t0, process_cpu_seconds(kp.process.pid) - cpu0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    gb = 2 * args.messages * args.size / 1e9  # through the proxy twice: in and out
    results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as d, TansuBroker(log_path=Path(d) / "t.log") as b:
        for _ in range(args.reps):
            for mode in ("on", "off"):
                results[mode].append(one_run(b, Path(d), mode, args.messages, args.size))
    for mode, runs in results.items():
        print(f"group tracking {mode}: wall {median(r[0] for r in runs):.2f} s, proxy CPU "
              f"{median(r[1] for r in runs) / gb:.1f} s/GB (median of {len(runs)}; "
              f"runs: {', '.join(f'{w:.2f}s/{c:.2f}cpu' for w, c in runs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
