"""The supervisor's /metrics: workers' expositions and facts, merged by the documented rules.

``kproxy.metrics.merge`` combines series line by line; this adds what needs memory or
the workers' facts (``/internal/facts``): the consumer-group families come from
``group_merge``, a client instance's series from the worker with its newest push
(``telemetry_merge``), and ``CounterFloors`` keep every summed counter from going
backwards when a worker restarts or a share of a series vanishes from one worker.
The merge does no I/O (the time is passed in); ``facts_route`` is the workers' side.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from kproxy.http.server import Handler, HttpRequest, HttpResponse
from kproxy.metrics import group_merge, telemetry_merge
from kproxy.metrics.exposition import value_text
from kproxy.metrics.merge import SAMPLE_LINE, family_of, merge_expositions
from kproxy.policies.groups import GroupLimits

_SUFFIXES = ("_bucket", "_count", "_sum", "_total")
CARRY_KEEP_S = 600.0  # a vanished series' carried value is kept this long for its return
INSTANCES = "kproxy_telemetry_client_instances"
MAX_CARRIED = 100_000  # carried values kept at most (oldest first out)
Key = tuple[str, str]  # (sample name, label text)


class CounterFloors:
    """Per worker, the last value of each summed counter sample; what a worker lost
    (a restart, a share of a series that expired there) is carried, so the sum never
    goes backwards while the series lives on in some worker."""

    def __init__(self) -> None:
        self.last: dict[int, dict[Key, float]] = {}
        self.epoch: dict[int, int] = {}
        self.carried: OrderedDict[Key, tuple[float, float]] = OrderedDict()  # (value, at)

    def _carry(self, key: Key, value: float, now: float) -> None:
        held = self.carried.pop(key, (0.0, now))[0]
        self.carried[key] = (held + value, now)
        while len(self.carried) > MAX_CARRIED:
            self.carried.popitem(last=False)

    def worker(self, index: int, epoch: int, samples: dict[Key, float], now: float) -> None:
        """One worker's counter samples this scrape; ``epoch`` changes when it restarts."""
        last = self.last.get(index, {})
        restarted = self.epoch.get(index, epoch) != epoch
        self.epoch[index] = epoch
        for key, before in last.items():
            value = samples.get(key)
            if restarted or value is None or value < before:
                self._carry(key, before, now)
        self.last[index] = dict(samples)

    def lines(self, present: set[Key], now: float) -> list[str]:
        """The carried values of series some worker still reports; old ones dropped."""
        for key in [k for k, (_, at) in self.carried.items() if now - at > CARRY_KEEP_S
                    and k not in present]:
            del self.carried[key]
        out = []
        for key, (value, _) in self.carried.items():
            if key in present:
                self.carried[key] = (value, now)
                out.append(f"{key[0]}{key[1]} {value_text(value)}")
        return out


@dataclass
class ClientLines:
    """How client telemetry lines are taken this scrape (cumulative temporality).

    A line of the worker with its instance's newest push (``won``) is the only one of
    its series: it is passed through as it came, unparsed, except a counter of an
    instance ``watched`` (held by more than one worker now, or at a scrape before while
    some worker still reports it), which is served at least as high as before
    (``before``, ``now``). Lines of an instance no worker told of are combined.
    """

    won: dict[str, int]
    delta: bool
    watched: set[str]
    before: dict[Key, float]
    now: dict[Key, float] = field(default_factory=dict)
    now_watched: set[str] = field(default_factory=set)
    passed: dict[str, list[str]] = field(default_factory=dict)


