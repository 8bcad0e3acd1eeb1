"""`make compat`: every client direct against tansu and through kproxy; writes the table.

    python -m tests.compat.matrix [--only SLUG ...] [--out docs/compatibility.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import KproxyProcess, kproxy_process

from .backend import start_tansu
from .clients import CLIENTS, ROOT, Client
from .report import Row, write_report
from .runner import run_client


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=[], help="client slugs (prefixes) to run")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "compatibility.md")
    p.add_argument("--no-report", action="store_true", help="print only")
    a = p.parse_args(argv)
    clients = [c for c in CLIENTS if not a.only or any(
        c.slug.startswith(o) or c.driver.startswith(o) for o in a.only)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kproxy-compat-") as tmp:
        work = Path(tmp)
        broker = start_tansu(work / "tansu.log")
        try:
            with _kproxy(broker.bootstrap, work) as kp:
                for client in clients:
                    rows.append(_run_one(client, broker.bootstrap, kp.bootstrap))
        finally:
            broker.stop()
    if not a.no_report:
        write_report(rows, a.out)
        print(f"wrote {a.out}")
    # The rule: every client that works direct works through kproxy.
    broken = [r for r in rows if r.direct.ok and not r.proxied.ok]
    for r in broken:
        print(f"RULE BROKEN: {r.client.name} {r.client.version} passes direct, fails through "
              f"kproxy: {r.proxied.first_failure()}", file=sys.stderr)
    return 1 if broken else 0


@contextmanager
def _kproxy(upstream: str, work: Path) -> Iterator[KproxyProcess]:
    """kproxy in front of the broker; a loaded machine may need more than one start."""
    for attempt in range(1, 4):
        try:
            with kproxy_process(upstream, work) as kp:
                yield kp
                return
        except RuntimeError as exc:
            if attempt == 3 or "did not start" not in str(exc):
                raise
            print(f"kproxy start attempt {attempt} timed out; trying again", flush=True)


def _run_one(client: Client, direct: str, proxied: str) -> Row:
    started = time.monotonic()
    d = run_client(client, direct, "direct")
    t = run_client(client, proxied, "kproxy")
    row = Row(client, d, t)
    print(f"{client.name:32} {row.version:28} direct: {d.summary():18} "
          f"kproxy: {t.summary():18} ({time.monotonic() - started:.0f} s)", flush=True)
    for label, o in (("direct", d), ("kproxy", t)):
        if not o.ok:
            print(f"    {label}: {o.first_failure()[:400]}", flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
