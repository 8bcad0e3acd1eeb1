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
import p99_pair_row
import rebootstrap_row
import relay_ab
import relay_floor
import scrape_workers_row
import sizing_row
import small_request_ab
import telemetry_ab
import telemetry_p99_row
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
        + (" (smoke: tiny workloads)" if meta["smoke"] else ""), "",
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
    lines += telemetry_p99_row.section(sections.get("telemetry_p99"))
    lines += relay_floor.section(sections.get("floor"))
    lines += tls_row.section(sections.get("tls"))
    lines += sizing_row.section(paths, n1k)
    lines += scrape_section(sections.get("scrape") or [])
    lines += scrape_workers_row.section(sections.get("scrape_workers"))
    lines += rebootstrap_row.section(sections.get("rebootstrap"))
    lines += ratio_table(paths, counts, tel_ab, sections.get("workers"))
    lines += targets(paths, counts, n1k, tel_ab, sections.get("small"),
                     sections.get("scrape"), sections.get("scrape_workers"),
                     sections.get("telemetry_p99"), sections.get("p99_pair"))
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
    lines += ["", "Series made by real telemetry requests (250 per client instance); scrape: "
              "gzip, as Prometheus asks, on an otherwise idle proxy. The producer, in a "
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
              "second whether requests wait for the scrape. The exposition is produced in "
              "slices of 0.5 ms with a 2 ms pause after each, gzip (level 1) included, "
              "from label text kept per series (kproxy/exposition.py); the longest slice "
              "is the CPU time the scrape held the loop for at once, read after the "
              "last of three scrapes on the idle proxy. Since d7458bc the sweep of "
              "expired clients that opens a scrape goes 128 clients a step (2 ms in one "
              "step at 1,000 clients), the last text, the end of the gzip stream and the "
              "young collection held back during the walk get slices of their own, and "
              "text is deflated between pieces: the longest slice went from 2.1-2.5 ms "
              "to about 1 ms at 250,000 series. A scrape right after hundreds of new "
              "clients pushed can still hold the loop 4-7 ms in that young collection, "
              "most likely walking what their pushes left young (it did before too, "
              "inside the walk's last slice). "
              "`.venv/bin/python tests/bench/run_bench.py --only-scrape` measures this "
              "section alone and merges it into the saved run.", ""]
    return lines


def _p99_ratio(r: dict[str, float], key: str) -> str:
    """'base / during | ratio (low-high)' for one of the two measurements."""
    spread = (f" ({r[f'ratio{key}_min']:.2f}-{r[f'ratio{key}_max']:.2f})"
              if f"ratio{key}_min" in r else "")
    return (f"{r[f'p99{key}_ms']:.2f} / {r[f'p99_scrape{key}_ms']:.2f} | "
            f"{r[f'ratio{key}']:.2f}{spread}")


