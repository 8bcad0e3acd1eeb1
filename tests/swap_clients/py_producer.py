"""A producer that sends 0, 1, 2, ... every few milliseconds and logs each delivery.

Run as its own process by ``tests/swap_clients/harness.py`` (one per client library),
so the clients' timings do not share one interpreter. Each delivery report is one
JSON line on ``--out``: ``{"s": seq, "t": wall-clock seconds, "e": error or null}``;
the first line names the library and its version, the last says how many were sent.
It stops producing when ``--stop`` exists, then waits (bounded) for every report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Generous: the test asks for zero failed deliveries, so a client must be allowed to
# retry well past any stall it might have; the stall itself is what is measured.
DELIVERY_TIMEOUT_MS = 30000
FLUSH_S = 45.0


class Log:
    """Delivery reports as JSON lines, safe to call from a client's own threads."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.reported = 0

    def write(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()

    def delivery(self, seq: int, error: object, offset: int | None = None) -> None:
        with self.lock:
            self.reported += 1
        self.write({"s": seq, "t": time.time(), "e": None if error is None else str(error),
                    "o": offset})


def paced(interval: float, stop: Path) -> Callable[[int], float | None]:
    """How long to wait before sending ``seq`` (None: stop); keeps an even rate."""
    start = time.monotonic()

    def wait(seq: int) -> float | None:
        if stop.exists():
            return None
        return max(0.0, start + seq * interval - time.monotonic())
    return wait


def metadata_age(args: argparse.Namespace) -> dict[str, int]:
    """The Python clients' metadata refresh interval, when one is asked for."""
    return {"metadata_max_age_ms": args.metadata_max_age_ms} if args.metadata_max_age_ms else {}


def run_confluent(args: argparse.Namespace, log: Log) -> int:
    import confluent_kafka

    version: Any = confluent_kafka.version()  # a string in 2.x; a (string, int) before
    log.write({"client": "confluent-kafka",
               "version": version if isinstance(version, str) else version[0],
               "librdkafka": confluent_kafka.libversion()[0]})
    producer = confluent_kafka.Producer({
        "bootstrap.servers": args.bootstrap, "client.id": args.client_id, "acks": "all",
        "linger.ms": 5, "enable.idempotence": False,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        **({"topic.metadata.refresh.interval.ms": args.metadata_max_age_ms}
           if args.metadata_max_age_ms else {}),
        # librdkafka's own account of a swap, to stderr (e.g. "broker,metadata,protocol").
        **({"debug": os.environ["SWAP_RDKAFKA_DEBUG"]}
           if os.environ.get("SWAP_RDKAFKA_DEBUG") else {})})
    def reporter(s: int) -> Callable[[Any, Any], None]:
        return lambda err, m: log.delivery(s, err, m.offset())
    wait, seq = paced(args.interval, args.stop), 0
    while (delay := wait(seq)) is not None:
        producer.poll(delay)
        producer.produce(args.topic, str(seq).encode(), on_delivery=reporter(seq))
        seq += 1
    producer.flush(FLUSH_S)
    return seq


def run_kafka_python(args: argparse.Namespace, log: Log) -> int:
    import kafka

    log.write({"client": "kafka-python", "version": kafka.__version__})
    producer = kafka.KafkaProducer(
        bootstrap_servers=args.bootstrap, client_id=args.client_id, acks="all",
        linger_ms=5, retries=2**31 - 1, enable_idempotence=False,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS, request_timeout_ms=10000,
        **metadata_age(args))
    wait, seq = paced(args.interval, args.stop), 0
    while (delay := wait(seq)) is not None:
        time.sleep(delay)
        future = producer.send(args.topic, str(seq).encode())
        future.add_callback(lambda md, s=seq: log.delivery(s, None, md.offset))
        future.add_errback(lambda exc, s=seq: log.delivery(s, repr(exc)))
        seq += 1
    producer.flush(FLUSH_S)
    producer.close(5)
    return seq


def run_aiokafka(args: argparse.Namespace, log: Log) -> int:
    import aiokafka

    log.write({"client": "aiokafka", "version": aiokafka.__version__})

    async def scenario() -> int:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=args.bootstrap, client_id=args.client_id, acks="all",
            linger_ms=5, enable_idempotence=False, request_timeout_ms=DELIVERY_TIMEOUT_MS,
            retry_backoff_ms=100, **metadata_age(args))
        await producer.start()
        wait, seq = paced(args.interval, args.stop), 0
        pending: set[asyncio.Future[Any]] = set()
        while (delay := wait(seq)) is not None:
            await asyncio.sleep(delay)
            future = await producer.send(args.topic, str(seq).encode())

            def done(f: asyncio.Future[Any], s: int = seq) -> None:
                pending.discard(f)
                error = f.exception()
                log.delivery(s, error, None if error else f.result().offset)
            pending.add(future)
            future.add_done_callback(done)
            seq += 1
        await asyncio.wait_for(producer.flush(), FLUSH_S)
        await producer.stop()
        return seq
    return asyncio.run(scenario())


CLIENTS = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python,
           "aiokafka": run_aiokafka}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--client", choices=sorted(CLIENTS), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--metadata-max-age-ms", type=int, default=None,
                        help="refresh metadata this often (the client's default otherwise)")
    args = parser.parse_args()
    with open(args.out, "w", encoding="utf-8") as out:
        log = Log(out)
        sent = CLIENTS[args.client](args, log)
        log.write({"sent": sent, "reported": log.reported})


if __name__ == "__main__":
    main()
