"""Generate a large synthetic kproxy archive for the fleet-pipeline benchmark.

    python tests/bench/generate_archive.py OUT_DIR [--instances 10000] [--pushes 10]

Each instance pushes ``pushes`` times 10 gauge metrics of one point each, in the same
OTLP JSON shape kproxy writes (10,000 x 10 x 10 = 1,000,000 data points), spread over
five software versions, and has two connection records.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from pathlib import Path

METRICS = [
    "org.apache.kafka.producer.request.latency.avg",
    "org.apache.kafka.producer.request.latency.max",
    "org.apache.kafka.producer.record.queue.time.avg",
    "org.apache.kafka.producer.record.queue.time.max",
    "org.apache.kafka.producer.node.request.latency.avg",
    "org.apache.kafka.producer.produce.throttle.time.avg",
    "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",
    "org.apache.kafka.consumer.coordinator.rebalance.latency.avg",
    "org.apache.kafka.consumer.coordinator.commit.latency.avg",
    "org.apache.kafka.consumer.poll.idle.ratio.avg",
]
SOFTWARE = [("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", 13),
            ("confluent-kafka-go", "2.6.0-rdkafka-2.6.0", 12),
            ("apache-kafka-java", "4.1.0", 13), ("apache-kafka-java", "3.7.1", 12),
            ("librdkafka", "2.16.0", 13)]


def kv(key: str, value: str) -> dict[str, object]:
    return {"key": key, "value": {"stringValue": value}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--pushes", type=int, default=10)
    args = parser.parse_args()
    rnd = random.Random(7)
    out = Path(args.out)
    tel = out / "telemetry" / "date=2026-01-01" / "hour=00"
    con = out / "connections" / "date=2026-01-01" / "hour=00"
    tel.mkdir(parents=True, exist_ok=True)
    con.mkdir(parents=True, exist_ok=True)
    t0 = time.time_ns()
    points = 0
    with open(tel / "part-bench-000001.jsonl", "w") as ft, \
            open(con / "part-bench-000001.jsonl", "w") as fc:
        for i in range(args.instances):
            name, version, metadata = SOFTWARE[i % len(SOFTWARE)]
            client_id = f"app-{i % 997}"
            source = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
            instance = str(uuid.UUID(int=rnd.getrandbits(128)))
            res = {"attributes": [kv("client.instance.id", instance),
                                  kv("client.id", client_id), kv("client.software.name", name),
                                  kv("client.software.version", version),
                                  kv("client.source.address", source), kv("kproxy.host", "bench")]}
            for push in range(args.pushes):
                stamp = str(t0 + push * 1_000_000_000)
                metrics = [{"name": m, "gauge": {"dataPoints": [
                    {"timeUnixNano": stamp, "asDouble": round(rnd.expovariate(1 / 5.0), 3)}]}}
                    for m in METRICS]
                points += len(metrics)
                ft.write(json.dumps({"resourceMetrics": [{"resource": res, "scopeMetrics": [
                    {"scope": {"name": "bench", "version": version}, "metrics": metrics}]}]},
                    separators=(",", ":")) + "\n")
            for listener in ("bootstrap", "broker-0"):
                fc.write(json.dumps({
                    "ts": 1.7e9 + 60, "opened": 1.7e9, "proxy": "bench", "listener": listener,
                    "client_id": client_id, "client_software_name": name,
                    "client_software_version": version, "source_address": source,
                    "source_port": 40000 + i % 20000, "apis": {"Metadata": metadata},
                    "metadata_max_version": metadata, "supports_metadata_v13": metadata >= 13,
                    "telemetry": True, "bytes_in": rnd.randrange(10**6),
                    "bytes_out": rnd.randrange(10**6)}) + "\n")
    print(f"{out}: {args.instances} instances, {points} data points")


if __name__ == "__main__":
    main()