WHY = """### Where the time goes

Profiled on this machine with py-spy and perf during each workload.

- **Bulk produce.** Measured at this code with 100,000 messages of 1 KB through one
  worker, on the same machine under load: about 1.1 CPU-seconds per GB in user space and
  0.7-0.9 in the kernel. py-spy puts just over half of the proxy's busy samples on the
  socket calls themselves (`writev` to the broker, `recv` from the client), a tenth on
  assembling request frames that span more than one 256 KB receive chunk (a produce
  batch of several hundred KB always does), and the rest on trio's scheduling, the
  header peek and metrics. Frames inside one chunk are relayed as views, a batch of them
  with one `writev`. haproxy moves the same bytes with far fewer CPU-seconds because it
  never brings them into a Python process. Since issue 30, a frame of 64 KiB or more that
  nobody needs whole is spliced socket to socket once its header is peeked (Linux, plain
  TCP; see architecture.md): side by side with a0711bf (4 paired rounds of 200,000 1 KB
  messages, one worker each) the proxy's CPU per GB produced was 0.77 of the copy path's
  (median 0.78; rounds 0.74-1.21). On two cores every CPU-second the
  proxy takes comes out of the client's and the broker's, so any extra hop costs some
  throughput; the run-to-run spread of the broker itself is large (see the JSON).
- **Bulk produce and the kernel's queue (7d5f469).** trio sets `TCP_NOTSENT_LOWAT` to
  16 KiB on its socket streams: a send stops taking bytes once 16 KiB wait unsent. On
  the broker's socket that made a spliced 1 MB batch hit `EAGAIN` four to five times
  (counted per frame in a scratch build; the queue then held 0.1-1 MB, far below the 4
  MiB send buffer, and the wait for room came back with nothing changed but the
  unsent bytes), each a wait and a pass of trio's loop: most of bulk produce's Python.
  A standalone loopback check (splice from a pipe to a socket whose reader reads 128
  KiB at a time) counts 8.9 `EAGAIN` per MB with the cap and 0.6 without. kproxy now
  sets the option back to the system's default on both of a session's sockets
  (`transport.kernel_buffers_as_usual`). Paired with aa938e4 (8 rounds of 200,000 1 KB
  messages, one worker each): 0.64 of the CPU per GB (rounds 0.55-0.84), and beside
  haproxy in one scratch run 1.07-1.20x its CPU per GB (it was 1.75x in the same
  scratch setup before). Large responses to consumers are written the same way.
- **Consume.** A Fetch v16+ response may end with NodeEndpoints (KIP-951), which must be
  rewritten, and a rewrite changed the size prefix at the start of the frame, so kproxy
  received each such response whole before sending it on: about twice the CPU per GB
  of a spliced frame, and each response's relay time added to librdkafka's fetch loop.
  Now a large one is relayed as it arrives (architecture.md, "Large Fetch responses"):
  its skeleton walked, its records spliced, its last bytes rewritten into the same size.
  Side by side with c3dc8cf (5 paired rounds, 400,000 messages of 1 KB consumed, one
  worker each): 0.58 of the CPU per GB consumed (0.78 against 1.32 CPU-seconds) and
  1.12x the throughput. A response no handler needs whole (Fetch below v16) is spliced
  or passed through as its bytes arrive. What is left of the gap to haproxy (scratch,
  958ad52, one worker each, 250,000 messages of 1 KB consumed per round): a round's
  256 MB came in 47 Fetch responses of about 5.5 MB, which kproxy relayed with 570
  splices and 252 epoll waits in all; perf over one round put kproxy's CPU at 108 ms
  (70 in the kernel, 35 in Python) and haproxy's at 110 ms (101 in the kernel). The
  throughput ratio read 0.977 (rounds 0.958-0.996) over 7 paired rounds and 0.984 to
  1.018 in shorter runs; pipes of 256 KB instead of 1 MB (0.973) and pushes every 60 s
  instead of every 100 ms (0.988 against 0.991) changed nothing. The relay of the
  records costs no more than haproxy's; what differs is Python around them, each
  round's new connections and their first requests among it (next item).
- **A new connection** (section "What a new connection costs"). A client that
  connects, asks ApiVersions and closes cost kproxy 1.00 ms of CPU at 958ad52 (haproxy
  0.10). Two cuts since, each paired (7 rounds of 300 connections, one worker each):
  a backend's repeated ApiVersions answer is rewritten once and remembered
  (`api_versions.ApiVersionsAnswers`; 1.00 to 0.87 ms), and an upstream given as an IP
  address is connected to directly instead of through trio's per-address race
  (0.80 to 0.73 ms). perf over 2,000 such connections after both: two thirds of the
  samples in the interpreter, spread over trio's task, cancel-scope and wait machinery
  (five tasks and a park per connection) and the session's set-up and close. Two more
  since (paired the same way): a client that leaves while the express lane holds its
  session is closed where the lane hands it back, without starting the session's
  tasks again to read the end of the stream (0.77 to 0.63 ms), and an upstream given
  by name is resolved once per `upstream_dns_ttl` instead of at every connection
  (`upstream.AddressCache`; with the name in /etc/hosts, 1.13 against 0.87 ms by IP
  before, 0.87 against 0.87 after; on a real network a DNS round trip or more too).
- **Small requests.** A relayed request costs the proxy two wake-ups (request in,
  response back) and four socket calls. Measured alone side by side with 8762e0a (7
  paired rounds at 1,000/s, quiet machine): 0.245 ms of CPU per single-message produce
  (0.285 before) and 0.265 ms per Metadata round trip (0.305 before); haproxy takes about
  0.06-0.09 and a bare trio relay with no kproxy code 0.13-0.15. The cuts: one cancel
  scope serves the waits for the client's bytes (a scope per read was 16% of busy
  samples on Metadata), a response naming no broker costs no backend observation, a
  steady Metadata answer leaves the view and the listeners alone, and a receive holding
  exactly one frame skips the general frame walk. py-spy during Metadata at 1,000/s
  after them: trio 45% of the busy samples (`unrolled_run`, the epoll wait and its
  re-registration, task rescheduling), kproxy's own Python 39% in many items of 1-5%
  (the Metadata rewrite-cache key, header peek, in-order queue), the socket calls the
  rest. The section "What the event loop costs a small request" shows why no path that
  waits through trio reaches 0.17 ms: in the run that added it, relays with no proxy
  code cost 0.146 ms a Metadata round trip waiting through trio and 0.070 ms with a
  plain epoll loop (haproxy 0.046), and kproxy's own work was about 0.15 ms on top.
  So busy sessions now leave trio's waits: the express lane (architecture.md, "What a
  small request costs") relays their small frames from a thread that takes turns with
  trio. Side by side with the trio path before it (7 paired rounds at 1,000/s, one
  worker each): 0.225 against 0.312 ms per single-message produce, 0.248 against 0.320
  ms per Metadata round trip; what is left is kproxy's own work per request. The
  p99 tail comes from that CPU on two cores shared with a multi-threaded client and
  broker: the more CPU a hop takes, the likelier it waits for a time slice, so it is
  larger for kproxy than for haproxy and varies from run to run. Checked during
  single-message produce and Metadata at 1,000/s (3 rounds of 4 s each, a trio
  instrument timing every task step and a gc callback, twice): 0.04-0.11% of task steps took over
  1 ms of wall time, none of them in the proxy's background tasks (all were relay
  steps: the process descheduled mid-step), the cyclic collector ran 5 times in all
  (its one full collection, 30 ms, was the start-up's own, before `gc.freeze()` and
  before any traffic),
  and the telemetry push interval (100 ms, as the bench ran then, or the 60 s default) moved neither
  the CPU per request (0.285 against 0.283 ms) nor the p99 (a check from before the
  express lane and the sleeping producer; since then it does, see the next item).
- **The small-produce p99 since the express lane.** Before e3114d4 the latency rows'
  producer spun: it waited for its next send in `poll(0.0005)`, which confluent-kafka
  rounds down to whole milliseconds, so it polled with no timeout and took one of the
  two cores (4.2 s of CPU in a 4.3 s run), leaving the broker and the proxy the other;
  the p99 then measured the scheduler in proportion to each path's CPU. It now sleeps
  to its schedule, and a thread blocked in `poll` serves the delivery reports
  (tests/paced_produce.py; 0.6 s of CPU for the same run). What is left of kproxy's
  p99 comes mostly from telemetry: the express lane hands a connection back to trio for
  each push, which trio answers, and the produce answers behind the push wait in order
  (section "Telemetry pushes and the small-produce p99"). A trace of one such hand-back
  (a trio instrument timing task steps, the lane's events timestamped): the lane hands
  the session back 0.2 ms after the push arrives, trio's resume step (the push decoded
  and answered) takes 0.6-0.8 ms, the session parks again 2-3 ms later, and the 2 to 5
  produce requests around it take 1.5-3.5 ms. Since ca905c5 the lane answers a
  telemetry Get and a small push itself, in its place among the connection's
  requests (about 70 us of CPU for a librdkafka push, decoded as it is answered), and
  leaves only a push too large to decode at once to trio. The p99 added over direct
  with pushes every 100 ms went from +1.79 ms (full run at e940158) to +0.81 ms in
  the run above, and a paired check of the two trees (7 rounds, pushes every 100 ms)
  read +0.69 against +0.49 ms; with pushes at the 60 s default it is +0.34 ms. The
  rest is the proxy's CPU on two shared cores, as above. Not the client's own
  telemetry work: with a scratch handler that answers each push without decoding it,
  the p99 added over haproxy at 100 ms pushes read +0.14 ms, as at the 60 s default
  (+0.13), against +0.35 with the real handler (6 rounds of 5 s, one worker). A push
  is answered in its connection's turn, so its cost delays the requests behind it:
  about 280 us in the lane for a librdkafka push. Since ca26511 the usual push body is
  read in one unpack (`codecs/push_request.py`) and the status page's note of it runs
  in the lane instead of waking trio: about 160 us, and +0.20 to +0.23 ms added over
  haproxy in two scratch runs. Warm, a librdkafka push (1,436 bytes of OTLP, zstd)
  costs the handler 24 us (a loop of 3,000 in one process), so most of the 160 us in
  place is the cost of running cold code once every 100 ms. What is left beside
  haproxy at 1,000 single-message produces a second (perf, 5 s, pushes every 60 s):
  0.132 ms of CPU per request against 0.059 (kernel 0.065 against 0.054, the
  interpreter 0.061), eight system calls per request (two each of `epoll_wait`,
  `read`, `writev` and `epoll_ctl`), and as many context switches as haproxy's (the
  lane's thread: 9,999 voluntary and 5,186 involuntary in the 5 s; haproxy's: 9,999
  and 4,545). The tail comes from those 60 us of Python per request on cores shared
  with the client and the broker. Until this run the bench's paths ran kproxy with
  pushes every 100 ms: ten requests a second that kproxy decoded and exported and
  that no other path carried (through haproxy and tansu proxy librdkafka pushes
  nothing, since tansu does not advertise PushTelemetry). They now run kproxy's
  defaults, as users do; what pushes every 100 ms add is measured in its own section
  and shown in the Targets table beside the p99 target, not hidden by it.
- **Tried for issue 30 and left out** (each measured side by side, one worker each):
  the express lane splicing large requests itself, so that a producer's batches never
  wait through trio, took 1.09x the CPU per GB of trio's splice path (5 paired rounds of
  300,000 1 KB messages, telemetry off); strace showed why: trio's path waits only about
  2.5 times per 440 KB request, so there was little to save. Compiling 18 of the
  request path's modules with mypyc: 0.26-0.27 ms of CPU per Metadata round trip against
  0.27-0.30 ms interpreted, and produce through the compiled build stalled (p99 0.8-2.2
  s, not investigated). `SO_RCVLOWAT` on the socket a frame is spliced from: 1.08x the
  CPU per GB. A cheaper `Turns` (the turn handed over with two locks instead of a
  condition variable) measured 0.8 us less per lane turn in a warm microbenchmark and
  was left out then; the next item explains why the figure in place is larger.
- **The lane's cost per small request, taken apart.** At 1,000 Metadata round trips a
  second, per-thread CPU (/proc) puts all of kproxy's CPU on the lane's thread (trio's
  did not move over a 5 s run); perf puts 75% of it in the interpreter; strace counts
  the same system calls a request as the floor relay's, plus one `epoll_ctl` re-arm (2
  `epoll_wait`, 2 `read`, 2 `writev`, 2 `epoll_ctl`). A scratch build whose lane relayed
  raw bytes (no framing, no policy; 2 to 5 scratch runs of 5 s, one worker) cost
  0.14-0.17 ms a round trip with the turn and the session dispatch, about 0.10 without
  them: kproxy's structure was about 0.05 over the floor relays, its per-request work
  about 0.13. cProfile counted 209 calls through 102 distinct functions a round trip,
  about 0.8 us a call. My reading, not proven: at this rate each request finds the
  caches cold (the client and the broker ran in between), so a call costs several times
  a warm microbenchmark's figure, and the number of functions a request runs through
  counts more than their work. Cut in 4fe3b2e, a4c4257 and abdf454: the turn is a plain
  lock taken without waiting when free and not asked for (the condition variable only
  for a side that must wait; `test_express_turns` still sees strict alternation when
  both are busy), no idle-deadline heap push per relayed request (the entry is put back
  when it comes due), the lane counters as plain numbers, one unpack for a response's
  correlation id and a Produce request's acks: 170 calls through 84 functions. Then in
  4e55ba0, e17c6a9 and 2a31a55: the rewrite cache's key made in one call (no frozen
  dataclass, no copy of the backend's bytes), one call for whether a handler wants a
  response and what it makes of it, a write of one buffer without the general walk, and
  a Produce answer that names no broker told before the general rewrite: a Metadata
  round trip now runs 154 calls through 82 functions, a single-message produce 142
  through 65. Paired with the tree before each step (6 rounds, both proxies at once):
  0.259 against 0.288 ms per Metadata round trip and 0.246 against 0.286 per produce for
  the first three, 0.206 against 0.224 and 0.193 against 0.212 for the next two; the
  last alone, in a noisier hour, 0.154 against 0.166 per produce (5 rounds). The
  machine's speed moves every absolute figure: haproxy's own CPU per Metadata round trip
  read 0.052 ms in the full run at 8da0eb7 and 0.036 in the floor run at 2a31a55 an hour
  later. So the 0.17 ms target is read with the ratios beside it: 0.46 and 0.49 of
  3ff5d17's CPU in the same rounds (0.62 and 0.62 in the full run before these changes,
  0.51 and 0.48 in the one at 8da0eb7), and 4.26x haproxy's in the floor table (4.53x
  before, 4.12x at 8da0eb7). What is left is spread over the same kind of glue (the
  lane's dispatch and checks, the Metadata handler's backend view check, the in-order
  slot, the metrics); halving it again takes a relay core that is not interpreted, one
  function a request.
- **TLS.** trio's `SSLStream.receive_some` returns one TLS record (16 KiB at most) a
  call, each call a trip through the scheduler: client-TLS produce ran at 0.22 of
  haproxy's throughput and 10.9x its CPU per GB (strace: about 24 `epoll_wait` per 64 KiB
  `recvfrom`). The relay now decrypts every record the socket already delivered in one
  call (`StreamTransport._decrypted`); measured alone, 3 repetitions: 0.98 of haproxy's
  throughput and 1.72x its CPU per GB.
- **Telemetry.** A small push (up to 16 KB decompressed and 128 points) is decoded in
  one parse and answered at once; the next push of the same shape from the same client
  is read by position and lands in the same series without a decode. Larger pushes
  are decompressed on a worker thread and decoded in paced steps off the request path.
- **Memory.** An idle proxied connection is parked once it has been idle 0.25 s: it
  holds two sockets and its session's state, and no trio task (`proxy/session/parked/parking.py`).
"""


