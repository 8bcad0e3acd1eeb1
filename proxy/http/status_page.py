"""The status page as HTML, from ``kproxy.http.status.snapshot``'s dict: pure, no I/O.

One self-contained document: inline CSS, no script, no external asset, a meta refresh.
The charts and the consumer groups are drawn by ``status_charts`` (inline SVG).
Every value goes through ``html.escape``: client ids and software names are whatever
clients chose to send.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable
from typing import Any

from kproxy.http import status_charts

REFRESH_SECONDS = 10

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .5em}
.sub{color:#5a6275}table{border-collapse:collapse;margin:.3em 0;background:#fff}
th,td{border:1px solid #d8dce5;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#eef1f6;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.yes{color:#17713a;font-weight:600}.no{color:#b3261e;font-weight:600}.mixed{color:#a05a00}
.hit{background:#fde8e6}.more{color:#5a6275;font-style:italic}
code{font:12px ui-monospace,monospace;overflow-wrap:anywhere}.group{margin:1em 0 1.4em}
p,h1,h2,h3{overflow-wrap:anywhere}.wide{max-width:100%;overflow-x:auto}
.charts{display:flex;flex-wrap:wrap;gap:.6em 1.2em;margin:.4em 0}
.chart{margin:0;flex:1 1 240px;max-width:340px;min-width:0}
.chart figcaption{font-size:12px;color:#5a6275}
.chart svg{display:block;width:100%;height:64px}
.chart svg .frame{fill:#fff;stroke:#d8dce5}
.chart svg polyline{fill:none;stroke:#2563c9;stroke-width:1.5;vector-effect:non-scaling-stroke}
.chart svg rect:not(.frame){fill:#c2571a}
@media (max-width:600px){body{margin:.6em}}
"""


def e(value: object) -> str:
    """Escaped text; None shows as a dash."""
    return "\u2013" if value is None or value == "" else html.escape(str(value), quote=True)


def _bytes(n: int | float | None) -> str:
    if n is None:
        return "\u2013"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    secs = max(0.0, now - at)
    if secs < 120:
        return f"{secs:.0f} s ago"
    if secs < 7200:
        return f"{secs / 60:.0f} min ago"
    return f"{secs / 3600:.1f} h ago"


def _v13(value: str) -> str:
    label = {"yes": "v13 \u2013 can be told to rebootstrap",
             "no": "below v13 \u2013 cannot be told to rebootstrap",
             "mixed": "v13 on some connections only",
             "unknown": "version not seen yet"}.get(value, value)
    return f'<span class="{e(value)}">Metadata {e(label)}</span>'


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    out = [f'<div class="wide"><table class="{cls}"><tr>'
           + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(row) + "</tr>")
    return "".join(out) + "</table></div>"


def _td(value: str, numeric: bool = False) -> str:
    return f'<td class="n">{value}</td>' if numeric else f"<td>{value}</td>"


def _list(values: list[str], more: int) -> str:
    items = ", ".join(f"<code>{e(v)}</code>" for v in values) or "\u2013"
    return items + (f' <span class="more">and {more} more</span>' if more else "")


def _backend(b: dict[str, Any], now: float) -> str:
    last = b.get("last_change")
    change = "none since start" if last is None else (
        f"{e(_ago(last['at'], now))}: {e(last['reason'])} ({e(last['what'])})")
    rows = [[_td(e(x["node_id"]), True), _td(f"<code>{e(x['host'])}:{e(x['port'])}</code>"),
             _td(f"<code>{e(x['advertised'])}</code>")] for x in b["brokers"]]
    discovery = b.get("last_discovery_age_s")
    return (
        "<h2>Backend</h2><p>"
        f"cluster id <code>{e(b['cluster_id'])}</code> &middot; topology epoch "
        f"<b>{e(b['topology_epoch'])}</b> &middot; last change: {change} &middot; "
        f"discovery {'never answered' if discovery is None else e(f'{discovery:g} s ago')}"
        f" &middot; bootstrap servers {_list(b.get('upstream', []), 0)}</p>"
        + _table(["node id", "broker (backend)", "advertised by kproxy"], rows))


