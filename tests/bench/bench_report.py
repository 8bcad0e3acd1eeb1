"""The report of `make bench`: docs/benchmarks.md and the JSON it is rewritten from.

Values are medians over the repetitions; ratios and differences are taken within each
repetition first (``paired``), so what a repetition's brokers and machine did to it
as a whole cancels out.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import admission_row
import connection_cost_row
import hostile_push_row
import p99_pair_row
import rebootstrap_row
import relay_ab
import relay_floor
import scrape_workers_row
import sizing_row
import small_request_ab
import telemetry_ab
import telemetry_p99_row
import throughput_pair_row
import tls_row
import workers_row
from bench_measure import Path_
from bench_stats import fmt, median, paired, spread
from bench_targets import idle_kb, ratio_table, targets


def write_report(paths: list[Path_], meta: dict[str, Any], sections: dict[str, Any],
                 args: argparse.Namespace) -> None:
    """docs/benchmarks.md from the measurements, and the JSON it can be rewritten from.

    ``meta``: smoke, reps, counts, elapsed, fd_hard, n1k, n100. ``sections``: what was
    measured apart from the paths (telemetry_ab, telemetry, scrape, rebootstrap,
    workers, relay_ab); any of them may be missing in a run saved by an older version."""
    direct = paths[0]
    counts, n1k, n100 = meta["counts"], meta["n1k"], meta["n100"]
    tel_ab = sections.get("telemetry_ab")

    def ratio(p: Path_, key: str, field_: str) -> str:
        r = paired(p, direct, key, field_, operator.truediv)
        return "-" if r is None else f"{r:.2f}"

    lines = [
        "# Benchmarks", "",
        "Measured by `make bench` (`tests/bench/run_bench.py`): every path in one run on one "
        "machine, workloads interleaved in a shuffled order per repetition, "
        f"{1 if meta['smoke'] else meta['reps']} repetitions, each on freshly started (empty) "
        "brokers, one per path. Values are medians over the repetitions; ratios and "
        "differences are taken within each repetition, then the median of those. "
        "Loopback, tansu in-memory broker, confluent-kafka (librdkafka) clients each in "
        "their own process. kproxy runs as one process (`--workers 1`) on these paths, "
        "haproxy with its default threads; the workers section compares one kproxy "
        "worker with two.", "",
        f"- machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Linux {platform.release()}, Python {platform.python_version()}",
        f"- run took {meta['elapsed']:.0f} s; command: `make bench`"
        + (" (smoke: tiny workloads)" if meta["smoke"] else ""),
        f"- memory: {meta.get('page_reporting', 'free-page reporting not recorded')}",
        "- CPU read as: " + meta.get("cpu_clock", "10 ms ticks from /proc (a run from before "
                                     "the report named how it read CPU)"),
        "",
    ]
    lines += [
        "## Throughput (MB/s, ratio to direct)", "",
        "| path | produce 1 KB | ratio | produce 100 B | ratio | consume 1 KB | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in paths:
        lines.append(f"| {p.name} | {fmt(median(p, 'produce_1k', 'mb_s'))} | "
                     f"{ratio(p, 'produce_1k', 'mb_s')} | "
                     f"{fmt(median(p, 'produce_100b', 'mb_s'))} | "
                     f"{ratio(p, 'produce_100b', 'mb_s')} | "
                     f"{fmt(median(p, 'consume', 'mb_s'))} | {ratio(p, 'consume', 'mb_s')} |")
    lines += ["", f"Produce: {n1k:,} messages of 1 KB and {n100:,} of 100 B, `linger.ms=5`, "
              "`acks=1`; consume: a filled partition read to its end. Spread over the "
              "repetitions (lowest to highest, MB/s):", "",
              "| path | produce 1 KB | produce 100 B | consume 1 KB |", "|---|---|---|---|"]
    for p in paths:
        lines.append(f"| {p.name} | " + " | ".join(spread(p, key) for key in (
            "produce_1k", "produce_100b", "consume")) + " |")
    lines += ["",
              "## Latency at 1,000 requests/s (ms)", "",
              "| path | produce p50 | p99 | p99.9 | Metadata p50 | p99 | p99.9 |",
              "|---|---|---|---|---|---|---|"]
    for p in paths:
        lines.append("| " + " | ".join([p.name] + [
            fmt(median(p, key, f), 3) for key in ("produce_latency", "metadata_latency")
            for f in ("p50_ms", "p99_ms", "p999_ms")]) + " |")
    lines += ["", "Produce: single-message `acks=1` requests (`linger.ms=0`) to the delivery "
              "report; Metadata: v4 round trips on one connection. Neither client spins: "
              "each sleeps to its schedule, and the producer's delivery reports are served "
              "by a thread blocked in `poll` (tests/paced_produce.py).", "",
              "## Proxy cost", "",
              "| path | CPU s per GB relayed, produce 1 KB | consume 1 KB | RSS after the run "
              "(MB) | " + " | ".join(f"KB per idle connection pair (at {n:,})" for n in counts)
              + " |", "|---|---|---|---|" + "---|" * len(counts)]
    gb = n1k * 1024 / 1e9
    for p in paths[1:]:
        idle = p.results.get("idle", [{}])[0]
        cpu = [median(p, key, "proxy_cpu_s") for key in ("produce_1k", "consume")]
        lines.append(f"| {p.name} | "
                     + " | ".join(fmt(c / gb if c is not None else None, 2) for c in cpu)
                     + f" | {fmt(p.results.get('rss_mb', [{}])[0].get('mb'))} | "
                     + " | ".join(fmt(1024 * idle[str(n)] / n, 1) if str(n) in idle else "-"
                                  for n in counts) + " |")
    largest = idle_kb(paths[1], counts)
    lines += ["", "Idle connections: each opened, answered one ApiVersions request (so the "
              "proxy holds its upstream connection too: a pair), then left idle; the "
              "proxy's resident memory before and after, over the count"
              + (f" ({largest[1]:,} is the count the target uses)" if largest else "")
              + f". This sandbox's hard limit on open files is {meta['fd_hard']:,} and "
              "cannot be raised, and each proxied connection holds two sockets, so 9,000 is "
              "the largest count measurable here.", ""]
    lines += telemetry_ab.section(tel_ab, sections.get("telemetry"))
    lines += workers_row.section(sections.get("workers"))
    lines += admission_row.section(sections.get("admission"))
    lines += connection_cost_row.section(sections.get("connections"))
    lines += relay_ab.section(sections.get("relay_ab"))
    lines += small_request_ab.section(sections.get("small"))
    lines += p99_pair_row.section(sections.get("p99_pair"))
    lines += throughput_pair_row.section(sections.get("throughput_pair"))
    lines += telemetry_p99_row.section(sections.get("telemetry_p99"))
    lines += hostile_push_row.section(sections.get("hostile_push"))
    lines += relay_floor.section(sections.get("floor"))
    lines += tls_row.section(sections.get("tls"))
    lines += sizing_row.section(paths, n1k)
    lines += scrape_section(sections.get("scrape") or [])
    lines += scrape_workers_row.section(sections.get("scrape_workers"))
    lines += rebootstrap_row.section(sections.get("rebootstrap"))
    lines += ratio_table(paths, counts, tel_ab, sections.get("workers"))
    lines += targets(paths, counts, n1k, tel_ab, sections.get("small"),
                     sections.get("scrape"), sections.get("scrape_workers"),
                     sections.get("telemetry_p99"), sections.get("p99_pair"),
                     sections.get("throughput_pair"), sections.get("hostile_push"))
    lines.append(WHY)
    Path(args.out).write_text("\n".join(lines) + "\n" + SCALING_NOTE)
    current = telemetry_ab.summary((tel_ab or {}).get("current", []))
    Path(args.json).write_text(json.dumps({p.name: p.results for p in paths} | sections | {
        "telemetry": current or sections.get("telemetry"), "_meta": meta}, indent=1))
    print(f"wrote {args.out}")


def splice(report: Path, heading: str, lines: list[str]) -> None:
    """Put a section measured on its own into an existing report, in place of its older
    version (else before the ratios and targets), leaving the rest as it was measured."""
    text = report.read_text() if report.exists() else "# Benchmarks\n"
    block = "\n".join(lines)
    if heading in text:
        start = text.index(heading)
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + block + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    elif (at := next((text.index(h) + 1 for h in ("\n## Ratios", "\n## Targets")
                      if h in text), -1)) > 0:
        text = text[:at] + block + "\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    report.write_text(text)


def scrape_section(rows: list[dict[str, float]]) -> list[str]:
    if not rows:
        return []
    lines = ["## /metrics scrapes (kproxy)", "",
             "| client series | scrape (s) | gzip body (MB) | longest loop slice, CPU (ms) "
             "| cores shared: p99 without / during scrapes (ms) | ratio (rounds) "
             "| proxy on its own core: p99 without / during (ms) | ratio (rounds) "
             "| slowest during a scrape (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ratio" not in r:  # a run saved before the rounds were measured
            r = {**r, "ratio": r["p99_scrape_ms"] / r["p99_ms"], "rounds": 1,
                 "longest_slice_cpu_ms": r.get("longest_slice_ms", 0.0)}
        shared = _p99_ratio(r, "")
        apart = _p99_ratio(r, "_apart") if "ratio_apart" in r else "- | -"
        slowest = f"{r['slowest_ms']:.0f}" if "slowest_ms" in r else "-"
        if "slowest_apart_ms" in r:
            slowest += f" / {r['slowest_apart_ms']:.0f}"
        lines.append(f"| {r['series']:,.0f} | {r['scrape_s']:.2f} | {r['gzip_mb']:.1f} | "
                     f"{r['longest_slice_cpu_ms']:.1f} | {shared} | {apart} | {slowest} |")
    lines += ["", "Series made by real telemetry requests (250 per client instance, a push "
              "interval of an hour so that none expires during the section: each size is "
              "checked held before and after its rounds); scrape: gzip, as Prometheus "
              "asks, on an otherwise idle proxy. The producer, in a "
              "process of its own, sends single-message `acks=1` requests at 1,000/s "
              f"throughout {rows[-1].get('rounds', 1):.0f} rounds of two "
              f"{rows[-1].get('window_s', 5):.0f} s windows"
              f"{' (after a warm-up pair, not compared)' if rows[-1].get('warmup') else ''}"
              ", one without scrapes, one with scrapes back to back; a request counts as "
              "during a scrape if it was sent "
              "while one was being produced. p99s are the medians over the rounds, the "
              "ratio the median of the rounds' own ratios (each round's two windows share "
              "the machine's load of the moment), with the lowest and highest round's. "
              "Measured twice: with every process free to use both cores, and with the "
              "proxy on one core, the broker, producer and scraper on the other "
              "(`tests/scrape_load.cores_apart`). On two shared cores any CPU spent moves "
              "the p99: a process of no concern to the relay, busy 5% of the time in "
              "0.5 ms bursts, put this producer's p99 at 5 to 6 ms where quiet windows "
              "read 1.7 to 3.5 ms, so the first "
              "ratio measures the machine's scheduler as much as the proxy, and the "
              "second whether requests wait for the scrape. Apart, the scraper shares the "
              "producer's core: at 10,000 series a scrape takes 0.05 s, so back to back "
              "is 20 scrapes a second, and the scraper's own CPU moves the p99 (a stand-in "
              "asking /healthz at that rate, with the same pauses between its requests, "
              "read 3.1 times the quiet p99); at 250,000 series, one scrape a second, the "
              "stand-in read 1.07 to 1.11. The exposition is produced in slices of 0.2 ms "
              "(pieces of 32 series) with a pause of about 1 ms after each, gzip (level 1) "
              "included, from label text kept per series (kproxy/metrics/exposition.py); a "
              "request arriving during a slice waits for the rest of it (at 0.5 ms slices, "
              "at 8819501 and before, the ratio at 250,000 series read 2.2 to 2.6). The "
              "longest slice "
              "is the CPU time the scrape held the loop for at once, read after the "
              "last of three scrapes on the idle proxy. Since d7458bc the sweep of "
              "expired clients that opens a scrape goes 128 clients a step (2 ms in one "
              "step at 1,000 clients), the last text, the end of the gzip stream and the "
              "young collection held back during the walk get slices of their own, and "
              "text is deflated between pieces: the longest slice went from 2.1-2.5 ms "
              "to about 1 ms at 250,000 series. A scrape right after hundreds of new "
              "clients pushed held the loop 2-7 ms in that young collection, walking the "
              "label text it had made for their series. That text is now collected as it "
              "is made, 1,024 series at a time: the first scrape after 600 new clients "
              "held the loop 0.55-0.58 ms at its longest, 2.3-3.6 ms before (scratch, "
              "docs/security.md). "
              "`.venv/bin/python tests/bench/run_bench.py --only-scrape` measures this "
              "section alone and merges it into the saved run.", ""]
    return lines


def _p99_ratio(r: dict[str, float], key: str) -> str:
    """'base / during | ratio (low-high)' for one of the two measurements."""
    spread = (f" ({r[f'ratio{key}_min']:.2f}-{r[f'ratio{key}_max']:.2f})"
              if f"ratio{key}_min" in r else "")
    return (f"{r[f'p99{key}_ms']:.2f} / {r[f'p99_scrape{key}_ms']:.2f} | "
            f"{r[f'ratio{key}']:.2f}{spread}")


# The report's prose, kept as text beside this module: the measured sections above it
# are generated, these are written by hand and kept true to the last full run.
HERE = Path(__file__).parent
WHY = (HERE / "where_the_time_goes.md").read_text()
SCALING_NOTE = (HERE / "scaling_note.md").read_text()
