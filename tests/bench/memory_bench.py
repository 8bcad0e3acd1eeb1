"""Peak proxy memory with slow readers of 50 MB fetch responses: kproxy vs haproxy (TCP).

Part of `make bench`; writes docs/benchmarks-memory.md (and .json). 10, 20 and 40
connections each send one Fetch v4 request and read the 50 MB response at a fixed
rate; the proxy's resident memory is sampled while they read. The broker is the
scripted FAKE BROKER (tests/fake_broker.py, big-fetch mode): tansu caps a fetch
response at about 5 MB. Fetch v4 is relayed without rewriting, so kproxy passes it
through; the run also reports kproxy's own budget figures from /metrics.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import free_port, wait_for_port  # noqa: E402
from tests.fake_broker import FakeBroker  # noqa: E402
from tests.support import broker_port_base, stop_process  # noqa: E402

RESPONSE_BYTES = 50 * 1024 * 1024
READ_RATE = 5 * 1024 * 1024  # bytes per second per reader
COUNTS = (10, 20, 40)
BUDGET = 256 * 1024 * 1024  # kproxy's default max_buffered_bytes


def fetch_v4(correlation_id: int) -> bytes:
    client, topic = b"bench", b"big"
    body = (struct.pack(">hhih", 1, 4, correlation_id, len(client)) + client
            + struct.pack(">iiiib", -1, 500, 1, RESPONSE_BYTES * 2, 0)
            + struct.pack(">ih", 1, len(topic)) + topic
            + struct.pack(">iiqi", 1, 0, 0, RESPONSE_BYTES * 2))
    return struct.pack(">i", len(body)) + body


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def slow_reader(port: int, i: int, done: list[int]) -> None:
    """Read one whole response at READ_RATE, in 256 KiB steps."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
        s.sendall(fetch_v4(i))
        size = 4 + struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        got, started = 4, time.monotonic()
        while got < size:
            data = s.recv(min(256 * 1024, size - got))
            if not data:
                raise RuntimeError("connection closed mid-response")
            got += len(data)
            ahead = got / READ_RATE - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        done.append(got)


def measure(port: int, pid: int, readers: int) -> dict[str, float]:
    baseline = rss_mib(pid)
    done: list[int] = []
    threads = [threading.Thread(target=slow_reader, args=(port, i, done)) for i in range(readers)]
    for t in threads:
        t.start()
    peak = baseline
    deadline = time.monotonic() + 600
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        peak = max(peak, rss_mib(pid))
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    if len(done) != readers:
        raise RuntimeError(f"{readers - len(done)} of {readers} readers did not finish")
    return {"readers": readers, "baseline_mib": round(baseline, 1),
            "peak_mib": round(peak, 1), "added_mib": round(peak - baseline, 1)}


def run_fake(port_holder: list[int], stop: threading.Event) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            fake = await FakeBroker(node_ids=[0], fetch_bytes=RESPONSE_BYTES).start(nursery)
            port_holder.append(fake.ports[0])
            while not stop.is_set():
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    trio.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-memory.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kproxy-membench-"))
    port_holder: list[int] = []
    stop = threading.Event()
    fake_thread = threading.Thread(target=run_fake, args=(port_holder, stop), daemon=True)
    fake_thread.start()
    while not port_holder:
        time.sleep(0.05)
    fake_port = port_holder[0]
    results: dict[str, list[dict[str, float]]] = {}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        listen, http, base = free_port(), free_port(), broker_port_base()
        with open(work / "kproxy.log", "wb") as log:
            kp = subprocess.Popen([sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
                                   "--upstream", f"127.0.0.1:{fake_port}",
                                   "--listen", f"127.0.0.1:{listen}",
                                   "--http", f"127.0.0.1:{http}",
                                   "--broker-port-base", str(base), "--node-id-range", "0-0",
                                   "--max-buffered-bytes", str(BUDGET)],
                                  stdout=log, stderr=subprocess.STDOUT)
        procs.append(kp)
        if not (wait_for_port("127.0.0.1", base, 30)):
            raise RuntimeError((work / "kproxy.log").read_text()[-800:])
        paths = [("kproxy", base, kp)]
        haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if Path(haproxy_bin).exists():
            hport = free_port()
            cfg = work / "haproxy.cfg"
            cfg.write_text("global\n  maxconn 1000\ndefaults\n  mode tcp\n"
                           "  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n"
                           f"listen kafka\n  bind 127.0.0.1:{hport}\n"
                           f"  server b 127.0.0.1:{fake_port}\n")
            with open(work / "haproxy.log", "wb") as log:
                hp = subprocess.Popen([haproxy_bin, "-db", "-f", str(cfg)], stdout=log,
                                      stderr=subprocess.STDOUT)
            procs.append(hp)
            wait_for_port("127.0.0.1", hport, 20)
            paths.append(("haproxy (tcp)", hport, hp))
        for name, port, proc in paths:
            results[name] = [measure(port, proc.pid, n) for n in COUNTS]
            print(name, results[name], flush=True)
        with socket.create_connection(("127.0.0.1", http)) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            text = b""
            while chunk := s.recv(65536):
                text += chunk
        budget_peak = next(float(line.split()[1]) for line in text.decode().splitlines()
                           if line.startswith("kproxy_buffered_bytes_peak "))
    finally:
        for proc in procs:
            stop_process(proc)
        stop.set()
        fake_thread.join(10)
    write(Path(args.out), results, budget_peak)
    return 0


def write(out: Path, results: dict[str, list[dict[str, float]]], budget_peak: float) -> None:
    out.with_suffix(".json").write_text(json.dumps(
        {"results": results, "kproxy_budget_peak_bytes": budget_peak}, indent=1) + "\n")
    names = list(results)
    lines = [
        "# Memory with slow readers of large fetches",
        "",
        f"Written by `make bench` (`tests/bench/memory_bench.py`). N connections each fetch "
        f"one {RESPONSE_BYTES >> 20} MB response (Fetch v4, from the scripted fake broker: "
        f"tansu caps a response at about 5 MB) and read it at {READ_RATE >> 20} MB/s. Peak "
        "resident memory of the proxy process above its level before the readers started.",
        "",
        "| readers | " + " | ".join(f"{n} peak added (MiB)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i, count in enumerate(COUNTS):
        lines.append(f"| {count} | " + " | ".join(
            f"{results[n][i]['added_mib']:.1f}" for n in names) + " |")
    lines += ["", f"kproxy's budget (`max_buffered_bytes`) was {BUDGET >> 20} MiB; the most it "
              f"held at once was {budget_peak / 2**20:.1f} MiB. Held whole, as before the "
              "cut-through relay, 40 readers were 40 x 50 MB.", ""]
    out.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
