"""Single-message produces at a fixed rate, timed to their delivery reports.

Shared by the bench's small-produce latency and the scrape load. The client must not
take a core from the path it measures: the schedule is kept by sleeping, and delivery
reports are served by a thread blocked in ``poll``, which wakes when one arrives.
(confluent-kafka takes ``poll``'s timeout in whole milliseconds: a loop of
``poll(0.0005)`` until the next send polls with no timeout at all and spins, which on
the two-core bench machine took one core for the client and left the broker and the
proxy the other.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def paced_produce(producer: Any, topic: str, rate: float,
                  more: Callable[[int], bool]) -> tuple[list[tuple[float, float]], int]:
    """Produce message ``i`` (its value: ``str(i)``) at ``start + i / rate`` while
    ``more(i)``; then flush. Returns (sent, latency) per delivered message, in
    ``time.perf_counter`` seconds, and the number of failed deliveries."""
    sent: list[float] = []
    delivered: list[tuple[float, float]] = []
    failed = 0

    def report(err: object, msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1
            return
        at = sent[int(msg.value())]
        delivered.append((at, time.perf_counter() - at))

    done = threading.Event()

    def serve_reports() -> None:
        while not done.is_set():
            producer.poll(0.05)  # blocks; returns as soon as a report is served

    poller = threading.Thread(target=serve_reports, name="delivery-reports", daemon=True)
    poller.start()
    start = time.perf_counter()
    i = 0
    try:
        while more(i):
            if (wait := start + i / rate - time.perf_counter()) > 0:
                time.sleep(wait)
            sent.append(time.perf_counter())
            producer.produce(topic, str(i).encode(), on_delivery=report)
            i += 1
    finally:
        done.set()
        poller.join()
    producer.flush(30)
    return delivered, failed
