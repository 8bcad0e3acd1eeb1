"""A small request's cost: proxy CPU per request at 1,000/s, this tree against a baseline.

Issue 30 asks for at most 0.17 ms of proxy CPU per single-message produce and per
Metadata round trip at 1,000 requests/s. Both proxies run at once, one process each
(``--workers 1``), in front of one broker (``baseline_ab``); each round runs both
workloads through each, in a shuffled order, and reads each proxy's CPU time (user and
system, from /proc) around them: CPU, not wall time, so what other processes on the
machine do changes the figure little, and the ratios are taken per round.

``--profile`` (``python tests/bench/small_request_ab.py --profile``) instead records
py-spy on one proxy during both workloads and prints where its busy samples are.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from baseline_ab import side_by_side
from bench_measure import Path_, create_topic, workload
from bench_stats import measured_section, median_range

BASELINE = "3ff5d17"  # main before issue 30's second deliverable
HEADING = "## A small request's cost"
TARGET_MS = 0.17
RATE = 1000
# Per round: (name in the report, key of the CPU figure, key of the p99).
KINDS = {"produce": ("single-message produce", "produce_cpu_ms", "produce_p99_ms"),
         "metadata": ("Metadata round trip", "metadata_cpu_ms", "metadata_p99_ms")}


def one_round(side: Path_, seconds: float) -> dict[str, float]:
    topic = f"small-{uuid.uuid4().hex[:8]}"
    create_topic(side.bootstrap, topic)
    n = RATE * seconds
    cpu0 = side.cpu_seconds()
    produced = workload("produce_latency", side.bootstrap, rate=RATE, seconds=seconds,
                        topic=topic)
    cpu1 = side.cpu_seconds()
    meta = workload("metadata_latency", side.bootstrap, rate=RATE, seconds=seconds)
    cpu2 = side.cpu_seconds()
    return {"produce_cpu_ms": 1000 * (cpu1 - cpu0) / n, "produce_p99_ms": produced["p99_ms"],
            "metadata_cpu_ms": 1000 * (cpu2 - cpu1) / n, "metadata_p99_ms": meta["p99_ms"]}


def measure(work: Path, rounds: int, seconds: float = 5.0,
            baseline: str = BASELINE) -> dict[str, Any]:
    return side_by_side(work, "small", baseline, rounds, lambda s: one_round(s, seconds),
                        {"seconds": seconds, "rate": RATE})


def ratios(data: dict[str, Any], key: str) -> list[float]:
    return [c[key] / b[key] for c, b in zip(data["current"], data["base"], strict=False)
            if b[key]]


def current_ms(data: dict[str, Any] | None, kind: str) -> float | None:
    """This tree's median CPU per request (ms) for ``kind``, if measured."""
    if not data or not data.get("current"):
        return None
    return statistics.median(float(r[KINDS[kind][1]]) for r in data["current"])


@measured_section(HEADING, "current")
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    base = data["baseline_commit"][:7]
    lines += [f"| proxy CPU per request at 1,000/s (ms) | this tree ({data['current_commit']})"
              f" | {base} | ratio, median (lowest-highest) | p99 this tree / {base} (ms) |",
              "|---|---|---|---|---|"]
    for name, cpu_key, p99_key in KINDS.values():
        r = ratios(data, cpu_key)
        cur = statistics.median(x[cpu_key] for x in data["current"])
        old = statistics.median(x[cpu_key] for x in data["base"])
        p_cur = statistics.median(x[p99_key] for x in data["current"])
        p_old = statistics.median(x[p99_key] for x in data["base"])
        lines.append(f"| {name} | {cur:.3f} | {old:.3f} | {median_range(r)} "
                     f"| {p_cur:.2f} / {p_old:.2f} |")
    lines += ["", f"{len(data['current'])} paired round(s); each: single-message `acks=1` "
              f"produce, then Metadata v4 round trips, each at {RATE:,}/s for "
              f"{data['seconds']:g} s, through each proxy in a shuffled order; the proxy's "
              "CPU time (user and system, /proc) over the workload, divided by the "
              "requests sent (the client's start-up requests are included, a few per "
              "workload). Both proxies ran at once, `--workers 1` each, in front of one "
              f"broker. The baseline is the tree of `{data['baseline_commit']}`:", "",
              f"- this tree: `{data['current_import']}`",
              f"- baseline: `{data['base_import']}`", ""]
    return lines


def profile(work: Path, seconds: float, out: Path) -> None:
    """py-spy on one kproxy (this tree, ``--workers 1``) during both workloads."""
    from baseline_ab import launch

    from kproxy.embedded_broker import TansuBroker
    from tests.support import stop_process

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with TansuBroker(log_path=work / "broker-profile.log") as broker:
        side, _ = launch("profiled", broker.bootstrap, work, None, ["--workers", "1"], "prof")
        assert side.process is not None
        try:
            topic = f"small-{uuid.uuid4().hex[:8]}"
            create_topic(side.bootstrap, topic)
            for kind in ("produce_latency", "metadata_latency"):
                raw = out.with_name(f"{out.stem}-{kind}.txt")
                rec = subprocess.Popen([spy, "record", "--format", "raw", "--rate", "1000", "--gil",
                                        "--nonblocking", "--pid", str(side.process.pid),
                                        "--output", str(raw)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                opts: dict[str, object] = {"rate": RATE, "seconds": seconds}
                if kind == "produce_latency":
                    opts["topic"] = topic
                workload(kind, side.bootstrap, **opts)
                rec.send_signal(2)
                rec.wait(timeout=30)
                print(f"== {kind}: {raw}")
                print(summarise(raw))
        finally:
            stop_process(side.process)


def summarise(raw: Path, top: int = 25) -> str:
    """Self samples by frame, and by kind of work, from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        n = int(count)
        total += n
        leaf = frames[-1]
        own[leaf.split(" (")[0] + " (" + leaf.split("/")[-1]] += n
        kinds[kind_of(frames)] += n
    rows = [f"busy samples: {total}"]
    rows += [f"  {100 * n / total:5.1f}%  {k}" for k, n in kinds.most_common()]
    rows += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    return "\n".join(rows)


def kind_of(frames: list[str]) -> str:
    """Which kind of work a stack's leaf is doing (py-spy names each frame
    ``function (path:line)``)."""
    leaf = frames[-1]
    func, _, where = leaf.partition(" (")
    if "transport.py" in where and func.split(".")[-1] in SOCKET_CALLS:
        return "socket calls (read, writev)"
    if func.endswith("get_events"):
        return "trio: epoll_wait"
    if "trio/" in where or "outcome" in where or "attrs generated" in where:
        return "trio: scheduling, cancel scopes, registrations"
    if "metrics/" in where or "latency_sketch" in where or "prometheus_client" in where:
        return "metrics"
    if where.startswith(("proxy/", "codecs/", "policies/")):
        return "kproxy Python"
    return "other (stdlib: contextlib, struct, ...)"


SOCKET_CALLS = ("send_now", "send_rest", "receive_now", "receive", "receive_into_now",
                "receive_into")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--out", default="/tmp/kproxy-profile")
    args = parser.parse_args()
    work = Path(os.environ.get("BENCH_TMP", "/tmp")) / f"kproxy-small-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    if args.profile:
        profile(work, args.seconds, Path(args.out))
        return 0
    data = measure(work, args.rounds, args.seconds, args.baseline)
    print("\n".join(section(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
