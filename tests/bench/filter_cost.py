"""What a record-validation filter costs: produce throughput (MB/s) and the proxy's CPU
per GB produced, with and without it, through a real `kproxy run --workers 1` to tansu
with confluent-kafka; then the filter alone (no sockets), per record and per MB.

Run: .venv/bin/python tests/bench/filter_cost.py [MB per run, default 64]
Rows: no filter; JSON syntax on the topic; a JSON Schema on the topic; the filter
configured for other topics only (what the decode path costs a Produce it does not check).

The ACL filter's cost: .venv/bin/python tests/bench/filter_cost.py acl [MB] [repetitions]
produces then consumes 1 KiB records through `kproxy run --workers 1`, without and with
``[[acls]]`` (allow-all rules for the anonymous principal, so every request is decoded
and checked, none refused), and reports the proxy's CPU seconds per GB relayed: the
median over the repetitions and the range.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kproxy.codecs.record_batch import encode_batch
from kproxy.embedded_broker import TansuBroker
from kproxy.policies.filters.record_validation import RecordValidation, json_check, load_schema

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Path_, create_topic, workload

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
    if mode == "acl":  # everything allowed: the cost of deciding, nothing refused
        text = "".join(f'[[acls]]\nprincipal = "User:ANONYMOUS"\noperations = ["ALL"]\n'
                       f'resource = "{r}"\npattern = "*"\npermission = "allow"\n'
                       for r in ("topic", "group", "transactional_id", "cluster"))
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


def relay_run(broker: TansuBroker, mode: str, megabytes: int) -> dict[str, float]:
    """Proxy CPU seconds per GB: 1 KiB records produced, then consumed, through kproxy."""
    count = megabytes * 1024
    out = {}
    with tempfile.TemporaryDirectory() as d, kproxy_process(
            broker.bootstrap, Path(d), "--config", str(config(Path(d), mode)),
            "--workers", "1") as kp:  # one process: its CPU is the proxy's CPU
        topic = f"acl-{uuid.uuid4().hex[:6]}"
        create_topic(broker.bootstrap, topic)  # one partition: the consumer reads it all
        usage = Path_("kproxy", kp.bootstrap, kp.process)
        for kind in ("produce", "consume"):
            cpu0 = usage.cpu_seconds()
            result = workload(kind, kp.bootstrap, topic=topic, count=count, size=1024)
            assert result.get("failures", 0) == 0 and result.get("complete", True), result
            out[kind] = (usage.cpu_seconds() - cpu0) / (result["bytes"] / 1e9)
    return out


def acl_cost(megabytes: int, reps: int) -> None:
    runs: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as d, TansuBroker(log_path=Path(d) / "t.log") as b:
        for rep in range(reps):
            for mode in (("none", "acl") if rep % 2 == 0 else ("acl", "none")):
                for kind, cpu in relay_run(b, mode, megabytes).items():
                    runs.setdefault((kind, mode), []).append(cpu)
    for (kind, mode), vals in sorted(runs.items()):
        label = "[[acls]] allow-all" if mode == "acl" else "no ACLs"
        print(f"{kind} {megabytes} MB of 1 KiB records, {label}: proxy CPU "
              f"{statistics.median(vals):.1f} s per GB "
              f"(median of {len(vals)}, range {min(vals):.1f}-{max(vals):.1f})")


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
    if sys.argv[1:2] == ["acl"]:
        acl_cost(int(sys.argv[2]) if len(sys.argv) > 2 else 64,
                 int(sys.argv[3]) if len(sys.argv) > 3 else 5)
        return
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    filter_alone()
    with tempfile.TemporaryDirectory() as d, TansuBroker(log_path=Path(d) / "t.log") as b:
        for mode in ("none", "json", "schema", "other"):
            rate, cpu = produce_run(b, mode, megabytes)
            print(f"produce {megabytes} MB, 1 KiB JSON records, filter {mode}: "
                  f"{rate:.1f} MB/s, proxy CPU {cpu:.1f} s per GB")


if __name__ == "__main__":
    main()
