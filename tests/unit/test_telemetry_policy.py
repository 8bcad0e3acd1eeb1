"""Telemetry policy and metric store, as pure logic: broker semantics field by field."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from kproxy.codecs import compression
from kproxy.policies.telemetry import state as t
from kproxy.policies.telemetry import subscriptions as sub
from kproxy.policies.telemetry.store import MetricsStore, label_name, metric_name

from ..otlp_samples import librdkafka_like_payload

ATTRS = {"client_id": "app-1", "client_software_name": "confluent-kafka-python",
         "client_software_version": "2.16.1", "client_source_address": "10.0.0.7",
         "client_source_port": "51234"}
ID = uuid.UUID("11111111-2222-3333-4444-555555555555")


def subs(*entries: dict[str, object]) -> tuple[sub.Subscription, ...]:
    return sub.parse_subscriptions(entries)


def settings(*entries: dict[str, object], **kw: object) -> sub.TelemetrySettings:
    return sub.TelemetrySettings(subscriptions=subs(*entries), **kw)  # type: ignore[arg-type]


def test_union_of_matching_subscriptions_and_smallest_interval() -> None:
    s = settings(
        {"name": "producers", "metrics": ["org.apache.kafka.producer."], "interval_ms": 5000,
         "match": {"client_software_name": "confluent-.*"}},
        {"name": "latency", "metrics": ["org.apache.kafka.consumer.fetch"], "interval_ms": 2000,
         "match": {"client_id": "app-\\d+", "client_source_address": "10\\..*"}},
        {"name": "other", "metrics": ["x"], "interval_ms": 100, "match": {"client_id": "app"}},
    )
    r = sub.resolve(s, ID, ATTRS)
    assert r.requested_metrics == ("org.apache.kafka.consumer.fetch",
                                   "org.apache.kafka.producer.")
    assert r.interval_ms == 2000  # "other" needs a full match of client_id: it does not apply


def test_star_means_all_and_no_match_means_nothing() -> None:
    everything = sub.resolve(settings({"metrics": ["*", "a"], "interval_ms": 1000}), ID, ATTRS)
    assert everything.requested_metrics == ("*",)  # the broker's wire form for "all"
    # The empty prefix, which older policy files may hold, means all too.
    legacy = sub.resolve(settings({"metrics": ["", "a"], "interval_ms": 1000}), ID, ATTRS)
    assert legacy.requested_metrics == ("*",)
    assert legacy.subscription_id == everything.subscription_id
    nothing = sub.resolve(settings({"metrics": ["a"], "match": {"client_id": "other"}}), ID, ATTRS)
    assert nothing.requested_metrics == () and nothing.interval_ms == sub.DEFAULT_INTERVAL_MS


def test_subscription_id_is_deterministic_and_tracks_config_and_instance() -> None:
    a = settings({"metrics": ["*"], "interval_ms": 1000})
    assert sub.resolve(a, ID, ATTRS).subscription_id == sub.resolve(a, ID, ATTRS).subscription_id
    other_instance = sub.resolve(a, uuid.UUID(int=7), ATTRS).subscription_id
    assert other_instance != sub.resolve(a, ID, ATTRS).subscription_id
    b = settings({"metrics": ["*"], "interval_ms": 2000})
    assert sub.resolve(b, ID, ATTRS).subscription_id != sub.resolve(a, ID, ATTRS).subscription_id
    assert -(2**31) <= sub.resolve(a, ID, ATTRS).subscription_id < 2**31


@pytest.mark.parametrize(("entry", "needle"), [
    ({"metrics": "*"}, "metrics must be a list"),
    ({"metrics": ["*"], "interval_ms": 50}, "interval_ms must be 100..3600000"),
    ({"metrics": ["*"], "match": {"hostname": "x"}}, "match.hostname: not one of"),
    ({"metrics": ["*"], "match": {"client_id": "("}}, "match.client_id: bad regex"),
    ({"metrics": ["*"], "intervl_ms": 5}, "unknown field"),
])
def test_bad_subscriptions_are_named(entry: dict[str, object], needle: str) -> None:
    with pytest.raises(sub.PolicyError, match=needle):
        sub.parse_subscriptions([{"name": "s1", **entry}])


def _state(**kw: object) -> t.TelemetryState:
    return t.TelemetryState(settings({"metrics": ["*"], "interval_ms": 1000}, **kw),
                            new_instance_id=lambda: ID)


def test_get_assigns_an_id_then_keeps_it_and_throttles() -> None:
    st = _state()
    first = st.get_subscriptions(uuid.UUID(int=0), ATTRS, now=10_000)
    assert first.error_code == t.NONE and first.instance and first.instance.uuid == ID
    again = st.get_subscriptions(ID, ATTRS, now=10_500)
    assert again.error_code == t.THROTTLING_QUOTA_EXCEEDED
    assert st.get_subscriptions(ID, ATTRS, now=11_000).error_code == t.NONE


def test_push_checks_in_broker_order() -> None:
    st = _state(max_bytes=2000)
    inst = st.get_subscriptions(ID, ATTRS, now=10_000).instance
    assert inst is not None
    sub = inst.subscription_id
    payload = compression.compress(4, librdkafka_like_payload())
    # First push right after a Get is accepted even inside the interval.
    assert st.push(ID, sub, False, 4, payload, ATTRS, now=10_100).error_code == t.NONE
    # Early push: throttled, whatever else is wrong with it.
    assert st.push(ID, sub + 1, False, 9, payload, ATTRS, now=10_200).error_code == (
        t.THROTTLING_QUOTA_EXCEEDED)
    assert st.push(ID, sub + 1, False, 9, payload, ATTRS, now=11_200).error_code == (
        t.UNKNOWN_SUBSCRIPTION_ID)
    assert st.push(ID, sub, False, 9, payload, ATTRS, now=12_300).error_code == (
        t.UNSUPPORTED_COMPRESSION_TYPE)
    assert st.push(ID, sub, False, 0, b"x" * 2001, ATTRS, now=13_400).error_code == (
        t.TELEMETRY_TOO_LARGE)
    assert st.push(ID, sub, False, 4, b"\x28\xb5\x2f\xfd garbage", ATTRS,
                   now=14_500).error_code == t.INVALID_RECORD
    ok = st.push(ID, sub, False, 4, payload, ATTRS, now=15_600)
    assert ok.error_code == t.NONE and ok.metrics


def test_zero_instance_id_push_is_invalid() -> None:
    st = _state()
    assert st.push(uuid.UUID(int=0), 0, False, 0, b"", ATTRS, now=1).error_code == (
        t.INVALID_REQUEST)


def test_terminating_push_is_accepted_once_even_early() -> None:
    st = _state()
    inst = st.get_subscriptions(ID, ATTRS, now=10_000).instance
    assert inst is not None
    sub = inst.subscription_id
    assert st.push(ID, sub, False, 0, b"", ATTRS, now=10_100).error_code == t.NONE
    assert st.push(ID, sub, True, 0, b"", ATTRS, now=10_200).error_code == t.NONE
    assert st.push(ID, sub, True, 0, b"", ATTRS, now=10_300).error_code == t.INVALID_REQUEST


def test_reconfigure_makes_the_old_subscription_stale() -> None:
    st = _state()
    inst = st.get_subscriptions(ID, ATTRS, now=10_000).instance
    assert inst is not None
    st.reconfigure(settings({"metrics": ["org."], "interval_ms": 1000}))
    stale = st.push(ID, inst.subscription_id, False, 0, b"", ATTRS, now=10_100)
    assert stale.error_code == t.UNKNOWN_SUBSCRIPTION_ID
    # After a 117 the client may fetch again at once.
    fresh = st.get_subscriptions(ID, ATTRS, now=10_200)
    assert fresh.error_code == t.NONE and fresh.instance
    assert fresh.instance.requested_metrics == ("org.",)


def test_a_reload_of_the_proxys_own_bounds_keeps_subscriptions() -> None:
    """Only what a subscription told the client makes it stale; a lower instance bound
    forgets the least recently seen at once, counted by the bound."""
    st = _state()
    ids = [uuid.UUID(int=i) for i in range(1, 4)]
    made = [st.get_subscriptions(iid, ATTRS, now=10_000 + i).instance for i, iid in
            enumerate(ids)]
    assert all(made)
    bounds = dataclasses.replace(st.settings, refused_push_hold_ms=0, max_instances=2,
                                 max_instance_bytes=10**9)
    st.reconfigure(bounds)
    assert list(st.instances) == keys(ids[1:]) and st.evicted == {"instances": 1, "bytes": 0}
    inst = made[2]
    assert inst is not None
    kept = st.push(ids[2], inst.subscription_id, False, 0, b"", ATTRS, now=10_100)
    assert kept.error_code == t.NONE


def keys(ids: list[uuid.UUID]) -> list[int]:
    """The state's keys for ``ids``."""
    return [i.int for i in ids]


