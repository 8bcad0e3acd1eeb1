"""`make bench`: direct to broker vs kproxy vs `tansu proxy` vs haproxy (TCP mode), in one run.

Workloads run interleaved (every repetition visits every path in a shuffled order,
so machine drift cancels), each in its own client process; medians and ratios to
direct go to docs/benchmarks.md. ``--smoke`` is the small version that `make test`
runs: one repetition, tiny workloads, the same code paths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port, tansu_binary  # noqa: E402
from tests.support import broker_port_base  # noqa: E402
from tests.support import stop_process as stop  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import admission_row  # noqa: E402
import connection_cost_row  # noqa: E402
import hostile_push_row  # noqa: E402
import p99_pair_row  # noqa: E402
import page_reporting  # noqa: E402
import rebootstrap_row  # noqa: E402
import relay_ab  # noqa: E402
import relay_floor  # noqa: E402
import scrape_workers_row  # noqa: E402
import small_request_ab  # noqa: E402
import telemetry_ab  # noqa: E402
import telemetry_p99_row  # noqa: E402
import throughput_pair_row  # noqa: E402
import tls_row  # noqa: E402
import workers_row  # noqa: E402
from bench_measure import (  # noqa: E402
    SCRAPE_ROUNDS,
    SCRAPE_SIZES,
    SCRAPE_WINDOW,
    Path_,
    cpu_clock_works,
    create_topic,
    idle_connections,
    raise_fd_limit,
    scrape_under_load,
    start,
    workload,
)
from bench_report import splice, write_report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny version for make test")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--json", default=str(ROOT / "docs" / "benchmarks.json"))
    parser.add_argument("--from-json", help="rewrite the report from a run's saved results")
    parser.add_argument("--only-scrape", action="store_true",
                        help="run only the /metrics scrape workload; its rows replace "
                        "those in --json and the report is rewritten from it")
    parser.add_argument("--only", choices=["rebootstrap", "workers", "relay-ab", "admission",
                                           "connections",
                                           "scrape-workers",
                                           "small", "floor", "tls", "telemetry-p99",
                                           "hostile-push", "p99-pair", "throughput-pair"],
                        help="run only this part; the report is rewritten from the saved run "
                        "(--json) with it, or, with none saved, gets its section")
    parser.add_argument("--relay-baseline", default=relay_ab.BASELINE,
                        help="the commit --only relay-ab compares this tree's relay with")
    parser.add_argument("--rebootstrap-runs", type=int, default=3,
                        help="runs of five blue/green swaps for the rebootstrap section")
    parser.add_argument("--workers-compare", default="1,2",
                        help="the two kproxy --workers counts of the workers section")
    parser.add_argument("--workers-clients", type=int, default=4,
                        help="clients at once in the workers section")
    parser.add_argument("--workers-proxy-cpus", metavar="LIST",
                        help="run the workers section's proxies on these cores only "
                        "(taskset -c syntax), its brokers and clients on the others")
    parser.add_argument("--telemetry-baseline", default=telemetry_ab.BASELINE,
                        help="the commit whose telemetry pushes per CPU-second this tree's "
                        "are compared with")
    args = parser.parse_args()
    if len(args.workers_compare.split(",")) != 2:
        parser.error("--workers-compare takes two counts, such as 1,2")
    if args.from_json:
        return report_from_json(args)
    # Stopped with SIGTERM (a kill, CI's time limit), the run still sets back what it
    # held: SystemExit unwinds through the ``with`` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # A smoke run measures no figure: the machine's settings stay as they are.
    held = (contextlib.nullcontext("free-page reporting not touched (smoke run)")
            if args.smoke else page_reporting.held_back())
    with held as memory:
        print(f"memory: {memory}", flush=True)
        if args.only_scrape:
            return only_scrape(args)
        if args.only:
            return only(args)
        return measure_all(args, memory)


def measure_all(args: argparse.Namespace, memory: str) -> int:
    """Every section, then the report."""
    smoke = args.smoke
    reps = 1 if smoke else args.reps
    # Long enough (seconds, not fractions of one) that start-up and scheduling noise
    # do not decide the ratios.
    n1k, n100 = (2000, 5000) if smoke else (250_000, 1_000_000)
    lat_seconds = 1.0 if smoke else 5.0
    fd_hard = raise_fd_limit()
    work = Path(os.environ.get("BENCH_TMP", "/tmp")) / f"kproxy-bench-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    # One broker per path, all started afresh for every repetition, so that every path
    # sees the same broker history: tansu keeps every message in memory and slows
    # down as it fills. haproxy cannot rewrite addresses: its broker advertises
    # haproxy's port instead of its own.
    haproxy_port = free_port()
    brokers = {name: TansuBroker(log_path=work / f"broker-{name.split()[0]}.log")
               for name in ("direct", "kproxy", "tansu proxy")}
    brokers["haproxy (tcp)"] = TansuBroker(port=free_port(),
                                           advertised=f"127.0.0.1:{haproxy_port}",
                                           log_path=work / "broker-haproxy.log")
    for b in brokers.values():
        b.start()
    paths = [Path_("direct", brokers["direct"].bootstrap)]
    try:
        kp_port, kp_http, kp_base = free_port(), free_port(), broker_port_base()
        # kproxy's default telemetry settings (pushes every 60 s), as users run it: the
        # paths are compared doing the same work. Through haproxy and tansu proxy the
        # client pushes nothing (tansu advertises GetTelemetrySubscriptions but not
        # PushTelemetry); what pushes every 100 ms cost is the telemetry-p99 section's.
        kp = start([sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
                    "--upstream", brokers["kproxy"].bootstrap,
                    "--listen", f"127.0.0.1:{kp_port}", "--http", f"127.0.0.1:{kp_http}",
                    "--broker-port-base", str(kp_base), "--node-id-range", "111-111",
                    "--log-level", "warning",
                    # The idle-connection scale test opens thousands from one address.
                    "--max-connections", "20000", "--max-connections-per-source", "20000"],
                   kp_port, work / "kproxy.log",
                   {"KPROXY_CONFIG": ""})
        paths.append(Path_("kproxy", f"127.0.0.1:{kp_port}", kp))
        tp = free_port()
        tansu_cmd = [tansu_binary(), "proxy", "--listener-url", f"tcp://127.0.0.1:{tp}",
                     "--advertised-listener-url", f"tcp://127.0.0.1:{tp}",
                     "--origin-url", f"tcp://{brokers['tansu proxy'].bootstrap}"]
        tansu = Path_("tansu proxy", f"127.0.0.1:{tp}",
                      start(tansu_cmd, tp, work / "tansu-proxy.log"))
        paths.append(tansu)
        haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if os.path.exists(haproxy_bin):
            cfg = work / "haproxy.cfg"
            cfg.write_text(
                "global\n  maxconn 9900\ndefaults\n  mode tcp\n  timeout connect 5s\n"
                "  timeout client 1h\n  timeout server 1h\n"
                f"listen kafka\n  bind 127.0.0.1:{haproxy_port}\n"
                f"  server b {brokers['haproxy (tcp)'].bootstrap}\n")
            hp = start([haproxy_bin, "-db", "-f", str(cfg)], haproxy_port, work / "haproxy.log")
            paths.append(Path_("haproxy (tcp)", f"127.0.0.1:{haproxy_port}", hp))

        def restart_tansu_proxy() -> None:
            """`tansu proxy` does not reconnect to a restarted origin; start it again."""
            assert tansu.process is not None
            stop(tansu.process)
            tansu.process = start(tansu_cmd, tp, work / "tansu-proxy.log")

        def fresh_brokers() -> None:
            """Empty brokers (same ports, same cluster id), topics made and the consume
            topic filled, for every path."""
            for b in brokers.values():
                b.stop()
                b.start()
            restart_tansu_proxy()
            for p in paths:
                for topic in ("p1k", "p100", "lat", "fill"):
                    create_topic(p.bootstrap, f"{topic}-{p.name.split()[0]}")
            for p in paths:
                workload("produce", p.bootstrap, topic=f"fill-{p.name.split()[0]}",
                         count=n1k, size=1024)

        rnd = random.Random(1)
        steps: list[tuple[str, Callable[[Path_], dict[str, float]]]] = [
            ("produce_1k", lambda p: workload("produce", p.bootstrap, count=n1k, size=1024,
                                              topic=f"p1k-{p.name.split()[0]}")),
            ("produce_100b", lambda p: workload("produce", p.bootstrap, count=n100, size=100,
                                                topic=f"p100-{p.name.split()[0]}")),
            ("consume", lambda p: workload("consume", p.bootstrap, count=n1k,
                                           topic=f"fill-{p.name.split()[0]}")),
            ("produce_latency", lambda p: workload("produce_latency", p.bootstrap, rate=1000,
                                                   seconds=lat_seconds,
                                                   topic=f"lat-{p.name.split()[0]}")),
            ("metadata_latency", lambda p: workload("metadata_latency", p.bootstrap, rate=1000,
                                                    seconds=lat_seconds)),
        ]
        for rep in range(reps):
            fresh_brokers()
            for key, run in steps:
                order = paths[:]
                rnd.shuffle(order)
                for p in order:
                    cpu0 = p.cpu_seconds()
                    result = run(p)
                    result["proxy_cpu_s"] = p.cpu_seconds() - cpu0
                    p.results.setdefault(key, []).append(result)
                    print(f"rep {rep + 1}/{reps} {key:16} {p.name:14} "
                          f"{json.dumps({k: round(v, 2) for k, v in result.items()})}",
                          flush=True)
        for p in paths[1:]:
            p.results["rss_mb"] = [{"mb": p.rss_mb()}]
        counts = [200] if smoke else [1000, min(9000, (fd_hard - 200) // 2)]
        for p in paths[1:]:
            p.results["idle"] = [{str(n): mb for n, mb in idle_connections(p, counts).items()}]
            print(f"idle {p.name}: {p.results['idle'][0]}", flush=True)
        scrapes = scrape_under_load(brokers["kproxy"], work,
                                    (2000,) if smoke else SCRAPE_SIZES,
                                    1.0 if smoke else SCRAPE_WINDOW,
                                    2 if smoke else SCRAPE_ROUNDS)
    finally:
        for p in paths:
            if p.process is not None:
                stop(p.process)
        for b in brokers.values():
            b.stop()
    # Each of these starts its own brokers and proxies.
    sections = {"scrape": scrapes, "telemetry_ab": measure_telemetry(args, work),
                "workers": measure_workers(args, work, reps, n1k),
                "relay_ab": measure_relay(args, work, reps),
                **{key: measure_row(name, work, reps, smoke)
                   for name, (_, key, _, _) in ROWS.items()}}
    # The smoke run swaps once with one client: the code path, not a figure.
    sections["rebootstrap"] = (
        rebootstrap_row.measure(work, 1, 1, ("confluent-kafka",)) if smoke
        else rebootstrap_row.measure(work, args.rebootstrap_runs, 5))
    meta = {"smoke": smoke, "reps": reps, "counts": counts,
            "elapsed": time.monotonic() - started, "fd_hard": fd_hard, "n1k": n1k,
            "n100": n100, "page_reporting": memory,
            "cpu_clock": ("each process's CPU-time clock, to the nanosecond"
                          if cpu_clock_works() else
                          "10 ms ticks from /proc (no CPU-time clock of another process "
                          "here)")}
    write_report(paths, meta, sections, args)
    return 0


def measure_telemetry(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """This tree against the baseline commit: 3 rounds of 8 s each (smoke: 1 of 2 s)."""
    return (telemetry_ab.measure(work, 1, 2.0, 200, args.telemetry_baseline) if args.smoke
            else telemetry_ab.measure(work, 3, 8.0, 2000, args.telemetry_baseline))


def measure_relay(args: argparse.Namespace, work: Path, reps: int) -> dict[str, Any]:
    """This tree's relay against the baseline's: a round per repetition."""
    return relay_ab.measure(work, reps, 2000 if args.smoke else 100_000,
                            args.relay_baseline, 1.0 if args.smoke else 3.0)


def measure_workers(args: argparse.Namespace, work: Path, reps: int,
                    n1k: int) -> dict[str, Any]:
    """Each client sends (and reads back) half a produce 1 KB workload: with four
    clients, twice the bytes of the single-client rows, a few seconds per step."""
    counts = tuple(int(n) for n in args.workers_compare.split(","))
    clients = args.workers_clients
    return workers_row.measure(work, reps, clients, max(1, n1k // 2), counts,
                               args.workers_proxy_cpus)


def report_from_json(args: argparse.Namespace) -> int:
    data = json.loads(Path(args.from_json).read_text())
    meta = data.pop("_meta")
    sections = {key: data.pop(key) for key in
                ("telemetry", "telemetry_ab", "scrape", "rebootstrap", "workers", "relay_ab",
                 *(key for _, key, _, _ in ROWS.values()))
                if key in data}
    alone = Path(args.from_json).with_name("benchmarks-rebootstrap.json")
    if sections.get("rebootstrap") is None and alone.exists():  # --only rebootstrap
        sections["rebootstrap"] = json.loads(alone.read_text())
    paths = [Path_(name, "", None, results) for name, results in data.items()]
    write_report(paths, meta, sections, args)
    return 0


def only(args: argparse.Namespace) -> int:
    """One section measured on its own, put into the saved run (if there is one, so that
    --from-json keeps it) and the report rewritten from that run, Targets included;
    with no saved run, the section alone is put into the existing report."""
    raise_fd_limit()
    work = Path(os.environ.get("BENCH_TMP", "/tmp")) / f"kproxy-bench-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    if args.only == "rebootstrap":
        data = rebootstrap_row.measure(work, args.rebootstrap_runs, 5)
        lines, heading = rebootstrap_row.section(data), rebootstrap_row.HEADING
        Path(args.json).with_name("benchmarks-rebootstrap.json").write_text(
            json.dumps(data, indent=1))
    elif args.only == "relay-ab":
        data = measure_relay(args, work, 1 if args.smoke else args.reps)
        lines, heading = relay_ab.section(data), relay_ab.HEADING
        save_section(Path(args.json), "relay_ab", data)
    elif args.only in ROWS:
        module, key, _, _ = ROWS[args.only]
        data = measure_row(args.only, work, 1 if args.smoke else args.reps, args.smoke)
        lines, heading = module.section(data), module.HEADING
        save_section(Path(args.json), key, data)
    else:
        data = measure_workers(args, work, 1 if args.smoke else args.reps,
                               2000 if args.smoke else 250_000)
        lines, heading = workers_row.section(data), workers_row.HEADING
        save_section(Path(args.json), "workers", data)
    if Path(args.json).exists():  # the whole report again, so the Targets table agrees
        args.from_json = args.json
        report_from_json(args)
    else:
        splice(Path(args.out), heading, lines)
    print("\n".join(lines))
    return 0


# Sections that measure on their own, alike: --only name -> (module, key in the saved run,
# the size a smoke run measures, the size a full run measures).
ROWS: dict[str, tuple[Any, str, float, float]] = {
    "small": (small_request_ab, "small", 1.0, 5.0),
    "telemetry-p99": (telemetry_p99_row, "telemetry_p99", 1.0, 5.0),
    "hostile-push": (hostile_push_row, "hostile_push", 1.0, 5.0),
    "p99-pair": (p99_pair_row, "p99_pair", 1.0, 5.0),
    "throughput-pair": (throughput_pair_row, "throughput_pair", 5000, 1_000_000),
    "floor": (relay_floor, "floor", 1.0, 5.0),
    "tls": (tls_row, "tls", 2000, 100_000),
    "admission": (admission_row, "admission", 20, 300),
    "connections": (connection_cost_row, "connections", 20, 500),
    "scrape-workers": (scrape_workers_row, "scrape_workers", 5_000, 250_000),
}


def measure_row(name: str, work: Path, reps: int, smoke: bool) -> dict[str, Any]:
    """One of ``ROWS``: its module's ``measure(work, reps, size)``."""
    module, _, smoke_size, full_size = ROWS[name]
    return dict(module.measure(work, reps, smoke_size if smoke else full_size))


def save_section(saved: Path, key: str, data: dict[str, Any]) -> None:
    """Into the saved run, if there is one, so that --from-json keeps the section."""
    if saved.exists():
        run = json.loads(saved.read_text())
        run[key] = data
        saved.write_text(json.dumps(run, indent=1))


def only_scrape(args: argparse.Namespace) -> int:
    """The scrape workload alone (about 8 minutes), merged into a saved full run."""
    raise_fd_limit()
    work = Path(os.environ.get("BENCH_TMP", "/tmp")) / f"kproxy-bench-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    with TansuBroker(log_path=work / "broker-scrape.log") as broker:
        rows = scrape_under_load(broker, work, SCRAPE_SIZES, SCRAPE_WINDOW, SCRAPE_ROUNDS)
    saved = Path(args.json)
    data = json.loads(saved.read_text())
    data["scrape"] = rows
    saved.write_text(json.dumps(data, indent=1))
    args.from_json = str(saved)
    return report_from_json(args)


if __name__ == "__main__":
    sys.exit(main())
