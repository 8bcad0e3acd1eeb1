"""Run one client's scenario against one bootstrap address, whatever kind of client it is."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

from . import kcat
from .clients import DRIVERS, Client
from .install import failure, installed, node_for
from .scenario import MESSAGES, PARTITIONS, SESSION_TIMEOUT_MS, Outcome, parse_output

DRIVER_TIMEOUT = 240.0  # a driver's own deadline is 120 s; this is the backstop


def names(client: Client, target: str) -> tuple[str, str]:
    tag = f"{client.slug}-{target}-{uuid.uuid4().hex[:6]}".replace(".", "_")
    return f"compat-{tag}", f"compat-group-{tag}"


def run_client(client: Client, bootstrap: str, target: str) -> Outcome:
    topic, group = names(client, target)
    if client.driver == "kcat":
        if not kcat.available():
            return Outcome(error="not installed: kcat (make test-tools installs it)")
        return kcat.run(bootstrap, topic, group)
    reason = failure(client)
    if reason is not None:
        return Outcome(error=f"cannot be installed here: {reason}")
    if not installed(client):
        return Outcome(error="not installed (run tests/compat/install.py)")
    args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group,
            "--messages", str(MESSAGES), "--partitions", str(PARTITIONS),
            "--session-timeout-ms", str(SESSION_TIMEOUT_MS)]
    if client.kind == "pypi":
        cmd = [str(client.env_dir / "bin" / "python"), str(DRIVERS / client.driver), *args]
        cwd = DRIVERS
    else:
        # Node resolves a package from the importing file's folder: the driver runs
        # from a copy inside the client's environment, next to its node_modules.
        for name in (client.driver, "common.mjs"):
            shutil.copyfile(DRIVERS / name, client.env_dir / name)
        cmd = [node_for(client), str(client.env_dir / client.driver), *args]
        cwd = client.env_dir
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        out = Outcome(error=f"driver timed out after {exc.timeout:.0f} s")
    else:
        out = parse_output(proc.stdout)
        if out.error:
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-2:]
            out.error += " | " + " | ".join(tail)[:300]
    out.seconds = time.monotonic() - started
    return out
