"""TLS through kproxy and through haproxy (TCP mode), both in one run (issue 30).

Four paths, each in front of its own fresh tansu broker:

- kproxy, client TLS: the client speaks TLS to kproxy (``--tls-cert``), kproxy plain
  TCP to the broker.
- haproxy, client TLS: haproxy terminates TLS in TCP mode (``bind ... ssl crt``) and
  relays plain TCP.
- kproxy, upstream TLS: plain TCP from the client, TLS from kproxy to the broker
  (``--upstream-tls``).
- haproxy, upstream TLS: plain TCP in, TLS out (``server ... ssl``).

tansu's own TLS listener does not complete a handshake with librdkafka (see
``tests/tls_front.py``), so on the upstream-TLS paths the broker's TLS side is an
haproxy TLS TERMINATOR (a named stand-in, not measured) in front of the broker, which
advertises the terminator's port. Only the proxy under test is counted: its CPU time
over the workload, per GB relayed. Certificates are made by trustme for 127.0.0.1.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_measure import Path_, create_topic, start, workload
from bench_stats import fmt, median_range

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import broker_port_base, stop_process  # noqa: E402

HEADING = "## TLS: kproxy and haproxy (TCP mode)"
PATHS = ("kproxy, client TLS", "haproxy, client TLS", "kproxy, upstream TLS",
         "haproxy, upstream TLS")


def certificates(work: Path) -> dict[str, Path]:
    """A CA, and a server certificate for 127.0.0.1: key and chain apart (kproxy) and in
    one PEM (haproxy's ``crt``)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": work / "tls-ca.pem", "cert": work / "tls-cert.pem",
             "key": work / "tls-key.pem", "combined": work / "tls-combined.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(files["cert"]), append=True)
    cert.private_key_pem.write_to_path(str(files["key"]))
    files["combined"].write_bytes(files["cert"].read_bytes() + files["key"].read_bytes())
    return files


def haproxy(work: Path, name: str, port: int, backend: str, bind_ssl: str = "",
            server_ssl: str = "", *, splice: bool = False) -> Any:
    """haproxy in TCP mode in front of ``backend``; ``splice``: moving bytes socket to
    pipe to socket in both directions (``option splice-request``/``splice-response``),
    as kproxy does with a large frame's rest, instead of through its 16 KB buffers."""
    cfg = work / f"haproxy-{name}.cfg"
    spliced = "  option splice-request\n  option splice-response\n" if splice else ""
    cfg.write_text("global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 5s\n"
                   f"  timeout client 1h\n  timeout server 1h\n{spliced}"
                   f"listen kafka\n  bind 127.0.0.1:{port}{bind_ssl}\n"
                   f"  server b {backend}{server_ssl}\n")
    return start([shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", str(cfg)],
                 port, work / f"haproxy-{name}.log")


def kproxy(work: Path, name: str, upstream: str, extra: list[str]) -> tuple[Any, int]:
    port, http = free_port(), free_port()
    proc = start([sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
                  "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
                  "--http", f"127.0.0.1:{http}", "--broker-port-base",
                  str(broker_port_base()), "--node-id-range", "111-111",
                  "--log-level", "warning", *extra],
                 port, work / f"kproxy-{name}.log", {"KPROXY_CONFIG": ""})
    return proc, port


def measure(work: Path, reps: int, count: int) -> dict[str, Any]:
    """Per path: produce and consume 1 KB figures of each repetition."""
    if not (shutil.which("haproxy") or os.path.exists("/usr/sbin/haproxy")):
        return {"error": "haproxy is not installed"}
    tls = certificates(work)
    ca_only = f" ssl verify required ca-file {tls['ca']}"
    out: dict[str, Any] = {"count": count, "reps": reps, "paths": {p: [] for p in PATHS}}
    procs: list[Any] = []
    brokers: list[TansuBroker] = []
    try:
        sides: list[tuple[str, Path_, TansuBroker, bool]] = []
        # kproxy, client TLS
        b = TansuBroker(log_path=work / "broker-tls-1.log")
        brokers.append(b)
        b.start()
        proc, port = kproxy(work, "client-tls", b.bootstrap,
                            ["--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"])])
        procs.append(proc)
        sides.append((PATHS[0], Path_(PATHS[0], f"127.0.0.1:{port}", proc), b, True))
        # haproxy, client TLS: its broker advertises haproxy's port
        port = free_port()
        b = TansuBroker(port=free_port(), advertised=f"127.0.0.1:{port}",
                        log_path=work / "broker-tls-2.log")
        brokers.append(b)
        b.start()
        proc = haproxy(work, "client-tls", port, b.bootstrap,
                       bind_ssl=f" ssl crt {tls['combined']}")
        procs.append(proc)
        sides.append((PATHS[1], Path_(PATHS[1], f"127.0.0.1:{port}", proc), b, True))
        # kproxy, upstream TLS: the broker advertises its TLS terminator
        term = free_port()
        b = TansuBroker(port=free_port(), advertised=f"127.0.0.1:{term}",
                        log_path=work / "broker-tls-3.log")
        brokers.append(b)
        b.start()
        procs.append(haproxy(work, "terminator-3", term, b.bootstrap,
                             bind_ssl=f" ssl crt {tls['combined']}"))
        proc, port = kproxy(work, "upstream-tls", f"127.0.0.1:{term}",
                            ["--upstream-tls", "on", "--upstream-tls-ca", str(tls["ca"])])
        procs.append(proc)
        sides.append((PATHS[2], Path_(PATHS[2], f"127.0.0.1:{port}", proc), b, False))
        # haproxy, upstream TLS: plain in, TLS to the terminator; the broker advertises
        # the client-facing haproxy
        term, port = free_port(), free_port()
        b = TansuBroker(port=free_port(), advertised=f"127.0.0.1:{port}",
                        log_path=work / "broker-tls-4.log")
        brokers.append(b)
        b.start()
        procs.append(haproxy(work, "terminator-4", term, b.bootstrap,
                             bind_ssl=f" ssl crt {tls['combined']}"))
        proc = haproxy(work, "upstream-tls", port, f"127.0.0.1:{term}", server_ssl=ca_only)
        procs.append(proc)
        sides.append((PATHS[3], Path_(PATHS[3], f"127.0.0.1:{port}", proc), b, False))
        rnd = random.Random(5)
        for rep in range(reps):
            order = sides[:]
            rnd.shuffle(order)
            for name, side, _broker, client_tls in order:
                topic = f"tls-{rep}-{name.split(',')[0]}-{'c' if client_tls else 'u'}"
                if client_tls:
                    os.environ["BENCH_TLS_CA"] = str(tls["ca"])
                try:
                    # Through the path: a broker advertises the address its clients use.
                    create_topic(side.bootstrap, topic)
                    cpu0 = side.cpu_seconds()
                    produced = workload("produce", side.bootstrap, topic=topic, count=count,
                                        size=1024)
                    cpu1 = side.cpu_seconds()
                    consumed = workload("consume", side.bootstrap, topic=topic, count=count)
                    cpu2 = side.cpu_seconds()
                finally:
                    os.environ.pop("BENCH_TLS_CA", None)
                gb = count * 1024 / 1e9
                row = {"produce_mb_s": produced["mb_s"], "consume_mb_s": consumed["mb_s"],
                       "produce_cpu_s_per_gb": (cpu1 - cpu0) / gb,
                       "consume_cpu_s_per_gb": (cpu2 - cpu1) / gb}
                out["paths"][name].append(row)
                print(f"tls rep {rep + 1}/{reps} {name:22} " + ", ".join(
                    f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    finally:
        for proc in procs:
            stop_process(proc)
        for b in brokers:
            b.stop()
    return out


def section(data: dict[str, Any] | None) -> list[str]:
    lines = [HEADING, ""]
    if not data or data.get("error") or not any(data.get("paths", {}).values()):
        return [*lines, f"- not measured: {(data or {}).get('error', 'no repetitions')}", ""]
    paths = data["paths"]
    keys = ("produce_mb_s", "consume_mb_s", "produce_cpu_s_per_gb", "consume_cpu_s_per_gb")
    lines += ["| path | produce 1 KB (MB/s) | consume 1 KB (MB/s) | CPU s per GB, produce | "
              "CPU s per GB, consume |", "|---|---|---|---|---|"]
    for name in PATHS:
        rows = paths.get(name) or []
        vals = [fmt(statistics.median(r[k] for r in rows), 2) if rows else "-" for k in keys]
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    lines += ["", "| kproxy / haproxy, paired per repetition | produce MB/s | consume MB/s | "
              "CPU per GB, produce | CPU per GB, consume |", "|---|---|---|---|---|"]
    for which in ("client TLS", "upstream TLS"):
        k, h = paths.get(f"kproxy, {which}") or [], paths.get(f"haproxy, {which}") or []
        cells = []
        for key in keys:
            r = [a[key] / b[key] for a, b in zip(k, h, strict=False) if b[key]]
            cells.append(median_range(r))
        lines.append(f"| {which} | " + " | ".join(cells) + " |")
    lines += ["", f"{data['reps']} repetition(s), the four paths in a shuffled order; each: "
              f"produce {data['count']:,} messages of 1 KB (`linger.ms=5`, `acks=1`), then "
              "read them back, through the path; CPU is the proxy's own (user and "
              "system) over each workload, per GB relayed. Client TLS: librdkafka speaks "
              "TLS to the proxy, which relays plain TCP to the broker (haproxy: `bind ... "
              "ssl crt`, TCP mode). Upstream TLS: plain TCP from the client, TLS from the "
              "proxy to the broker (haproxy: `server ... ssl`); the broker's TLS side is "
              "an haproxy TLS terminator (tansu's own TLS listener does not complete a "
              "handshake with librdkafka), not counted. kproxy keeps the copy path on a "
              "TLS connection (no splice: see architecture.md). In brackets the lowest and "
              "highest repetition's ratio. `.venv/bin/python tests/bench/run_bench.py "
              "--only tls` measures this section alone.", ""]
    return lines