def test_expiry_and_lru_bound_forget_instances() -> None:
    forgotten: list[int] = []  # instance ids as the state keys them (UUID.int)
    st = t.TelemetryState(settings({"metrics": ["*"], "interval_ms": 1000}, max_instances=3),
                          on_forget=forgotten.append)
    ids = [uuid.UUID(int=i) for i in range(1, 6)]
    for i, iid in enumerate(ids):
        st.get_subscriptions(iid, ATTRS, now=1000 + i)
    assert list(st.instances) == keys(ids[2:]) and forgotten == keys(ids[:2])  # LRU bound
    assert st.expire(now=1000 + 60_000) == 0  # max(60 s, 3 x interval) not yet passed
    assert st.expire(now=1005 + 60_001) == 3 and not st.instances


def test_expiry_in_steps_looks_at_a_bounded_number_each_step() -> None:
    """``expire_steps`` (a scrape's sweep): each step looks at ``per_step`` instances
    or ends at one forgotten; instances that change between steps are judged as they
    are then; the result is ``expire``'s."""
    forgotten: list[int] = []  # instance ids as the state keys them (UUID.int)
    st = t.TelemetryState(settings({"metrics": ["*"], "interval_ms": 1000}),
                          on_forget=forgotten.append)
    ids = [uuid.UUID(int=i) for i in range(1, 11)]
    for i, iid in enumerate(ids):
        st.get_subscriptions(iid, ATTRS, now=1000 + (i % 2) * 50_000)  # odd ones younger
    steps = st.expire_steps(now=1000 + 60_001, per_step=3)
    assert next(steps) == 1 and forgotten == keys(ids[:1])  # the first, old: forgotten
    st.instances[ids[2].int].last_seen_ms = 1000 + 60_001  # seen again meanwhile
    # A full step of three looked at (none old now), then a step per old one, the end.
    assert list(steps) == [1, 2, 3, 4, 4]
    assert forgotten == keys([ids[0], ids[4], ids[6], ids[8]])
    assert set(st.instances) == set(keys([ids[2], *ids[1::2]]))


