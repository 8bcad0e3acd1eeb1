"""The warning for instances forgotten to make room: once, then at most once a minute."""

from __future__ import annotations

import logging
import uuid

import pytest
from prometheus_client import CollectorRegistry

from kproxy.policies.telemetry import state as t
from kproxy.policies.telemetry import subscriptions as sub
from kproxy.telemetry.counters import TelemetryCounters

ATTRS = {"client_id": "app"}


def test_evictions_are_warned_about_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    state = t.TelemetryState(sub.TelemetrySettings(max_instances=1))
    counts = TelemetryCounters(CollectorRegistry())
    caplog.set_level(logging.WARNING, "kproxy")

    def new_instance() -> None:
        assert state.get_subscriptions(uuid.UUID(int=0), ATTRS, 1_000).error_code == 0
        counts.evictions(state)

    new_instance()  # the first: nothing forgotten, nothing said
    assert not caplog.records
    for _ in range(3):  # each forgets the one before it
        new_instance()
    assert state.evicted == {"instances": 3, "bytes": 0}
    warned = [r for r in caplog.records if "forgotten to make room" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].fields["evicted_by_count"] == 1  # type: ignore[attr-defined]
