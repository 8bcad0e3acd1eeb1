"""Debian's kcat (librdkafka 2.0.2 on Debian 12) through the matrix scenario.

kcat has no admin API: the topic is created by the broker on first produce.
Nor can it list groups. It consumes as a balanced group member (``-G``) and exits
at partition EOF (``-e``); a second run in the same group proves the commits held.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

from .scenario import MESSAGES, SESSION_TIMEOUT_MS, Outcome

KCAT = "kcat"
TIMEOUT = 90.0


def available() -> bool:
    return shutil.which(KCAT) is not None


def version() -> str:
    out = subprocess.run([KCAT, "-V"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"librdkafka ([0-9.]+)", out)
    k = re.search(r"Version ([0-9.]+)", out)
    return f"{k.group(1) if k else '?'} (librdkafka {m.group(1) if m else '?'})"


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT)


def _consume(bootstrap: str, topic: str, group: str) -> subprocess.CompletedProcess[str]:
    return _run(["-b", bootstrap, "-G", group, "-X", f"session.timeout.ms={SESSION_TIMEOUT_MS}",
                 "-X", "auto.offset.reset=earliest", "-e", "-K:", "-f", "%k:%s\n", topic])


def run(bootstrap: str, topic: str, group: str) -> Outcome:
    out = Outcome(version=version())
    started = time.monotonic()
    try:
        meta = _run(["-b", bootstrap, "-L", "-m", "15"])
        if meta.returncode != 0 or "brokers:" not in meta.stdout:
            out.error = "metadata: " + _last_error(meta)
            return out
        out.steps["admin"] = "n/a: no admin API (topic auto-created on produce)"
        lines = "".join(f"k{i}:{i}\n" for i in range(MESSAGES))
        produced = _run(["-b", bootstrap, "-P", "-t", topic, "-K:"], lines)
        out.steps["produce"] = "ok" if produced.returncode == 0 else \
            "fail: " + _last_error(produced)
        first = _consume(bootstrap, topic, group)
        values = sorted(int(v) for k, _, v in (line.partition(":")
                                                for line in first.stdout.splitlines())
                        if k.startswith("k") and v.isdigit())
        out.steps["consume"] = "ok" if values == list(range(MESSAGES)) else (
            f"fail: {len(values)} of {MESSAGES} values ({_last_error(first)})")
        again = _consume(bootstrap, topic, group)
        out.steps["commit"] = "ok" if again.returncode == 0 and not again.stdout.strip() else (
            f"fail: {len(again.stdout.splitlines())} messages after commit "
            f"({_last_error(again)})")
        out.steps["groups"] = "n/a: kcat cannot list groups"
    except subprocess.TimeoutExpired as exc:
        out.error = f"timed out after {exc.timeout:.0f} s: {exc.cmd[1:6]}"
    finally:
        out.seconds = time.monotonic() - started
    return out


def _last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln or "FAIL" in ln]
    text = (lines[0] if lines else proc.stderr.strip().splitlines()[-1:] or ["no output"])
    line = text if isinstance(text, str) else text[0]
    return re.sub(r"^%\d\|[0-9.]+\|", "", line)[:200]
