"""docs/compatibility.md from a matrix run: the table, then what breaks direct and why."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from .clients import Client
from .scenario import MESSAGES, Outcome
from .why import EXPLANATIONS

HEADER = f"""# Client compatibility

Written by `make compat` (`tests/compat/`); do not edit by hand. Each client runs the
same scenario twice, DIRECT against a real tansu broker and THROUGH kproxy in front of the
same broker: create a topic (where the client has an admin API), produce {MESSAGES:,} keyed
messages, consume them all in a consumer group and commit, check the committed offsets,
and list and describe the group (where the client can). Each client is installed into its
own environment under `.compat/` by `tests/compat/install.py` (`make compat-tools`).

The rule kproxy keeps: **every client that works direct works through kproxy.**
"""


@dataclass
class Row:
    client: Client
    direct: Outcome
    proxied: Outcome

    @property
    def version(self) -> str:
        got = getattr(self.proxied, "version", "") or getattr(self.direct, "version", "")
        return got or self.client.version


def _cell(outcome: object) -> str:
    if str(getattr(outcome, "error", "")).startswith("cannot be installed"):
        return "not run"
    return "pass" if getattr(outcome, "ok", False) else "**fail**"


def _notes(row: Row) -> str:
    notes = []
    if row.client.note:
        notes.append(row.client.note)
    for outcome in (row.proxied, row.direct):
        for step, state in getattr(outcome, "steps", {}).items():
            if state.startswith(("n/a", "ok:")):
                notes.append(f"{step}: {state.split(':', 1)[1].strip()}")
        break
    for label, outcome in (("direct", row.direct), ("kproxy", row.proxied)):
        if _cell(outcome) == "not run":
            notes.append(outcome.first_failure())
            break
        if not getattr(outcome, "ok", False):
            notes.append(f"{label}: {outcome.first_failure()[:160]}")
    return "; ".join(n.replace("|", "/").replace("\n", " ") for n in notes)


def write_report(rows: list[Row], out: Path) -> None:
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    lines = [HEADER, f"Last run: {today}.\n",
             "| client | version | direct | through kproxy | notes |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.client.name} | {row.version} | {_cell(row.direct)} | "
                     f"{_cell(row.proxied)} | {_notes(row)} |")
    failing = [r for r in rows if not getattr(r.direct, "ok", False)]
    if failing:
        lines += ["", "## Clients that fail direct, or do not run here", ""]
        for row in failing:
            text = EXPLANATIONS.get(row.client.slug) or EXPLANATIONS.get(row.client.driver) or (
                "Not yet analysed: " + row.direct.first_failure())
            lines += [f"### {row.client.name} {row.version}", "", text, ""]
            if _cell(row.direct) != "not run":
                fixed = "yes" if getattr(row.proxied, "ok", False) else "no"
                lines += [f"Fixed by kproxy: **{fixed}**.", ""]
    out.write_text("\n".join(lines).rstrip() + "\n")
