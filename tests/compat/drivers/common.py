"""What every Python driver shares (stdlib only: it runs inside each client's venv)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--deadline", type=float, default=120.0)
    return p.parse_args()


class Result:
    """Steps in order; the first failing step stops the run (later ones depend on it)."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.steps: dict[str, str] = {}

    def step(self, name: str, fn: Callable[[], Any]) -> bool:
        try:
            outcome = fn()
        except Exception as exc:  # a driver reports, never crashes
            traceback.print_exc(file=sys.stderr)
            self.steps[name] = f"fail: {type(exc).__name__}: {exc}"[:300]
            return False
        self.steps[name] = outcome if isinstance(outcome, str) else "ok"
        return not self.steps[name].startswith("fail")

    def emit(self) -> None:
        print(json.dumps({"version": self.version, "steps": self.steps}), flush=True)


def check_values(values: list[int], expected: int) -> str:
    if sorted(values) == list(range(expected)):
        return "ok"
    return f"fail: {len(values)} received, {len(set(values))} distinct, {expected} expected"


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0
