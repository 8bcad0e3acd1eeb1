"""One status snapshot out of every worker's: pure, no I/O.

With ``--workers N`` each worker knows only its own connections, so the supervisor
asks each one for its ``/status.json`` (``kproxy.http.status.snapshot``) and combines
them here into one snapshot of the same schema, plus a ``workers`` list, which
``kproxy.http.status_page.render`` draws as it draws one process's.

How each part combines:

- backend: one backend, seen by every worker; the newest view (highest topology
  epoch, then the latest snapshot) is shown;
- clients: software groups and the clients within them are summed across workers
  by their key and ranked again. A worker lists only its top groups, clients and
  values, so what it left out is counted, not named: the "more" figures are what the
  workers left out plus what the merge leaves out, an upper bound (a value left out
  by two workers counts twice). A group's p99 is the highest worker's p99: the
  latency sketches are not in the JSON, and the worst worker is what an operator
  looks for;
- telemetry: instances, series and the OTLP export's outcomes and queue summed;
- consumer groups and the history: not from the workers' snapshots at all, but the
  supervisor's merged group model and its own history ring, passed in;
- limits: ``global_limits``, and the worker lines: ``worker_rows``. Both are derived
  from the workers' snapshots and the supervisor's view of its processes, in one
  place each, so that figures kept by the supervisor itself can replace them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kproxy.http.status import MAX_CLIENTS, MAX_GROUPS, MAX_VALUES

# Limits each worker applies to its own share, so that the whole proxy's limit is
# the sum of the workers' values and its use the sum of theirs.
SUMMED = frozenset({"max_connections", "telemetry.max_series", "telemetry.max_instances",
                    "telemetry.otlp.max_queue_bytes"})
# Use that adds up although the limit does not (max_inflight is per connection: its
# use is the sessions paused at it). For the other limits the highest worker's use.
SUMMED_USE = SUMMED | {"max_inflight"}
_COUNTS = ("connections", "v13_connections", "below_v13_connections",
           "telemetry_connections", "bytes_in", "bytes_out")


@dataclass
class WorkerInfo:
    """What the supervisor knows of one worker process, whatever its HTTP says."""

    index: int
    http_port: int  # its own loopback HTTP port, where its own status is
    pid: int | None
    alive: bool
    restarts: int


def merge(snapshots: Sequence[dict[str, Any] | None], workers: Sequence[WorkerInfo],
          now: float, limits: list[dict[str, Any]] | None = None,
          groups: dict[str, Any] | None = None,
          history: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole proxy's snapshot; ``snapshots[i]`` is worker i's, None if it did not
    answer. ``limits``: global limit rows kept elsewhere, each instead of the derived
    row of the same limit. ``groups`` and ``history``: the supervisor's own, made from
    the merged group model and its history ring (a worker's cover its connections only,
    so they are never combined here)."""
    got = [s for s in snapshots if s is not None]
    rows = worker_rows(snapshots, workers)
    ready = sum(1 for r in rows if r["ready"])
    first = got[0]["proxy"] if got else {}
    return {
        "generated_at": round(now, 3),
        "proxy": {
            "host": first.get("host"), "version": first.get("version"),
            "ready": ready > 0, "ready_reason": f"{ready}/{len(rows)} workers ready",
            "bootstrap": first.get("bootstrap"),
            "advertised_host": first.get("advertised_host"),
            "config_generation": min((r["config_generation"] for r in rows
                                      if r["config_generation"] is not None), default=None),
        },
        "backend": _backend(got),
        "clients": merge_clients([s["clients"] for s in got]),
        "telemetry": _telemetry([s["telemetry"] for s in got]),
        "filters": merge_filters([s.get("filters") or [] for s in got]),
        "virtual_clusters": merge_virtual_clusters([s.get("virtual_clusters") or []
                                                    for s in got]),
        "limits": _with_global_rows(global_limits(got), limits or []),
        "workers": rows,
        "groups": groups,
        "history": history,
    }


