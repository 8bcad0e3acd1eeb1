"""Logging set-up (text or JSON lines) and a limiter for events that can repeat fast."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict

from kproxy.policies.bounds import MAX_FIELD_CHARS, MAX_KEY_CHARS, bounded, clipped

log = logging.getLogger("kproxy")
# Distinct keys a RateLimitedLog remembers; the least recently logged go first.
MAX_RATELOG_KEYS = 1024


def _field(value: object) -> object:
    """A log field as written: client-chosen strings (client ids) clipped."""
    if isinstance(value, str):
        return clipped(value, MAX_FIELD_CHARS)
    return value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: _field(v) for k, v in fields.items()})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{k}={_field(v)}" for k, v in fields.items())
        return line


def setup(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimitedLog:
    """Logs a given key at most once per interval and counts what it held back.

    Keys may include what a client chose (a peer address, a client id), so they are
    shortened and at most ``max_keys`` are remembered, least recently logged out
    first; a forgotten key merely logs again sooner.
    """

    def __init__(self, interval: float = 30.0, max_keys: int = MAX_RATELOG_KEYS) -> None:
        self.interval = interval
        self.max_keys = max_keys
        # key -> (last logged at, occurrences held back since)
        self._keys: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __call__(self, level: int, key: str, msg: str, **fields: object) -> None:
        now = time.monotonic()
        key = bounded(key, MAX_KEY_CHARS)
        found = self._keys.get(key)
        if found is not None and now - found[0] < self.interval:
            self._keys[key] = (found[0], found[1] + 1)
            return
        self._keys[key] = (now, 0)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        if found is not None and found[1]:
            fields = {**fields, "suppressed": found[1]}
        log.log(level, msg, extra={"fields": fields})