def test_a_sweep_looks_at_no_instance_while_none_can_have_expired() -> None:
    """A sweep copies every instance's id to look at them, which held a scrape's loop 4-6
    ms at 20,000 instances. A completed sweep knows the earliest any instance left can
    expire; till then a sweep is one step that looks at none. A new instance, one seen
    again and a terminating push move that moment as they happen, and a sweep left
    unfinished (a scrape cancelled) leaves it as it was."""
    forgotten: list[int] = []
    st = t.TelemetryState(settings({"metrics": ["*"], "interval_ms": 300_000}),
                          on_forget=forgotten.append)  # instances expire 900 s unseen
    ids = [uuid.UUID(int=i) for i in range(1, 5)]
    for iid in ids[:3]:  # the requests' own sweep completes: all expire at 901 s
        st.get_subscriptions(iid, ATTRS, now=1000)
    assert list(st.expire_steps(now=2000, per_step=1)) == [0]  # none due: one step
    # A terminating push: its instance now expires 120 s on, before the others.
    inst = st.instances[ids[0].int]
    ended = st.push(ids[0], inst.subscription_id, True, 0, b"", ATTRS, now=10_000)
    assert ended.error_code == t.NONE
    # All looked at, the pushed one last (a request moves its instance to the end).
    assert list(st.expire_steps(now=130_001, per_step=1)) == [0, 0, 1, 1]
    assert forgotten == keys(ids[:1])
    st.get_subscriptions(ids[3], ATTRS, now=140_000)  # new: expires at 1,040 s
    abandoned = st.expire_steps(now=901_001, per_step=1)  # two due: it looks...
    assert next(abandoned) == 1 and forgotten == keys(ids[:2])
    abandoned.close()  # ... and is left after its first step
    assert st.expire(now=901_001) == 1 and forgotten == keys(ids[:3])
    assert list(st.expire_steps(now=1_000_000, per_step=1)) == [0]
    assert st.expire(now=1_040_001) == 1 and not st.instances
    st.get_subscriptions(ids[0], ATTRS, now=2_000_000)  # after a sweep that found none
    assert st.expire(now=2_900_001) == 1 and not st.instances