def worker_rows(snapshots: Sequence[dict[str, Any] | None],
                workers: Sequence[WorkerInfo]) -> list[dict[str, Any]]:
    """One line per worker: pid, connections, restarts, config generation."""
    rows = []
    for info, snap in zip(workers, snapshots, strict=True):
        proxy = (snap or {}).get("proxy", {})
        rows.append({
            "index": info.index, "pid": info.pid, "http_port": info.http_port, "alive": info.alive,
            "restarts": info.restarts, "answered": snap is not None,
            "ready": bool(proxy.get("ready")) and info.alive,
            "connections": None if snap is None else snap["clients"]["connections"],
            "config_generation": proxy.get("config_generation"),
        })
    return rows


def global_limits(snaps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each limit once, for the whole proxy: a per-worker limit's value and use summed
    over the workers (the highest worker's use where a sum means nothing), hits
    summed, at the limit now when any worker is."""
    merged: dict[str, dict[str, Any]] = {}
    for snap in snaps:
        for row in snap["limits"]:
            name = row["limit"]
            have = merged.get(name)
            if have is None:
                merged[name] = dict(row)
                continue
            have["hits"] += row["hits"]
            if have["value"] is None:
                have["value"] = row["value"]
            elif name in SUMMED and row["value"] is not None:
                have["value"] += row["value"]
            if row["in_use"] is not None:
                if have["in_use"] is None:
                    have["in_use"] = row["in_use"]
                elif name in SUMMED_USE:
                    have["in_use"] += row["in_use"]
                else:
                    have["in_use"] = max(have["in_use"], row["in_use"])
            have["hit_now"] = have["hit_now"] or row["hit_now"]
    return list(merged.values())


def _with_global_rows(derived: list[dict[str, Any]],
                      kept: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The derived rows, each replaced by the supervisor's own row of the same limit."""
    own = {row["limit"]: row for row in kept}
    rows = [own.pop(row["limit"], row) for row in derived]
    return rows + list(own.values())


def _backend(snaps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not snaps:
        return {"cluster_id": None, "topology_epoch": None, "brokers": [],
                "last_change": None, "last_discovery_age_s": None, "upstream": []}
    newest = max(snaps, key=lambda s: (s["backend"]["topology_epoch"] or 0,
                                       s["generated_at"]))
    return dict(newest["backend"])


def _top(counts: dict[str, int], n: int, more: int) -> tuple[list[str], int]:
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    return ranked[:n], more + max(0, len(ranked) - n)


def _add_counts(into: dict[str, Any], row: dict[str, Any]) -> None:
    for key in _COUNTS:
        into[key] += row[key]
    into["telemetry"] = into["telemetry"] or row["telemetry"]
    pushes = [p for p in (into["last_push"], row["last_push"]) if p is not None]
    into["last_push"] = max(pushes, default=None)
    p99s = [p for p in (into["p99_ms"], row["p99_ms"]) if p is not None]
    into["p99_ms"] = max(p99s, default=None)


def _v13(row: dict[str, Any]) -> str:
    v13, below = row["v13_connections"], row["below_v13_connections"]
    return ("unknown" if not v13 + below else "yes" if not below
            else "no" if not v13 else "mixed")


def merge_clients(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Software groups summed by (name, version), ranked again, each still bounded."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    ids: dict[tuple[str, str], dict[str, int]] = {}
    sources: dict[tuple[str, str], dict[str, int]] = {}
    clients: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    more = {"groups": 0}
    for part in parts:
        more["groups"] += part["groups_more"]
        for g in part["groups"]:
            key = (g["software_name"], g["software_version"])
            have = groups.get(key)
            if have is None:
                have = groups[key] = {**g, **{k: 0 for k in _COUNTS}, "telemetry": False,
                                      "last_push": None, "p99_ms": None,
                                      "client_ids_more": 0, "source_addresses_more": 0,
                                      "clients_more": 0}
            _add_counts(have, g)
            for field in ("client_ids_more", "source_addresses_more", "clients_more"):
                have[field] += g[field]
            # A listed value is known to be held at least once by this worker.
            for counts, values in ((ids.setdefault(key, {}), g["client_ids"]),
                                   (sources.setdefault(key, {}), g["source_addresses"])):
                for value in values:
                    counts[value] = counts.get(value, 0) + 1
            for c in g["clients"]:
                ckey = (c["client_id"], c["source_address"])
                known = clients.setdefault(key, {})
                if ckey not in known:
                    known[ckey] = dict(c)
                else:
                    _add_counts(known[ckey], c)
    ranked = sorted(groups, key=lambda k: (-groups[k]["connections"], not k[0], k))
    listed = []
    for key in ranked[:MAX_GROUPS]:
        g = groups[key]
        g["metadata_v13"] = _v13(g)
        g["client_ids"], g["client_ids_more"] = _top(ids.get(key, {}), MAX_VALUES,
                                                     g["client_ids_more"])
        g["source_addresses"], g["source_addresses_more"] = _top(
            sources.get(key, {}), MAX_VALUES, g["source_addresses_more"])
        known = clients.get(key, {})
        for c in known.values():
            c["metadata_v13"] = _v13(c)
        by_traffic = sorted(known, key=lambda k: (-(known[k]["bytes_in"]
                                                    + known[k]["bytes_out"]), k))
        g["clients"] = [known[k] for k in by_traffic[:MAX_CLIENTS]]
        g["clients_more"] += max(0, len(by_traffic) - MAX_CLIENTS)
        listed.append(g)
    return {"connections": sum(p["connections"] for p in parts), "groups": listed,
            "groups_more": more["groups"] + max(0, len(ranked) - MAX_GROUPS)}


def _telemetry(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not parts:
        return {"enabled": False, "prometheus": False}
    out: dict[str, Any] = {"enabled": any(t["enabled"] for t in parts),
                           "prometheus": any(t["prometheus"] for t in parts)}
    for key in ("client_instances", "client_instances_evicted", "series"):
        values = [t[key] for t in parts if key in t]
        if values:
            out[key] = sum(values)
    exports = [t["otlp"] for t in parts if "otlp" in t]
    if exports:
        outcomes: dict[str, int] = {}
        for x in exports:
            for name, count in x["outcomes"].items():
                outcomes[name] = outcomes.get(name, 0) + count
        out["otlp"] = {
            "endpoint": exports[0]["endpoint"], "outcomes": outcomes,
            "queued_bytes": sum(x["queued_bytes"] for x in exports),
            "queued_pushes": sum(x["queued_pushes"] for x in exports),
            "retrying": any(x["retrying"] for x in exports),
        }
    return out


def merge_filters(parts: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every worker runs the same chain: the first one's rows, decisions summed by filter."""
    if not parts:
        return []
    rows = [dict(row, decisions=dict(row["decisions"])) for row in parts[0]]
    by_name = {row["name"]: row for row in rows}
    for other in parts[1:]:
        for row in other:
            mine = by_name.get(row["name"])
            if mine is None:  # a worker that reloaded first: its chain differs for now
                continue
            for decision, n in row["decisions"].items():
                mine["decisions"][decision] = mine["decisions"].get(decision, 0) + n
    return rows


VC_FIGURES = ("connections", "accepted", "bytes_in", "bytes_out")


def merge_virtual_clusters(parts: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every worker serves the same virtual clusters: the first one's rows (settings),
    each figure summed over the workers."""
    if not parts:
        return []
    rows = [dict(row) for row in parts[0]]
    by_name = {row["name"]: row for row in rows}
    for other in parts[1:]:
        for row in other:
            mine = by_name.get(row["name"])
            if mine is not None:
                for key in VC_FIGURES:
                    mine[key] = mine.get(key, 0) + row.get(key, 0)
    return rows
