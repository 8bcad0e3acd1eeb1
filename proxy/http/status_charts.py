"""The status page's charts and consumer groups, as HTML: pure, no I/O, no script.

Each chart is an inline SVG (a line for a level or a rate, bars for counts per step)
over the last 15 minutes of ``kproxy.http.history``; it scales to its box, so the page
has no fixed width to overflow on a narrow screen. Every value shown goes through
``html.escape``: group and member ids, client ids and software are what clients sent.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

W, H = 300, 64  # the SVG's own coordinates; drawn at the width of its box
PAD = 2


def e(value: object) -> str:
    return "\u2013" if value is None or value == "" else html.escape(str(value), quote=True)


def _number(v: float | None, unit: str) -> str:
    if v is None:
        return "\u2013"
    if unit == "B/s":
        for u in ("B/s", "KiB/s", "MiB/s", "GiB/s"):
            if abs(v) < 1024 or u == "GiB/s":
                return f"{v:.0f} {u}" if u == "B/s" else f"{v:.1f} {u}"
            v /= 1024
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{text} {unit}".strip()


def chart(title: str, ts: Sequence[float], values: Sequence[float | None], now: float,
          span: float, unit: str = "", bars: bool = False, step: float = 5.0) -> str:
    """One figure: a heading with the latest and highest value, and its SVG."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    x0 = now - span

    def x(t: float) -> float:
        return PAD + max(0.0, min(1.0, (t - x0) / span)) * (W - 2 * PAD)

    def y(v: float) -> float:
        return H - PAD - (v / top) * (H - 2 * PAD)

    shapes: list[str] = []
    if bars:
        width = max(2.0, (W - 2 * PAD) * step / span)  # one step's width, however few
        for t, v in zip(ts, values, strict=True):
            if v:
                shapes.append(f'<rect x="{x(t) - width:.1f}" y="{y(v):.1f}" '
                              f'width="{width:.1f}" height="{H - PAD - y(v):.1f}"/>')
    else:
        run: list[str] = []
        for t, v in zip(ts, values, strict=True):
            if v is None:
                if run:
                    shapes.append(f'<polyline points="{" ".join(run)}"/>')
                run = []
            else:
                run.append(f"{x(t):.1f},{y(v):.1f}")
        if run:
            shapes.append(f'<polyline points="{" ".join(run)}"/>')
    latest = next((v for v in reversed(values) if v is not None), None)
    label = (f"{e(title)}: now {e(_number(latest, unit))}, highest "
             f"{e(_number(max(known) if known else None, unit))}")
    return (f'<figure class="chart"><figcaption>{label}</figcaption>'
            f'<svg viewBox="0 0 {W} {H}" preserveAspectRatio="none" role="img" '
            f'aria-label="{label}"><title>{label}</title>'
            f'<rect class="frame" x="0" y="0" width="{W}" height="{H}"/>'
            + "".join(shapes) + "</svg></figure>")


def history(h: dict[str, Any] | None, now: float) -> str:
    """The proxy's charts: connections, requests, bytes, p99 latency, telemetry pushes."""
    if not h:
        return ""
    s, span = h["series"], h["span_s"]
    ts = s["t"]
    figures = [
        chart("connections", ts, s["connections"], now, span),
        chart("requests", ts, s["requests_per_s"], now, span, "/s"),
        chart("bytes in", ts, s["bytes_in_per_s"], now, span, "B/s"),
        chart("bytes out", ts, s["bytes_out_per_s"], now, span, "B/s"),
        chart("p99 latency", ts, s["p99_ms"], now, span, "ms"),
        chart("telemetry pushes", ts, s["pushes"], now, span, "per step", bars=True,
              step=h["step_s"]),
    ]
    return (f'<h2>Last {int(span // 60)} minutes</h2><p class="sub">one point every '
            f'{e(h["step_s"])} s, for the whole proxy</p>'
            f'<div class="charts">{"".join(figures)}</div>')


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    secs = max(0.0, now - at)
    return f"{secs:.0f} s ago" if secs < 120 else f"{secs / 60:.0f} min ago"


def _group(g: dict[str, Any], series: dict[str, Any] | None, now: float, span: float,
           step: float) -> str:
    state = e(g["state"]) + (f" for {e(g['rebalancing_for_s'])} s"
                             if g["rebalancing_for_s"] is not None else "")
    storm = (f' <span class="no">rebalance storm: {e(g["rebalances_recent"])} in '
             f'5 min</span>' if g["storm"] else "")
    last = g["last_rebalance"]
    rebalance = "none seen" if last is None else (
        f"{e(_ago(last['at'], now))}, took {e(last['seconds'])} s, why: {e(last['reason'])} "
        f"(generation {e(last['generation'])})")
    worst = ", ".join(f"<code>{e(p['topic'])}</code>[{e(p['partition'])}] {e(p['lag'])}"
                      for p in g["worst_partitions"]) or "\u2013"
    members = "".join(
        f"<tr><td><code>{e(m['member_id'])}</code></td><td><code>{e(m['client_id'])}</code>"
        f"</td><td>{e(m['software'])}</td><td class=\"n\">{e(m['generation'])}</td>"
        f"<td class=\"n\">{e(m['assigned_partitions'])}</td></tr>" for m in g["members"])
    more = (f'<p class="more">and {e(g["members_more"])} more member(s)</p>'
            if g["members_more"] else "")
    charts = ""
    if series:
        charts = ('<div class="charts">'
                  + chart("lag", series["t"], series["lag"], now, span)
                  + chart("rebalances", series["t"], series["rebalances"], now, span,
                          "per step", bars=True, step=step) + "</div>")
    return (
        f'<div class="group"><h3><code>{e(g["group_id"])}</code> &middot; {e(g["protocol"])}'
        f" &middot; {state}{storm}</h3>"
        f"<p>generation {e(g['generation'])} &middot; {e(g['members_count'])} member(s) "
        f"&middot; {e(g['rebalances'])} rebalance(s) &middot; last rebalance: {rebalance}"
        f"<br>lag {e(g['lag'])} &middot; worst partitions: {worst} &middot; assignor "
        f"{e(g['assignor'])}</p>"
        + (f'<div class="wide"><table><tr><th>member</th><th>client id</th><th>software</th>'
           f'<th>generation</th><th>partitions</th></tr>{members}</table></div>'
           if members else "") + more + charts + "</div>")


def groups(gs: dict[str, Any] | None, h: dict[str, Any] | None, now: float) -> str:
    """The consumer groups section: storms first, at most N, the rest counted."""
    if gs is None:
        return ""
    series = (h or {}).get("groups", {})
    span, step = (h or {}).get("span_s", 900.0), (h or {}).get("step_s", 5.0)
    body = "".join(_group(g, series.get(g["group_id"]), now, span, step)
                   for g in gs["listed"])
    more = gs["more"]
    return (f"<h2>Consumer groups</h2><p>{e(gs['tracked'])} group(s) seen"
            + (f' <span class="more">({e(more)} not listed)</span>' if more else "") + "</p>"
            + (body or "<p>No group seen yet.</p>"))
