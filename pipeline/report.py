"""The human-readable fleet report: Markdown and HTML (with inline SVG bar charts).

Only the aggregated tables are collected to the driver; each holds a handful of rows
per software version or the top-N instances.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.pipeline.hourly import Tables

Row = dict[str, Any]


def _rows(df: Any, limit: int = 200) -> list[Row]:
    return [r.asDict() for r in df.limit(limit).collect()]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _md_table(rows: list[Row], cols: list[str]) -> str:
    if not rows:
        return "_no data_\n"
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _html_table(rows: list[Row], cols: list[str]) -> str:
    if not rows:
        return "<p><em>no data</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bars(items: list[tuple[str, float]], unit: str = "") -> str:
    """A horizontal bar chart as inline SVG."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    height = 22 * len(items) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="720" height="{height}" '
             'font-family="sans-serif" font-size="12">']
    for i, (label, value) in enumerate(items):
        y = 5 + 22 * i
        width = 400 * value / top
        parts.append(f'<text x="0" y="{y + 14}">{html.escape(label[:40])}</text>'
                     f'<rect x="290" y="{y}" width="{width:.1f}" height="16" fill="#4a7bd0"/>'
                     f'<text x="{295 + width:.1f}" y="{y + 13}">{value:.3g}{unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


SECTIONS = [
    ("Client inventory", "client_inventory",
     ["software_name", "software_version", "clients", "connections",
      "connections_with_telemetry", "telemetry_instances"]),
    ("Rebootstrap readiness (Metadata v13+ understands REBOOTSTRAP_REQUIRED)",
     "rebootstrap_readiness",
     ["software_name", "software_version", "clients", "ready", "not_ready", "unknown",
      "ready_ratio", "max_metadata_version"]),
    ("Latency by software (ms)", "software_latency",
     ["software_name", "software_version", "instances", "produce_request_latency_ms_avg",
      "produce_request_latency_ms_p95", "record_queue_time_ms_avg", "fetch_latency_ms_avg",
      "rebalance_latency_ms_avg", "commit_latency_ms_avg"]),
    ("Slowest instances (ms)", "slowest_instances",
     ["rank", "instance_id", "client_id", "software_name", "software_version",
      "produce_request_latency_ms", "record_queue_time_ms", "fetch_latency_ms"]),
    ("Throughput by client", "client_throughput",
     ["client_id", "source_address", "software_name", "bytes_in", "bytes_out", "seconds",
      "mb_per_s"]),
    ("Consumer-group rebalances (storms first: most in one hour)", "group_rebalances",
     ["group", "rebalances", "max_per_hour", "avg_seconds", "max_seconds",
      "last_generation", "max_members", "reasons"]),
    ("Slowest rebalances (s)", "slowest_rebalances",
     ["rank", "group", "generation", "duration_s", "members_before", "members_after",
      "reason", "assignor", "proxy"]),
]


def write_reports(tables: Tables, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {key: _rows(getattr(tables, key)) for _, key, _ in SECTIONS}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    md = [f"# kproxy fleet report\n\nGenerated {stamp}.\n"]
    body = []
    charts = {
        "client_inventory": _bars([(f"{r['software_name']} {r['software_version']}",
                                    float(r["clients"] or 0)) for r in data["client_inventory"]],
                                  " clients"),
        "rebootstrap_readiness": _bars([(f"{r['software_name']} {r['software_version']}",
                                         100.0 * float(r["ready_ratio"] or 0))
                                        for r in data["rebootstrap_readiness"]], "%"),
        "slowest_instances": _bars([(f"{r['client_id']} ({str(r['instance_id'])[:8]})",
                                     float(r["produce_request_latency_ms"] or
                                           r["fetch_latency_ms"] or 0))
                                    for r in data["slowest_instances"]], " ms"),
        "group_rebalances": _bars([(str(r["group"]), float(r["max_per_hour"] or 0))
                                   for r in data["group_rebalances"][:20]], " per hour"),
    }
    for title, key, cols in SECTIONS:
        md.append(f"## {title}\n\n{_md_table(data[key], cols)}")
        body.append(f"<h2>{html.escape(title)}</h2>{charts.get(key, '')}"
                    f"{_html_table(data[key], cols)}")
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>kproxy fleet report</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
        "margin-bottom:2em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#eee}</style></head><body>"
        f"<h1>kproxy fleet report</h1><p>Generated {stamp}.</p>{''.join(body)}</body></html>")
