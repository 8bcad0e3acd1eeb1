"""What a record-validation filter costs: produce throughput (MB/s) and the proxy's CPU
per GB produced, with and without it, through a real `kproxy run --workers 1` to tansu
with confluent-kafka; then the filter alone (no sockets), per record and per MB.

Run: .venv/bin/python tests/bench/filter_cost.py [MB per run, default 64]
Rows: no filter; JSON syntax on the topic; a JSON Schema on the topic; the filter
configured for other topics only (what the decode path costs a Produce it does not check).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kproxy.codecs.record_batch import encode_batch
from kproxy.embedded_broker import TansuBroker
from kproxy.policies.filters.record_validation import RecordValidation, json_check, load_schema

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.bench_measure import Path_
from tests.support import kproxy_process

SCHEMA = {"type": "object", "required": ["id", "name", "tags"],
          "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                         "tags": {"type": "array", "items": {"type": "string"}}}}


def record(i: int) -> bytes:
    """About 1 KiB of JSON, the shape the schema wants."""
    return json.dumps({"id": i, "name": f"order-{i}", "tags": ["x" * 40] * 20}).encode()


def config(tmp: Path, mode: str) -> Path:
    (tmp / "schema.json").write_text(json.dumps(SCHEMA))
    check = {"json": 'value_format = "json"', "schema": 'value_schema = "schema.json"',
             "other": 'value_format = "json"'}.get(mode)
    text = ""
    if check:
        topics = '"elsewhere-*"' if mode == "other" else '"bench-*"'
        text = (f'default_filters = ["v"]\n[[filters]]\nname = "v"\n'
                f'type = "record-validation"\ntopics = [{topics}]\n{check}\n')
    path = tmp / f"{mode}.toml"
    path.write_text(text)
    return path


def produce_run(broker: TansuBroker, mode: str, megabytes: int) -> tuple[float, float]:
    from confluent_kafka import Producer
    with tempfile.TemporaryDirectory() as d, kproxy_process(
            broker.bootstrap, Path(d), "--config", str(config(Path(d), mode)),
            "--workers", "1") as kp:  # one process: its CPU is the proxy's CPU
        values = [record(i) for i in range(1000)]
        total = megabytes * 1024 * 1024
        n = total // len(values[0])
        producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 5,
                             "batch.size": 256 * 1024, "compression.type": "none"})
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        producer.produce(topic, values[0])
        producer.flush(30)  # topic created, connections open
        usage = Path_("kproxy", kp.bootstrap, kp.process)
        cpu0, start = usage.cpu_seconds(), time.monotonic()
        sent = 0
        for i in range(n):
            value = values[i % len(values)]
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += len(value)
        assert producer.flush(120) == 0
        wall, cpu = time.monotonic() - start, usage.cpu_seconds() - cpu0
    return sent / wall / 1e6, cpu / (sent / 1e9)


def filter_alone() -> None:
    batch = memoryview(encode_batch([(None, record(i)) for i in range(200)]))
    mb = len(batch) / 1e6
    for name, check in (("JSON syntax", json_check(None)),
                        ("JSON Schema", json_check(load_schema("s", _schema_file())))):
        flt = RecordValidation(topics=["t"], value_check=check)
        start, runs = time.perf_counter(), 0
        while time.perf_counter() - start < 2.0:
            assert flt.check(batch) == []
            runs += 1
        per_batch = (time.perf_counter() - start) / runs
        print(f"filter alone, {name}: {per_batch / 200 * 1e6:.1f} us per 1 KiB record, "
              f"{mb / per_batch:.0f} MB/s on one core, {per_batch / mb * 1000:.0f} CPU s per GB")


def _schema_file() -> Path:
    path = Path(tempfile.mkdtemp()) / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    filter_alone()
    with tempfile.TemporaryDirectory() as d, TansuBroker(log_path=Path(d) / "t.log") as b:
        for mode in ("none", "json", "schema", "other"):
            rate, cpu = produce_run(b, mode, megabytes)
            print(f"produce {megabytes} MB, 1 KiB JSON records, filter {mode}: "
                  f"{rate:.1f} MB/s, proxy CPU {cpu:.1f} s per GB")


if __name__ == "__main__":
    main()
