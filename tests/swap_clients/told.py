"""What each client library does when told REBOOTSTRAP_REQUIRED, measured.

One cluster, no swap: the clients stream through kproxy (metadata refreshed every
second, so that each asks for Metadata soon after the change) and an operator asks
for a rebootstrap (``POST /admin/rebootstrap``): the topology epoch moves, nothing is
gone, so no connection is closed for a vanished backend. Then, per client, from
kproxy's own records (its JSON log and its per-connection archive):

- whether it was told (a Metadata v13+ response carrying the error), and when;
- whether it then opened a new connection to the bootstrap listener, i.e. bootstrapped
  again (``acts``), or carried on with the connections it had (``ignores``);
- for clients below v13, which cannot be told: their connections are closed
  (``--legacy-clients close``), and whether they reconnected.

Shared by ``tests/e2e/test_rebootstrap_clients.py`` and the ``make bench`` rebootstrap row.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import (
    Cluster,
    clients_running,
    read_reports,
    slug,
    wait_until,
)

METADATA_AGE_MS = 1000
TOLD_S = 60.0  # bound: every v13 client asked for Metadata after the change
AFTER = 300  # acknowledged messages after the change, per client, before stopping
# A connection closed for the change ends at its next request, or 1 s later
# (GONE_GRACE_S); a generous window for a loaded machine.
CLOSED_S = 3.0


@dataclass
class Told:
    client: str
    metadata_version: int | None
    told_at: float | None  # first REBOOTSTRAP_REQUIRED the proxy sent it
    bootstraps_after: int  # new connections to the bootstrap listener after it was told
    closed_by_change: int  # its connections that ended within CLOSED_S of the change
    reconnected: int  # connections it opened after the change
    failed: int  # delivery reports with an error

    @property
    def verdict(self) -> str:
        if self.metadata_version is None:
            return "no Metadata seen"
        if self.metadata_version >= 13:
            if self.told_at is None:
                return "not told (no Metadata request after the change)"
            return ("acts on it: bootstraps again" if self.bootstraps_after
                    else "ignores it: carries on with its connections")
        return ("cannot read it: its connections are closed and it reconnects"
                if self.reconnected else "cannot read it; did not reconnect")


def records(archive: Path) -> list[dict[str, Any]]:
    out = []
    for path in (archive / "connections").rglob("*part-*.jsonl*"):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def json_log(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def run_told(bootstrap: str, work: Path, clients: tuple[str, ...]) -> dict[str, Told]:
    from tests.support import kproxy_process

    topics = {c: f"swap-{slug(c)}" for c in clients}
    cluster = Cluster("one", bootstrap, work)
    archive = work / "archive"
    try:
        cluster.create_topics(list(topics.values()))
        with kproxy_process(bootstrap, work, "--admin", "on", "--log-format", "json",
                            "--legacy-clients", "close", "--archive", str(archive)) as kp:
            with clients_running(clients, kp.bootstrap, work, "--metadata-max-age-ms",
                                 str(METADATA_AGE_MS)) as running:
                outs = running.outs

                def acked_since(c: str, t: float) -> int:
                    return sum(1 for r in read_reports(outs[c])
                               if "s" in r and r["e"] is None and r["t"] >= t)
                wait_until(lambda: all(acked_since(c, 0) for c in clients), 90,
                           "a client acknowledged nothing before the change", running)
                # A connection is told only if it had a Metadata answer before the change
                # (one whose first Metadata comes after it already has the new view). Let
                # every client run through a few metadata refreshes (METADATA_AGE_MS) on
                # its connections first: until each has acks spanning three of them.
                span_s = 3 * METADATA_AGE_MS / 1000

                def producing_for(c: str) -> float:
                    times = [r["t"] for r in read_reports(outs[c]) if "s" in r]
                    return max(times) - min(times) if times else 0.0
                wait_until(lambda: all(producing_for(c) >= span_s for c in clients), 90,
                           "a client did not keep producing before the change", running)
                changed_at = time.time()
                req = urllib.request.Request(f"http://127.0.0.1:{kp.http_port}"
                                             "/admin/rebootstrap", method="POST")
                with urllib.request.urlopen(req, timeout=10) as resp:
                    assert resp.status == 200

                def told_all() -> bool:
                    said = {e.get("client_id") for e in json_log(kp.log_path)
                            if e.get("msg") == "client told to bootstrap again"}
                    return all(f"swap-{slug(c)}" in said for c in clients if c in V13_CLIENTS)
                wait_until(told_all, TOLD_S, "a v13 client was never told", running)
                wait_until(lambda: all(acked_since(c, changed_at) >= AFTER for c in clients),
                           90, "a client stopped producing after the change", running)
            log = json_log(kp.log_path)
    finally:
        cluster.close()
    conns = records(archive)  # all written: kproxy drained and closed every connection
    out = {}
    for c in clients:
        cid = f"swap-{slug(c)}"
        mine = [r for r in conns if r.get("client_id") == cid]
        told = [e["ts"] for e in log if e.get("msg") == "client told to bootstrap again"
                and e.get("client_id") == cid]
        told_at = min(told) if told else None
        md = [r["metadata_max_version"] for r in mine
              if isinstance(r.get("metadata_max_version"), int)]
        out[c] = Told(
            client=c, metadata_version=max(md) if md else None, told_at=told_at,
            bootstraps_after=sum(1 for r in mine if r["listener"] == "bootstrap"
                                 and told_at is not None and r["opened"] >= told_at),
            closed_by_change=sum(1 for r in mine
                                 if changed_at <= r["ts"] <= changed_at + CLOSED_S),
            reconnected=sum(1 for r in mine if r["opened"] >= changed_at),
            failed=sum(1 for r in read_reports(outs[c]) if "s" in r and r["e"] is not None))
    return out


# The clients that speak Metadata v13 (checked against the proxy's records afterwards).
V13_CLIENTS = ("confluent-kafka", "kafka-python")


def told_table(told: dict[str, Told]) -> str:
    head = ("| client | Metadata | told | new bootstrap connections after | connections "
            "closed at the change | what it does |\n|---|---|---|---|---|---|")
    rows = [f"| {t.client} | v{t.metadata_version} | {'yes' if t.told_at else 'no'} | "
            f"{t.bootstraps_after} | {t.closed_by_change} | {t.verdict} |"
            for t in told.values()]
    return "\n".join([head, *rows])
