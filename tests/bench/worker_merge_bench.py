"""The supervisor's /metrics merge on a large fleet: ``python -m tests.bench.worker_merge_bench``.

Two scenes, each the two workers' expositions as the supervisor receives them:

- ``moved``: both workers hold the same 5,000 client instances (10 counter series
  each), as after every client reconnected once: the worst case, every line contested;
- ``fleet``: 250,000 client series (1,000 instances of 250 series) spread over the two
  workers, 2% of the instances on both (they reconnected): what a scrape of a large
  fleet merges.

Each against the line-by-line ``merge_expositions`` alone. Prints the best of five;
judged by a person, never asserted (the scrape's ratio at 1 and 2 workers is in
``make bench``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from kproxy.metrics.merge import merge_expositions
from kproxy.metrics.worker_merge import WorkerMerge

FAMILIES = 5  # client counter families; series per instance = FAMILIES * nodes


def exposition(instances: list[str], nodes: int, value: float) -> str:
    out = ["# HELP kproxy_requests Requests", "# TYPE kproxy_requests_total counter"]
    out += [f'kproxy_requests_total{{api="A{i}"}} {value}' for i in range(50)]
    for f in range(FAMILIES):
        out += [f"# HELP client_sent{f} Sent", f"# TYPE client_sent{f}_total counter"]
        out += [f'client_sent{f}_total{{client_instance_id="{i}",client_id="c",'
                f'node_id="{s}"}} {value}' for i in instances for s in range(nodes)]
    return "\n".join(out) + "\n"


def best(run: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def scene(name: str, a_ids: list[str], b_ids: list[str], nodes: int) -> None:
    a, b = exposition(a_ids, nodes, 1.0), exposition(b_ids, nodes, 2.0)
    facts: list[dict[str, Any] | None] = [
        {"telemetry": {"delta": False, "pushed": [[i, w] for i in ids]}}
        for w, ids in ((1, a_ids), (2, b_ids))]
    merge = WorkerMerge()
    lines = sum(t.count("\n") for t in (a, b))
    line_by_line = best(lambda: merge_expositions([a, b]))
    full = best(lambda: merge.merge([a, b], facts, [0, 0], "", 1.0))
    print(f"{name}: {lines:,} lines from 2 workers: merge_expositions "
          f"{line_by_line * 1000:.0f} ms, WorkerMerge {full * 1000:.0f} ms (best of 5)")


def main() -> None:
    ids = [str(uuid.UUID(int=i)) for i in range(5_000)]
    scene("moved", ids, ids, 2)
    fleet = [str(uuid.UUID(int=i)) for i in range(1_000)]
    both = fleet[:20]
    scene("fleet", fleet[:500] + fleet[500:520], fleet[500:] + both, 50)


if __name__ == "__main__":
    main()