def test_requests_sweep_a_step_each_and_never_keep_an_expired_instance() -> None:
    """A request advances the expiry sweep by one step (``REQUEST_EXPIRY_STEP``
    instances), not all of them at once; the instance it names is judged on its own:
    expired, it is forgotten (its series with it) and started afresh."""
    forgotten: list[int] = []  # instance ids as the state keys them (UUID.int)
    st = t.TelemetryState(settings({"metrics": ["*"], "interval_ms": 1000}),
                          on_forget=forgotten.append)
    ids = [uuid.UUID(int=i) for i in range(1, 201)]
    for iid in ids:
        st.get_subscriptions(iid, ATTRS, now=1000)
    before = st.instances[ids[-1].int]
    late = 1000 + 60_001  # every instance expired
    pushed = st.push(ids[-1], before.subscription_id, False, 0, b"", ATTRS,
                     now=late)
    assert pushed.instance is not None and pushed.instance is not before  # afresh
    # That request swept one step and forgot its own instance, no more.
    assert forgotten == keys([ids[0], ids[-1]])
    n = 1
    while len(forgotten) < len(ids):  # each further request: one more step
        st.get_subscriptions(ids[-1], ATTRS, now=late + n)
        n += 1
    assert n > len(ids) // t.REQUEST_EXPIRY_STEP
    assert set(st.instances) == {ids[-1].int}


def test_store_kinds_names_and_labels() -> None:
    from kproxy.codecs.otlp import model as otlp

    store = MetricsStore(prefix="kafka_client_")
    stats = store.ingest(ID, {"client_instance_id": str(ID), "client_id": "app"},
                         otlp.decode_metrics_data(librdkafka_like_payload(points=2)), False)
    assert stats.points == 5 and not stats.dropped_by_cap
    families = {f.name: (f.kind, rows) for f, rows in store.snapshot()}
    total_name = "kafka_client_org_apache_kafka_producer_connection_creation"
    assert families[total_name][0] == "counter"
    latency = families["kafka_client_org_apache_kafka_producer_node_request_latency_avg"]
    assert latency[0] == "gauge"
    assert sorted(dict(labels)["node_id"] for labels, _ in latency[1]) == ["0", "1"]
    kind, [(labels, hist)] = families["kafka_client_org_apache_kafka_producer_record_queue_time"]
    assert kind == "histogram" and dict(labels)["client_id"] == "app"
    assert hist.cumulative_buckets() == [("1.0", 1.0), ("5.0", 3.0), ("+Inf", 6.0)]
    assert metric_name("", "a.b-c") == "a_b_c" and label_name("client_id") == "attr_client_id"


def test_store_accumulates_deltas_and_caps_series() -> None:
    from kproxy.codecs.otlp import model as otlp

    def delta_payload(value: int, node: int) -> list[otlp.ResourceMetrics]:
        return [otlp.ResourceMetrics({}, [otlp.ScopeMetrics("s", "1", [otlp.Metric(
            "requests", "", "", "sum", "delta", True,
            [otlp.NumberPoint({"node.id": node}, 0, 0, value)])])])]

    store = MetricsStore(max_series=2)
    store.ingest(ID, {}, delta_payload(3, 1), delta=True)
    store.ingest(ID, {}, delta_payload(4, 1), delta=True)
    [(fam, [(labels, series)])] = store.snapshot()
    assert series.value == 7 and fam.kind == "counter" and dict(labels)["node_id"] == "1"
    store.ingest(ID, {}, delta_payload(1, 2), delta=True)
    capped = store.ingest(ID, {}, delta_payload(1, 3), delta=True)
    assert capped.dropped_by_cap == 1 and store.total == 2
    store.forget(ID)
    assert store.total == 0 and store.snapshot() == []
