"""kproxy's figures in the units of kroxylicious's published sizing (issue 30).

kroxylicious publishes, for 1 KB messages under the OpenMessaging Benchmark in a pod
of one CPU: about 164 MB/s per core at saturation, 25 millicores per MB/s as its
conservative planning figure, and +0.2 ms average publish latency without filters.
Those numbers are typed in here (they are theirs, not measured by this bench); kproxy's
come from the produce 1 KB and latency rows of the same run.

Units: a proxy that spends C CPU-seconds per GB relayed spends C millicores per MB/s
(1 CPU-second per GB is 1 millicore-second per MB), and at saturation of one core it
could relay 1,000 / C MB/s.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from bench_stats import fmt, median, paired

if TYPE_CHECKING:
    from bench_measure import Path_

HEADING = "## Beside kroxylicious's published sizing"
KROXYLICIOUS = {"mb_s_per_core": 164.0, "millicores_per_mb_s": 25.0, "added_avg_ms": 0.2}


def section(paths: list[Path_], n1k: int) -> list[str]:
    by = {p.name: p for p in paths}
    kp, direct = by.get("kproxy"), by.get("direct")
    lines = [HEADING, ""]
    cpu = median(kp, "produce_1k", "proxy_cpu_s") if kp else None
    if kp is None or cpu is None or not cpu:
        return [*lines, "- not measured: no produce 1 KB row for kproxy", ""]
    per_gb = cpu / (n1k * 1024 / 1e9)
    mb_s = median(kp, "produce_1k", "mb_s")
    share = (mb_s or 0) * per_gb / 1000  # cores busy while relaying at that rate
    added_p50 = (paired(kp, direct, "produce_latency", "p50_ms", operator.sub)
                 if direct else None)
    k = KROXYLICIOUS
    lines += ["| figure | kroxylicious (published) | kproxy (this run) |", "|---|---|---|",
              f"| MB/s per core at saturation, 1 KB produce | about {k['mb_s_per_core']:.0f} "
              f"(measured, 1-CPU pod) | {1000 / per_gb:.0f} (derived: 1,000 / CPU s per GB) |",
              f"| millicores per MB/s | {k['millicores_per_mb_s']:.0f} (conservative) | "
              f"{per_gb:.2f} (measured) |",
              f"| MB/s reached in this run, and cores used for it | - | {fmt(mb_s)} MB/s "
              f"on {share:.2f} of a core |",
              f"| latency added to a publish | +{k['added_avg_ms']:.1f} ms average, no "
              f"filters | {'+' + fmt(added_p50, 2) if added_p50 is not None else '-'} ms "
              "median (single-message produce at 1,000/s, minus direct) |", "",
              "How the two setups differ, so the columns are not read as a race:", "",
              "- **Load and bound.** kroxylicious's figure is OpenMessaging Benchmark "
              "driving a proxy held to one CPU until the proxy saturates. Here the proxy "
              "is not held to a core and is not the bottleneck: one librdkafka producer "
              "(`linger.ms=5`, `acks=1`) and an in-memory tansu broker share the same two "
              "cores, and the run ends when they are done. kproxy's MB/s per core is "
              "therefore derived from its measured CPU per GB, not measured at "
              "saturation; a proxy at saturation pays more per byte for scheduling and "
              "less per byte for wake-ups, so the derived figure is an estimate.",
              "- **Proxy.** kroxylicious is Java (Netty) and decodes every request and "
              "response into objects for its filter chain; kproxy (one worker here) peeks "
              "headers, decodes only what it rewrites, and splices frames of 64 KiB or "
              "more socket to socket.",
              "- **Network and broker.** Theirs: a Kubernetes pod in front of real Kafka "
              "brokers over a real network. Here: loopback, one tansu broker in memory, "
              "client, proxy and broker on one 2-core virtual machine.",
              "- **Latency.** Theirs is the average publish latency added; here the "
              "median (p50) of single-message round trips, proxy minus direct in the same "
              "repetition, at 1,000/s: an average over a tail would add the machine's "
              "scheduling hiccups.", ""]
    return lines