class WorkerMerge:
    def __init__(self, limits: GroupLimits | None = None) -> None:
        self.groups = group_merge.GroupMerge(limits)
        self.floors = CounterFloors()
        self._lock = threading.Lock()  # scrapes merge on threads; one at a time
        # Cumulative client counters of watched instances: the highest value served,
        # per series, so that one never goes backwards when the worker with an
        # instance's newest push goes away and an older push is all that is left.
        self.highest: dict[Key, float] = {}
        self.watched: set[str] = set()
        # The merged groups of the last scrape, for a status page to show.
        self.last_groups: list[group_merge.MergedGroup] = []

    def merge_groups(self, facts: list[dict[str, Any]], now: float
                     ) -> list[group_merge.MergedGroup]:
        """The groups alone (the status page's history step), kept as ``last_groups``;
        each generation is still counted once, whichever of this and a scrape sees it."""
        with self._lock:
            self.last_groups = self.groups.merge(facts, now)
            return self.last_groups

    def merge(self, texts: list[str | None], facts: list[dict[str, Any] | None],
              epochs: list[int], own: str, now: float) -> str:
        """``texts`` and ``facts`` per worker (None: not answered), ``epochs`` its restarts."""
        with self._lock:
            return self._merge(texts, facts, epochs, own, now)

    def _merge(self, texts: list[str | None], facts: list[dict[str, Any] | None],
               epochs: list[int], own: str, now: float) -> str:
        tele = [(f or {}).get("telemetry") for f in facts]
        delta = telemetry_merge.delta(tele)
        clients = ClientLines(telemetry_merge.winners(tele), delta,
                              telemetry_merge.shared(tele) | self.watched, self.highest)
        group_facts = [f for f in facts if f and "groups" in f]
        replaced = set(group_merge.FAMILIES) if group_facts else set()
        extra: list[str] = []
        if all(tele[i] is not None for i, t in enumerate(texts) if t is not None) and any(tele):
            # Instances remembered: each once, however many workers remember it.
            replaced.add(INSTANCES)
            extra.append(f"# HELP {INSTANCES} Client instances remembered (each once)\n"
                         f"# TYPE {INSTANCES} gauge\n{INSTANCES} {len(clients.won)}\n")
        kept: list[str] = []
        present: set[Key] = set()
        for index, text in enumerate(texts):
            if text is None:
                continue
            lines, counters = _filter(index, text, replaced, clients)
            self.floors.worker(index, epochs[index], counters, now)
            present.update(counters)
            kept.append(lines)
        self.highest, self.watched = clients.now, clients.now_watched
        carry = "\n".join(self.floors.lines(present, now))
        if carry:
            extra.append(carry + "\n")
        if group_facts:
            self.last_groups = self.groups.merge(group_facts, now)
            extra.append(self.groups.exposition(self.last_groups))
        return merge_expositions([*kept, *extra, own], sum_clients=delta,
                                 passed=clients.passed)


def _filter(index: int, text: str, replaced: set[str], clients: ClientLines
            ) -> tuple[str, dict[Key, float]]:
    """A worker's exposition without what another source replaces or ``clients`` passes
    through (into ``clients.passed``); its summed counters."""
    types: dict[str, str] = {}
    out: list[str] = []
    counters: dict[Key, float] = {}
    won, delta, watched, passed = clients.won, clients.delta, clients.watched, clients.passed
    # Per sample name, decided once: None (left out), or (additive, client, family).
    decided: dict[str, tuple[bool, bool, str] | None] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
                decided.clear()
            if len(parts) > 2 and _base(parts[2]) in replaced:
                continue
            out.append(line)
            continue
        brace = line.find("{")
        sample = line[:brace] if brace > 0 else line.partition(" ")[0]
        if sample in decided:
            how = decided[sample]
        else:
            family = family_of(sample, types, _SUFFIXES)
            kind = types.get(family, "untyped")
            how = decided[sample] = None if _base(family) in replaced else (
                kind in ("counter", "histogram", "summary") and not sample.endswith("_created"),
                not family.startswith("kproxy_"), family_of(sample, types))
        if how is None:
            continue
        additive, client, family = how
        if not additive and not client:
            out.append(line)
            continue
        if client and not (delta and additive):  # delta counters add up over workers
            instance = _instance(line)
            winner = won.get(instance) if instance is not None else None
            if winner is not None:
                if winner != index:
                    continue  # another worker has this instance's newest push
                if not additive or instance not in watched:
                    passed.setdefault(family, []).append(line)
                    continue
        match = SAMPLE_LINE.match(line)
        if match is None:
            continue
        labels = match.group(2) or ""
        if additive and (delta or not client):
            with contextlib.suppress(ValueError):
                counters[(sample, labels)] = float(match.group(3))
        elif additive:
            with contextlib.suppress(ValueError):
                key, value = (sample, labels), float(match.group(3))
                top = max(value, clients.before.get(key, value), clients.now.get(key, value))
                clients.now[key] = top
                instance = _instance(line)
                if instance is not None:
                    clients.now_watched.add(instance)
                if top != value:
                    line = f"{sample}{labels} {value_text(top)}"
        out.append(line)
    return "\n".join(out) + "\n", counters


_ID = 'client_instance_id="'


def _instance(line: str) -> str | None:
    """The client instance id in a sample line's labels, found without a regex."""
    at = line.find(_ID)
    if at < 0:
        return None
    start = at + len(_ID)
    end = line.find('"', start)
    return line[start:end] if end > 0 else None


def _base(family: str) -> str:
    """A family's name without the suffix the text format gives a counter's header and a
    family's ``_created`` timestamps."""
    return family.removesuffix("_total").removesuffix("_created")


def facts_route(groups: Callable[[], dict[str, Any]] | None,
                telemetry: Callable[[], dict[str, Any]] | None) -> Handler:
    """A worker's ``/internal/facts``: what the supervisor merges (JSON)."""
    async def facts(req: HttpRequest) -> HttpResponse:
        body: dict[str, Any] = {}
        if groups is not None:
            body.update(groups())
        if telemetry is not None:
            body["telemetry"] = telemetry()
        # Encoded on a thread: the lists are this moment's copies, the loop goes on.
        text = await trio.to_thread.run_sync(
            lambda: json.dumps(body, separators=(",", ":")).encode())
        return HttpResponse(200, text, "application/json")
    return facts
