"""Generate a large synthetic kproxy archive for the fleet-pipeline benchmark.

    python tests/bench/generate_archive.py OUT_DIR [--instances 10000] [--pushes 10]
                                               [--hours 10]

Each instance pushes ``pushes`` times 10 gauge metrics of one point each, in the same
OTLP JSON shape kproxy writes (10,000 x 10 x 10 = 1,000,000 data points), spread over
five software versions, and has two connection records. The pushes are spread evenly
over ``hours`` hour partitions (``date=/hour=``), as kproxy rotates its files.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from contextlib import ExitStack
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


def _point_json(name: str, stamp: int, value: float) -> str:
    return (f'{{"name":"{name}","gauge":{{"dataPoints":[{{"timeUnixNano":"{stamp}",'
            f'"asDouble":{value}}}]}}}}')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--hours", type=int, default=10)
    args = parser.parse_args()
    rnd = random.Random(7)
    out = Path(args.out)
    t0 = 1_767_225_600  # 2026-01-01T00:00:00Z

    def part(kind: str, hour: int) -> Path:
        stamp = time.gmtime(t0 + hour * 3600)
        folder = (out / kind / time.strftime("date=%Y-%m-%d", stamp)
                  / time.strftime("hour=%H", stamp))
        folder.mkdir(parents=True, exist_ok=True)
        return folder / "part-bench-000001.jsonl"

    points = 0
    with ExitStack() as files:
        tel = [files.enter_context(open(part("telemetry", h), "w")) for h in range(args.hours)]
        fc = files.enter_context(open(part("connections", 0), "w"))
        for i in range(args.instances):
            name, version, metadata = SOFTWARE[i % len(SOFTWARE)]
            client_id = f"app-{i % 997}"
            source = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
            instance = str(uuid.UUID(int=rnd.getrandbits(128)))
            res = json.dumps({"attributes": [
                kv("client.instance.id", instance), kv("client.id", client_id),
                kv("client.software.name", name), kv("client.software.version", version),
                kv("client.source.address", source), kv("kproxy.host", "bench")]},
                separators=(",", ":"))
            scope = json.dumps({"name": "bench", "version": version}, separators=(",", ":"))
            for push in range(args.pushes):
                hour = push * args.hours // args.pushes
                stamp = (t0 + hour * 3600 + push) * 1_000_000_000
                metrics = ",".join(_point_json(m, stamp, round(rnd.expovariate(1 / 5.0), 3))
                                   for m in METRICS)
                points += len(METRICS)
                tel[hour].write(f'{{"resourceMetrics":[{{"resource":{res},"scopeMetrics":'
                                f'[{{"scope":{scope},"metrics":[{metrics}]}}]}}]}}\n')
            for listener in ("bootstrap", "broker-0"):
                fc.write(json.dumps({
                    "ts": t0 + 60.0, "opened": float(t0), "proxy": "bench",
                    "listener": listener, "client_id": client_id, "client_software_name": name,
                    "client_software_version": version, "source_address": source,
                    "source_port": 40000 + i % 20000, "apis": {"Metadata": metadata},
                    "metadata_max_version": metadata, "supports_metadata_v13": metadata >= 13,
                    "telemetry": True, "bytes_in": rnd.randrange(10**6),
                    "bytes_out": rnd.randrange(10**6)}) + "\n")
    print(f"{out}: {args.instances} instances, {points} data points, {args.hours} hours")


if __name__ == "__main__":
    main()
