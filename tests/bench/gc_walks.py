"""What a worker's full garbage collections cost with a large telemetry fleet held.

Two proxies side by side in front of one broker (``--workers 1`` each): one at the
default ``gc_sweep_interval`` (each full collection walks what was made since the
last; the whole heap once an interval), one with it 0 (every full collection walks
everything, as CPython runs it). Each is filled with the same fleet through real
telemetry requests (``tests/scrape_load.fill_series``: GetTelemetrySubscriptions, then
a push of ``series`` series per instance), then scraped back to back for ``window``
seconds, as Prometheus would be by many scrapers. The figures are the proxy's own:
``kproxy_gc_full_collection_seconds`` over the window (collections, mean, the
histogram's upper bound of the longest) and ``kproxy_scrape_longest_slice_cpu_seconds``
of each scrape (median and highest).

    .venv/bin/python tests/bench/gc_walks.py [instances] [series per instance] [window s]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from bench_measure import start  # noqa: E402

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.scrape_load import KEEP_FILLED_FLEET, fill_series, metric_value, scrape  # noqa: E402
from tests.support import broker_port_base, stop_process  # noqa: E402

HISTOGRAM = "kproxy_gc_full_collection_seconds"
CONFIGS = {"walks what is new (default)": [], "every walk whole (gc_sweep_interval 0)":
           ["--gc-sweep-interval", "0"]}


def histogram(http: int) -> dict[str, dict[str, float]]:
    """Per walk: count, sum, and cumulative count by bucket bound."""
    out: dict[str, dict[str, float]] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=300) as resp:
        for line in resp.read().decode().splitlines():
            if not line.startswith(HISTOGRAM):
                continue
            name, value = line.rsplit(" ", 1)
            walk = name.split('walk="', 1)[1].split('"', 1)[0]
            figures = out.setdefault(walk, {})
            if name.startswith(HISTOGRAM + "_bucket"):
                figures["le " + name.split('le="', 1)[1].split('"', 1)[0]] = float(value)
            elif name.startswith(HISTOGRAM + "_count"):
                figures["count"] = float(value)
            elif name.startswith(HISTOGRAM + "_sum"):
                figures["sum"] = float(value)
    return out


def window_figures(before: dict[str, dict[str, float]],
                   after: dict[str, dict[str, float]]) -> str:
    """Collections in the window per walk: how many, their mean, the longest's bound."""
    parts = []
    for walk, figures in sorted(after.items()):
        old = before.get(walk, {})
        count = figures.get("count", 0.0) - old.get("count", 0.0)
        if not count:
            continue
        total = figures.get("sum", 0.0) - old.get("sum", 0.0)
        bounds = sorted((float(k[3:]), v - old.get(k, 0.0)) for k, v in figures.items()
                        if k.startswith("le ") and k != "le +Inf")
        below = [bound for bound, n in bounds if n >= count]
        longest = f"<= {1000 * below[0]:g} ms" if below else "> 1 s"
        parts.append(f"{walk}: {count:.0f}, mean {1000 * total / count:.1f} ms, "
                     f"longest {longest}")
    return "; ".join(parts) or "none"


def main(instances: int = 20_000, per_instance: int = 3, window: float = 60.0) -> None:
    work = Path(f"/tmp/kproxy-gc-walks-{int(time.time())}")
    work.mkdir(parents=True)
    with TansuBroker(log_path=work / "broker.log") as broker:
        procs: dict[str, tuple[subprocess.Popen[bytes], int, int]] = {}
        try:
            for name, extra in CONFIGS.items():
                port, http = free_port(), free_port()
                procs[name] = (start(
                    [sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
                     "--upstream", broker.bootstrap, "--listen", f"127.0.0.1:{port}",
                     "--http", f"127.0.0.1:{http}", "--broker-port-base",
                     str(broker_port_base()), "--node-id-range", "111-111",
                     "--telemetry-max-series", str(instances * per_instance),
                     "--telemetry-max-instance-bytes", str(1 << 30), *KEEP_FILLED_FLEET,
                     "--log-level", "warning", *extra],
                    port, work / f"kproxy-{len(procs)}.log", {"KPROXY_CONFIG": ""}),
                    port, http)
            for name, (_, port, http) in procs.items():
                started = time.monotonic()
                fill_series(f"127.0.0.1:{port}", instances, per_instance)
                scrape(http)  # every series labelled
                held = metric_value(http, "kproxy_telemetry_series")
                print(f"{name}: {held:,.0f} series held, filled in "
                      f"{time.monotonic() - started:.0f} s", flush=True)
            # Both windows side by side in time would share the cores; one after the
            # other, in the order given, each alone.
            for name, (_, _, http) in procs.items():
                before, slices = histogram(http), []
                until = time.monotonic() + window
                while time.monotonic() < until:
                    scrape(http)
                    slices.append(1000 * metric_value(
                        http, "kproxy_scrape_longest_slice_cpu_seconds"))
                print(f"{name}: full collections in {window:g} s of back-to-back scrapes: "
                      f"{window_figures(before, histogram(http))}; longest slice of a scrape "
                      f"(CPU) median {statistics.median(slices):.1f} ms, highest "
                      f"{max(slices):.1f} ms over {len(slices)} scrapes", flush=True)
        finally:
            for proc, _, _ in procs.values():
                stop_process(proc)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *(float(a) for a in sys.argv[3:4]))
