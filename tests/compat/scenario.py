"""What every client in the matrix does, and how a run is reported.

Each client: create the topic (where it has an admin API), produce ``MESSAGES``
keyed messages, consume them all in a consumer group with commits, check the commit
held (a second member of the group gets nothing more), and list/describe groups
where it can. A driver prints one JSON object as its last line of output:
``{"steps": {step: "ok" | "n/a: why" | "fail: why"}, "version": "..."}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MESSAGES = 2000
PARTITIONS = 3
STEPS = ("admin", "produce", "consume", "commit", "groups")
# tansu waits session.timeout/2 before completing a join: keep it short.
SESSION_TIMEOUT_MS = 6000


@dataclass
class Outcome:
    """One client at one target (direct or through kproxy)."""

    steps: dict[str, str] = field(default_factory=dict)
    version: str = ""
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and all(not s.startswith("fail") for s in self.steps.values()) \
            and self.steps.get("consume") == "ok"

    def summary(self) -> str:
        if self.ok:
            return "pass"
        if self.error:
            return "FAIL"
        failed = [k for k, v in self.steps.items() if v.startswith("fail")]
        return "FAIL (" + ", ".join(failed or ["consume"]) + ")"

    def first_failure(self) -> str:
        if self.error:
            return self.error
        for step, state in self.steps.items():
            if state.startswith("fail"):
                return f"{step}: {state[5:].strip()}"
        return ""


def parse_output(stdout: str) -> Outcome:
    """The last JSON line a driver printed, or an error describing what it printed."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                break
            return Outcome(steps=dict(data.get("steps", {})), version=str(data.get("version", "")),
                           error=str(data.get("error", "")))
    tail = stdout.strip().splitlines()[-3:]
    return Outcome(error="driver printed no result: " + " | ".join(tail)[:300])


def expected_values() -> list[int]:
    return list(range(MESSAGES))
