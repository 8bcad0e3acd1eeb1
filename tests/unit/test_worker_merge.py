"""The supervisor's merge of several workers: one group model, one series per instance.

Two ``GroupTracker``s / ``TelemetryState``s stand for two workers, fed as the
relayed traffic would feed them; their facts go through JSON as on the wire.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kproxy.metrics.group_merge import GroupMerge, group_facts
from kproxy.metrics.telemetry_merge import telemetry_facts
from kproxy.metrics.worker_merge import CARRY_KEEP_S, MAX_CARRIED, CounterFloors, WorkerMerge
from kproxy.policies.groups import GroupLimits, GroupTracker
from kproxy.policies.telemetry.state import NONE, TelemetryState
from kproxy.policies.telemetry.subscriptions import Subscription, TelemetrySettings

from ..otlp_samples import librdkafka_like_payload


def wire(facts: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(facts))  # type: ignore[no-any-return]


def join_round(a: GroupTracker, b: GroupTracker, gen: int, on_a: list[str], on_b: list[str],
               t: float) -> None:
    """One classic round: the leader (first of ``on_a``) on worker a, members on both."""
    everyone = on_a + on_b
    for tracker, members in ((a, on_a), (b, on_b)):
        for m in members:
            tracker.join_request("g", m, "consumer", None, t)
            tracker.join_response("g", 0, gen, "range", on_a[0], m,
                                  everyone if m == on_a[0] else None, t + 0.1)
    for tracker, members in ((a, on_a), (b, on_b)):
        for m in members:
            tracker.sync_response("g", m, gen, 0, 1, t + 0.2)


def metric(text: str, prefix: str) -> float | None:
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith(prefix)]
    assert len(found) <= 1, f"{prefix} appears {len(found)} times"
    return found[0] if found else None


def test_a_group_split_over_two_workers_shows_what_one_process_would() -> None:
    a, b = GroupTracker(), GroupTracker()
    join_round(a, b, 1, ["c1", "c2"], ["c3"], 10.0)
    merge = GroupMerge()
    [g] = merge.merge([wire(group_facts(a, 11)), wire(group_facts(b, 11))], 11)
    # Worker a never sees c3's SyncGroup, so it never completes generation 1 alone.
    assert a.groups["g"].generation == -1 and b.groups["g"].generation == 1
    assert (g.generation, sorted(g.members), g.rebalances) == (1, ["c1", "c2", "c3"], 1)
    # c3 dies without a LeaveGroup; c1 and c2 go on in generation 2 through worker a.
    join_round(a, b, 2, ["c1", "c2"], [], 20.0)
    for _ in range(3):  # scraped again and again: counted once per generation
        [g] = merge.merge([wire(group_facts(a, 21)), wire(group_facts(b, 21))], 21)
    assert "c3" in b.groups["g"].members  # worker b still holds it ...
    assert (g.generation, sorted(g.members), g.rebalances) == (2, ["c1", "c2"], 2)
    # c2 leaves through worker b (its connection moved); worker a still holds it.
    b.leave("g", ["c2"], 0, 30.0)
    [g] = merge.merge([wire(group_facts(a, 31)), wire(group_facts(b, 31))], 31)
    assert "c2" in a.groups["g"].members and sorted(g.members) == ["c1"]
    text = merge.exposition([g])
    assert 'kproxy_group_members{group="g"} 1' in text
    assert 'kproxy_group_generation{group="g"} 2' in text
    assert 'kproxy_group_rebalances_total{group="g"} 2' in text
    assert "kproxy_group_rebalance_seconds_count 2" in text


def test_rebalances_never_go_backwards_when_a_worker_restarts() -> None:
    a, b = GroupTracker(), GroupTracker()
    merge = GroupMerge()
    for gen in range(1, 4):
        join_round(a, b, gen, ["c1"], ["c2"], 10.0 * gen)
    [g] = merge.merge([wire(group_facts(a, 40)), wire(group_facts(b, 40))], 40)
    assert g.rebalances == 3
    b = GroupTracker()  # restarted: it forgot everything
    [g] = merge.merge([wire(group_facts(a, 41)), wire(group_facts(b, 41))], 41)
    assert g.rebalances == 3
    join_round(a, b, 4, ["c1"], ["c2"], 50.0)
    [g] = merge.merge([wire(group_facts(a, 51)), wire(group_facts(b, 51))], 51)
    assert (g.rebalances, g.generation) == (4, 4)


def test_lag_is_the_newest_high_watermark_minus_the_newest_commit() -> None:
    a, b = GroupTracker(), GroupTracker()
    a.committed("g", [("t", 0, 10)], 1.0)
    b.committed("g", [("t", 0, 40)], 2.0)  # newer
    a.high_watermarks([("t", 0, 100)], 3.0)  # newer
    b.high_watermarks([("t", 0, 50)], 1.5)
    [g] = GroupMerge().merge([wire(group_facts(a, 4)), wire(group_facts(b, 4))], 4)
    assert g.lag == [("t", 0, 60)]


SETTINGS = TelemetrySettings(subscriptions=(Subscription("all", ("*",), 1000),))
ATTRS = {"client_id": "c", "client_software_name": "s", "client_software_version": "1",
         "client_source_address": "127.0.0.1", "client_source_port": "1"}


def test_a_push_to_a_worker_that_never_handed_out_the_subscription_is_accepted() -> None:
    a, b = TelemetryState(SETTINGS), TelemetryState(SETTINGS)
    got = a.get_subscriptions(uuid.UUID(int=0), ATTRS, 5_000)
    assert got.instance is not None
    inst, sub = got.instance.uuid, got.instance.subscription_id
    assert a.push(inst, sub, False, 0, librdkafka_like_payload(), ATTRS, 5_100).error_code == NONE
    # Its next push, after the interval, reaches worker b over a new connection.
    pushed = b.push(inst, sub, False, 0, librdkafka_like_payload(), ATTRS, 6_200)
    assert pushed.error_code == NONE and pushed.metrics
    assert b.instances[inst.int].subscription_id == sub  # every worker agrees
    # But a stale subscription id is still refused there, and pushes are still paced.
    assert b.push(inst, sub ^ 1, False, 0, None, ATTRS, 7_300).error_code != NONE
    assert b.push(inst, sub, False, 0, None, ATTRS, 7_400).error_code != NONE
    facts = [telemetry_facts(a), telemetry_facts(b)]
    assert facts[1]["pushed"] == [[str(inst), 6_200]]


def client_text(instance: str, counter: float, gauge: float) -> str:
    return ("# HELP kproxy_requests Requests\n# TYPE kproxy_requests counter\n"
            f"kproxy_requests_total 1.0\n"
            "# HELP kproxy_telemetry_client_instances Instances\n"
            "# TYPE kproxy_telemetry_client_instances gauge\n"
            "kproxy_telemetry_client_instances 1.0\n"
            "# HELP client_sent Sent\n# TYPE client_sent counter\n"
            f'client_sent_total{{client_instance_id="{instance}",client_id="c"}} {counter}\n'
            "# HELP client_queue Queue\n# TYPE client_queue gauge\n"
            f'client_queue{{client_instance_id="{instance}",client_id="c"}} {gauge}\n')


def tele(pushed: int | None, delta: bool = False) -> dict[str, Any]:
    return {"telemetry": {"delta": delta, "pushed": [] if pushed is None else [["x", pushed]]}}


def test_cumulative_an_instance_series_come_once_from_its_newest_push() -> None:
    merge = WorkerMerge()
    # Worker 0 holds the instance's older push (higher queue), worker 1 its newest.
    out = merge.merge([client_text("x", 10, 9), client_text("x", 12, 3)],
                      [tele(1_000), tele(2_000)], [0, 0], "", 1.0)
    assert metric(out, "client_sent_total") == 12 and metric(out, "client_queue") == 3
    assert metric(out, "kproxy_requests_total") == 2
    assert metric(out, "kproxy_telemetry_client_instances") == 1  # remembered by both
    # Worker 1 restarts (its share of kproxy_requests_total is lost): no step back.
    out = merge.merge([client_text("x", 14, 5), None], [tele(3_000), None], [0, 1], "", 2.0)
    assert metric(out, "client_sent_total") == 14
    out = merge.merge([client_text("x", 14, 5), client_text("y", 1, 1)],
                      [tele(3_000), {"telemetry": {"delta": False, "pushed": [["y", 1]]}}],
                      [0, 1], "", 3.0)
    assert metric(out, "kproxy_requests_total") == 3  # 2 before, worker 1's new 1
    # The worker with x's newest push is gone; worker 0 holds an older push of it.
    out = merge.merge([client_text("x", 13, 8), None], [tele(2_500), None], [0, 1], "", 4.0)
    assert metric(out, "client_sent_total") == 14 and metric(out, "client_queue") == 8


def test_a_fleet_split_over_workers_comes_out_once_per_series_under_one_header() -> None:
    """Most instances sit on one worker: their lines pass through unparsed, yet every
    family keeps one header, its samples together, and each series appears once."""
    def worker(instances: list[str], value: float) -> str:
        out = []
        for family, kind in (("client_sent", "counter"), ("client_rtt", "histogram"),
                             ("client_queue", "gauge")):
            head = f"{family}_total" if kind == "counter" else family  # as text 0.0.4 has it
            out += [f"# HELP {head} {family}", f"# TYPE {head} {kind}"]
            for i in instances:
                labels = f'client_instance_id="{i}",client_id="c"'
                if kind == "histogram":
                    out += [f'{family}_bucket{{{labels},le="1.0"}} {value}',
                            f'{family}_bucket{{{labels},le="+Inf"}} {value}',
                            f"{family}_count{{{labels}}} {value}",
                            f"{family}_sum{{{labels}}} {value}"]
                else:
                    out.append(f"{family}{'_total' if kind == 'counter' else ''}"
                               f"{{{labels}}} {value}")
        return "\n".join(out) + "\n"

    merge = WorkerMerge()
    a, b = ["a1", "a2", "both"], ["b1", "both"]
    facts = [{"telemetry": {"delta": False, "pushed": [[i, 10] for i in a]}},
             {"telemetry": {"delta": False, "pushed": [[i, 20] for i in b]}}]
    for scrape in (1.0, 2.0):
        out = merge.merge([worker(a, 5.0), worker(b, 7.0)], wire_all(facts), [0, 0], "",
                          scrape)
        families = list(text_string_to_metric_families(out))
        names = [f.name for f in families]
        assert sorted(names) == ["client_queue", "client_rtt", "client_sent",
                                 "kproxy_telemetry_client_instances"], names
        for family in families[:3]:
            keys = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
            assert len(keys) == len(set(keys)), f"{family.name}: a series twice"
            by_instance = {s.labels["client_instance_id"]: s.value for s in family.samples}
            assert set(by_instance) == {"a1", "a2", "b1", "both"}
            assert by_instance["both"] == 7.0  # the newest push's worker
            assert by_instance["a1"] == 5.0 and by_instance["b1"] == 7.0


def wire_all(facts: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    return [wire(f) for f in facts]


def test_delta_counters_add_up_and_never_go_backwards_as_an_instance_moves() -> None:
    merge = WorkerMerge()
    out = merge.merge([client_text("x", 10, 9), None], [tele(1_000, True), None], [0, 0], "", 1)
    assert metric(out, "client_sent_total") == 10
    # It moved to worker 1, which accumulates the deltas it receives from then on.
    out = merge.merge([client_text("x", 10, 9), client_text("x", 4, 2)],
                      [tele(1_000, True), tele(2_000, True)], [0, 0], "", 2)
    assert metric(out, "client_sent_total") == 14 and metric(out, "client_queue") == 2
    # Worker 0's share expires: carried, not lost.
    only_1 = client_text("x", 6, 1).replace("kproxy_requests_total 1.0",
                                           "kproxy_requests_total 2.0")
    out = merge.merge([client_text("y", 0, 0), only_1],
                      [tele(None, True), tele(3_000, True)], [0, 0], "", 3)
    assert metric(out, 'client_sent_total{client_instance_id="x"') == 16


def test_facts_stay_small_and_json() -> None:
    t = GroupTracker(GroupLimits(max_partitions=50))
    t.committed("g", [("t", p, p) for p in range(3)], 1.0)
    t.high_watermarks([("t", p, 10) for p in range(100)], 1.0)
    facts = wire(group_facts(t, 2.0))
    # Every watermark the tracker holds (another worker may hold the commits), never
    # more than its partition cap.
    assert len(facts["watermarks"]) == 50


def test_lag_when_fetches_and_commits_went_through_different_workers() -> None:
    fetching, committing = GroupTracker(), GroupTracker()
    fetching.high_watermarks([("t", 0, 100)], 1.0)  # no group traffic on this worker
    committing.committed("g", [("t", 0, 40)], 2.0)
    [g] = GroupMerge().merge([wire(group_facts(fetching, 3)), wire(group_facts(committing, 3))],
                             3)
    assert g.lag == [("t", 0, 60)]


def test_workers_own_group_lines_give_way_to_the_merged_ones() -> None:
    a, b = GroupTracker(), GroupTracker()
    join_round(a, b, 1, ["c1"], ["c2"], 10.0)
    b.join_request("g", "c2", "consumer", None, 11.0)  # b sees generation 1 complete twice
    b.sync_response("g", "c2", 1, 0, 1, 11.1)
    worker = ("# HELP kproxy_group_rebalances_total Rebalances\n"
              "# TYPE kproxy_group_rebalances_total counter\n"
              'kproxy_group_rebalances_total{group="g"} 4.0\n'
              "# HELP kproxy_group_members Members\n# TYPE kproxy_group_members gauge\n"
              'kproxy_group_members{group="g"} 1.0\n'
              "# HELP kproxy_group_rebalance_seconds_created Created\n"
              "# TYPE kproxy_group_rebalance_seconds_created gauge\n"
              "kproxy_group_rebalance_seconds_created 1.7e9\n")
    out = WorkerMerge().merge([worker, worker], [wire(group_facts(a, 12)),
                                                 wire(group_facts(b, 12))], [0, 0], "", 12)
    assert metric(out, 'kproxy_group_rebalances_total{group="g"}') == 1
    assert metric(out, 'kproxy_group_members{group="g"}') == 2
    assert out.count("# TYPE kproxy_group_rebalances_total counter") == 1
    assert "kproxy_group_rebalance_seconds_created" not in out  # two workers' timestamps


def test_carried_counter_values_are_bounded_in_time_and_count() -> None:
    floors = CounterFloors()
    key = ("kproxy_x_total", '{a="1"}')
    floors.worker(0, 0, {key: 5.0}, 0.0)
    floors.worker(0, 1, {key: 1.0}, 1.0)  # restarted: 5 carried
    assert floors.lines({key}, 1.0) == ['kproxy_x_total{a="1"} 5.0']
    floors.worker(0, 1, {}, 2.0)  # the series vanished everywhere
    assert floors.lines(set(), 2.0) == [] and key in floors.carried
    floors.lines(set(), 2.0 + CARRY_KEEP_S + 1)
    assert key not in floors.carried  # gone for good after a while
    many = {("kproxy_x_total", f'{{a="{i}"}}'): 1.0 for i in range(MAX_CARRIED + 10)}
    floors.worker(1, 0, many, 3.0)
    floors.worker(1, 1, {}, 4.0)
    assert len(floors.carried) == MAX_CARRIED