def _client_rows(clients: list[dict[str, Any]], now: float) -> list[list[str]]:
    return [[_td(f"<code>{e(c['client_id'])}</code>"), _td(e(c["source_address"])),
             _td(e(c["connections"]), True), _td(_v13(c["metadata_v13"])),
             _td(_telemetry_cell(c, now)), _td(_bytes(c["bytes_in"]), True),
             _td(_bytes(c["bytes_out"]), True), _td(_ms(c["p99_ms"]), True)]
            for c in clients]


def _telemetry_cell(c: dict[str, Any], now: float) -> str:
    if not c["telemetry"]:
        return '<span class="no">off</span>'
    return f'<span class="yes">on</span>, last push {e(_ago(c["last_push"], now))}'


def _ms(value: float | None) -> str:
    return "\u2013" if value is None else e(f"{value:.3g} ms")


def _group(g: dict[str, Any], now: float) -> str:
    title = (f"{e(g['software_name'])} {e(g['software_version'])}".strip()
             if g["software_name"] else "software not named (ApiVersions request below v3)")
    more = g["clients_more"]
    return (
        f'<div class="group"><h3>{title} &middot; {e(g["connections"])} connection(s) '
        f'&middot; {_v13(g["metadata_v13"])}</h3>'
        f"<p>client ids: {_list(g['client_ids'], g['client_ids_more'])}<br>"
        f"source addresses: {_list(g['source_addresses'], g['source_addresses_more'])}<br>"
        f"telemetry: {_telemetry_cell(g, now)} &middot; in {_bytes(g['bytes_in'])} "
        f"&middot; out {_bytes(g['bytes_out'])} &middot; p99 {_ms(g['p99_ms'])}</p>"
        + _table(["client id", "source", "conns", "Metadata", "telemetry", "bytes in",
                  "bytes out", "p99"], _client_rows(g["clients"], now))
        + (f'<p class="more">and {e(more)} more client(s)</p>' if more else "") + "</div>")


def _clients(c: dict[str, Any], now: float) -> str:
    groups = "".join(_group(g, now) for g in c["groups"]) or "<p>No client connected.</p>"
    more = c["groups_more"]
    return (f"<h2>Clients</h2><p>{e(c['connections'])} connection(s) in "
            f"{len(c['groups']) + more} software group(s)</p>" + groups
            + (f'<p class="more">and {e(more)} more group(s)</p>' if more else ""))


def _limits(limits: list[dict[str, Any]]) -> str:
    rows = []
    for lim in limits:
        cls = ' class="hit"' if lim["hit_now"] else ""
        rows.append(f"<tr{cls}>" + "".join([
            _td(f"<code>{e(lim['limit'])}</code>"), _td(e(lim["value"]), True),
            _td(e(lim["in_use"]), True), _td(e(lim["hits"]), True),
            _td('<span class="no">at limit</span>' if lim["hit_now"] else "")]) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("limit", "value", "in use now", "hits so far",
                                             "now"))
    return (f'<h2>Limits</h2><div class="wide"><table><tr>{head}</tr>{"".join(rows)}'
            "</table></div>")


def _telemetry(t: dict[str, Any]) -> str:
    if not t["enabled"]:
        return "<h2>Telemetry</h2><p>off: KIP-714 requests go to the broker</p>"
    parts = [f"terminated in kproxy &middot; {e(t.get('client_instances'))} client "
             f"instance(s) &middot; Prometheus export {'on' if t['prometheus'] else 'off'}"
             f" ({e(t.get('series'))} series)"]
    if t.get("client_instances_evicted"):
        parts.append(f"{e(t['client_instances_evicted'])} instance(s) forgotten to make "
                     "room since start (telemetry_max_instances, "
                     "telemetry_max_instance_bytes)")
    otlp = t.get("otlp")
    if otlp is None:
        parts.append("OTLP export off")
    else:
        outcomes = ", ".join(f"{e(k)} {e(v)}" for k, v in sorted(otlp["outcomes"].items()))
        parts.append(f"OTLP export to <code>{e(otlp['endpoint'])}</code>: {outcomes}; "
                     f"{e(otlp['queued_pushes'])} push(es) queued "
                     f"({_bytes(otlp['queued_bytes'])})"
                     + (" &middot; <b>retrying</b>" if otlp["retrying"] else ""))
    return "<h2>Telemetry</h2><p>" + "<br>".join(parts) + "</p>"


