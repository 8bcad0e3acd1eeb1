"""One series per client instance out of several workers' telemetry.

A client instance pushes through whichever worker holds its connection; after a
reconnect that may be another one, and the first worker keeps the instance's series
until they expire. Each worker tells the supervisor when it last accepted a push of
each instance (``telemetry_facts``, at ``/internal/facts``) and whether series
accumulate deltas. The rule (``winners``):

- cumulative temporality (the default): an instance's series come from the worker
  that accepted its newest push, and only from it: the client counts, so its newest
  values are its highest, and a counter never goes backwards when it moves;
- delta temporality: each worker holds the sum of the deltas it received, so an
  instance's counters and histograms are summed over the workers (and the
  supervisor's ``CounterFloors`` keep them from going backwards when one worker's
  share expires or the worker restarts); its gauges come from the newest push.

Workers share the machine's monotonic clock, so push times compare. Pure.
"""

from __future__ import annotations

from typing import Any

from kproxy.policies.telemetry.state import TelemetryState

Facts = dict[str, Any]


def telemetry_facts(state: TelemetryState) -> Facts:
    """Per remembered instance its last accepted push (ms, monotonic; 0: none yet), and
    the temporality. As many entries as instances (``max_instances`` and the instances'
    byte budget bound them). Not swept here: the /metrics scrape just before did that,
    and the state sweeps itself at most once a second as requests come."""
    return {"delta": state.settings.delta_temporality,
            "pushed": [[inst.attrs["client_instance_id"], inst.pushed_ms]
                       for inst in state.instances.values()]}


def winners(facts: list[Facts | None]) -> dict[str, int]:
    """Instance id -> the index of the worker that accepted its newest push."""
    best: dict[str, tuple[int, int]] = {}
    for index, worker in enumerate(facts):
        for instance, pushed in (worker or {}).get("pushed", []):
            if instance not in best or pushed > best[instance][0]:
                best[instance] = (int(pushed), index)
    return {instance: index for instance, (_, index) in best.items()}


def shared(facts: list[Facts | None]) -> set[str]:
    """Instances more than one worker remembers (they reconnected to another one)."""
    seen: set[str] = set()
    both: set[str] = set()
    for worker in facts:
        for instance, _ in (worker or {}).get("pushed", []):
            (both if instance in seen else seen).add(instance)
    return both


def delta(facts: list[Facts | None]) -> bool:
    return any((f or {}).get("delta") for f in facts)
