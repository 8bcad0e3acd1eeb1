"""The supervisor's /metrics merge on a large fleet: ``python -m tests.bench.worker_merge_bench``.

Two workers each holding the same 5,000 client instances (10 counter series each, as
after every client reconnected once) and 50 proxy counters: the line-by-line merge
alone against the full merge (facts, newest push per instance, counter floors). Prints
the best of five of each; judged by a person, never asserted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from kproxy.metrics.merge import merge_expositions
from kproxy.metrics.worker_merge import WorkerMerge


def exposition(instances: list[str], per: int, value: float) -> str:
    out = ["# HELP kproxy_requests Requests", "# TYPE kproxy_requests_total counter"]
    out += [f'kproxy_requests_total{{api="A{i}"}} {value}' for i in range(50)]
    out += ["# HELP client_sent Sent", "# TYPE client_sent_total counter"]
    out += [f'client_sent_total{{client_instance_id="{i}",client_id="c",node_id="{s}"}} '
            f"{value}" for i in instances for s in range(per)]
    return "\n".join(out) + "\n"


def best(run: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    ids = [str(uuid.UUID(int=i)) for i in range(5_000)]
    a, b = exposition(ids, 10, 1.0), exposition(ids, 10, 2.0)
    facts: list[dict[str, object] | None] = [
        {"telemetry": {"delta": False, "pushed": [[i, w] for i in ids]}} for w in (1, 2)]
    merge = WorkerMerge()
    line_by_line = best(lambda: merge_expositions([a, b]))
    full = best(lambda: merge.merge([a, b], facts, [0, 0], "", 1.0))
    print(f"2 workers x 50,000 client series: merge_expositions {line_by_line * 1000:.0f} ms, "
          f"WorkerMerge {full * 1000:.0f} ms (best of 5)")


if __name__ == "__main__":
    main()