SCALING_NOTE = """
## Scaling

- **Message size.** The relay does per-frame work (read the header, keep the order) and
  per-byte work (the kernel copies; kproxy itself hands received buffers on as views). Large
  batches amortise the per-frame part: 1 KB messages with `linger.ms=5` cost the proxy far
  less CPU per byte than 100 B messages or `linger.ms=0`.
- **Connections.** Each client connection holds one upstream connection (two sockets) and a
  small session (two tasks while it works, none once parked after 0.25 s idle); idle
  connections cost memory, not CPU. Raise the open-file limit to twice the connections
  you expect.
- **Partitions.** Fetch (v16+) and Produce (v10+) responses are walked partition by
  partition to reach their tagged fields (records are skipped by length, never copied;
  a large Fetch response's records are spliced past the process as they arrive): cost
  grows with partitions per response, not with bytes.
- **More than one core.** `kproxy run` starts one worker process per CPU it may use
  (`--workers N`; the default is its CPU affinity, capped by a cgroup CPU quota such as
  a Kubernetes CPU limit, rounded up), all bound to the same ports (SO_REUSEPORT): the
  kernel spreads new connections over them, and a connection and its upstream stay in
  one worker for their life. A supervisor restarts a worker that dies and serves one
  combined `/metrics`. One busy connection gains nothing from more workers; many
  connections can use them all. The workers section above measures one worker against two here, and
  says how to measure a bigger machine. Across hosts, run replicas behind one Service
  (nothing is shared between processes but the ports). For a sidecar, `--workers 1` is
  plenty.
"""