def _filters(rows: list[dict[str, Any]] | None) -> str:
    """The chain on the main listeners, client side first, and each filter's decisions."""
    if rows is None:
        return ""
    out = []
    for f in rows:
        decisions = ", ".join(f"{e(k)} {e(v)}" for k, v in sorted(f["decisions"].items()))
        out.append([_td(f"<code>{e(f['name'])}</code>"), _td(e(f["type"])), _td(e(f["apis"])),
                    _td(e(f["description"])), _td(decisions or "&ndash;")])
    return "<h2>Filters</h2>" + _table(["filter", "type", "reads", "does", "decisions"], out)


def _virtual_clusters(rows: list[dict[str, Any]] | None) -> str:
    """Each virtual cluster: its prefix, listeners, filters and figures."""
    if not rows:
        return ""
    out = [[_td(f"<code>{e(v['name'])}</code>"), _td(f"<code>{e(v['prefix'])}</code>"),
            _td(f"<code>{e(v['bootstrap'])}</code>"), _td(e(v["broker_ports"])),
            _td(e(", ".join(v["filters"])) or "&ndash;"), _td(e(v["connections"]), True),
            _td(e(v["accepted"]), True), _td(_bytes(v["bytes_in"]), True),
            _td(_bytes(v["bytes_out"]), True)] for v in rows]
    return "<h2>Virtual clusters</h2>" + _table(
        ["name", "prefix", "bootstrap", "broker ports", "filters", "connections",
         "accepted", "bytes in", "bytes out"], out)


def _workers(rows: list[dict[str, Any]] | None) -> str:
    """One line per worker process (a snapshot merged by the supervisor only)."""
    if rows is None:
        return ""
    out = []
    for w in rows:
        state = ('<span class="yes">ready</span>' if w["ready"] else
                 '<span class="no">not answering</span>' if not w["answered"] else
                 '<span class="no">not ready</span>') if w["alive"] else (
                 '<span class="no">not running</span>')
        out.append([_td(e(w["index"]), True), _td(e(w["pid"]), True), _td(state),
                    _td(e(w["connections"]), True), _td(e(w["restarts"]), True),
                    _td(e(w["config_generation"]), True)])
    return "<h2>Workers</h2>" + _table(["worker", "pid", "state", "connections", "restarts",
                                        "config generation"], out)


def render(snap: dict[str, Any]) -> str:
    now = snap["generated_at"]
    p = snap["proxy"]
    ready = '<span class="yes">ready</span>' if p["ready"] else '<span class="no">not ready</span>'
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>kproxy status \u2013 {e(p['host'])}</title><style>{CSS}</style></head><body>"
        f"<h1>kproxy on {e(p['host'])}</h1>"
        f'<p class="sub">version {e(p["version"])} &middot; {ready} ({e(p["ready_reason"])}) '
        f"&middot; bootstrap <code>{e(p['bootstrap'])}</code> &middot; advertised host "
        f"<code>{e(p['advertised_host'])}</code> &middot; {e(stamp)} &middot; "
        f'<a href="/status.json">status.json</a> &middot; <a href="/metrics">metrics</a></p>'
        + status_charts.history(snap.get("history"), now)
        + _backend(snap["backend"], now)
        + status_charts.groups(snap.get("groups"), snap.get("history"), now)
        + _clients(snap["clients"], now)
        + _filters(snap.get("filters")) + _virtual_clusters(snap.get("virtual_clusters"))
        + _limits(snap["limits"])
        + _telemetry(snap["telemetry"]) + _workers(snap.get("workers")) + "</body></html>\n")
