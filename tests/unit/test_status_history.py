"""The status page's groups and history, without I/O: the ring (``kproxy.http.history``),
the group rows (``kproxy.metrics.group_status``) and their HTML (``status_charts``)."""

from __future__ import annotations

from html.parser import HTMLParser

from kproxy.http.history import POINTS, History, Sample, p99_ms
from kproxy.http.status_page import render
from kproxy.metrics.group_merge import GroupMerge, MergedGroup, group_facts
from kproxy.metrics.group_status import MAX_LISTED, MAX_MEMBERS, rows
from kproxy.policies.groups import GroupTracker


def sample(requests: int, conns: int = 1, fast: int = 0, slow: int = 0) -> Sample:
    s = Sample(requests=requests, bytes_in=10 * requests, bytes_out=20 * requests,
               connections=conns)
    s.latency[0] += fast  # 0.5 ms
    s.latency[10] += slow  # 1 s
    return s


def test_history_sums_processes_by_step_and_survives_a_restart() -> None:
    h = History()
    h.record(100.0, [sample(0), sample(0)])
    assert not h.points  # a first sample only sets the start
    h.record(105.0, [sample(50, 2, fast=50), sample(100, 3, fast=99, slow=1)])
    _, conns, rps, bin_, bout, p99, pushes = h.points[-1]
    assert (conns, rps, bin_, bout, pushes) == (5, 30.0, 300.0, 600.0, 0)
    assert p99 == 0.5  # 1 slow of 150: under the 99th percentile
    # Worker 1 restarted: its counters start again, and count from zero; worker 0 idle.
    h.record(110.0, [sample(50, 2, fast=50), sample(10, 1, slow=10)])
    assert h.points[-1][2] == 2.0 and h.points[-1][5] == 1000.0
    # A worker that does not answer adds nothing and is not a restart when it returns.
    h.record(115.0, [None, sample(20, 1, slow=10)])
    assert h.points[-1][1:3] == (1, 2.0)


def test_history_is_bounded_in_points_and_groups() -> None:
    h = History(max_groups=3)
    for i in range(POINTS + 50):
        h.record(float(i * 5), [sample(i)], [(f"g{i % 7}", i, i // 7)])
    assert len(h.points) == POINTS and len(h.groups) == 3
    assert all(len(series) <= POINTS for series in h.groups.values())
    out = h.as_json(["g0", "g1", "nope"])
    assert len(out["series"]["t"]) == POINTS and set(out["groups"]) <= {"g0", "g1"}


def test_p99_of_empty_and_of_the_last_bucket() -> None:
    assert p99_ms([0] * 16) is None
    assert p99_ms([0] * 15 + [5]) == 30_000.0


def test_group_history_counts_rebalances_per_step() -> None:
    h = History()
    for t, count in ((0, 4), (5, 4), (10, 6), (15, 6)):
        h.record(float(t), [sample(0)], [("g", 3, count)])
    assert h.as_json(["g"])["groups"]["g"]["rebalances"] == [0, 0, 2, 0]


def merged(gid: str, completed: list[tuple[int, float, float, str]], members: int = 1,
           lag: list[tuple[str, int, int]] | None = None) -> MergedGroup:
    return MergedGroup(gid, len(completed), {f"m{i}": (0.0, 1, 1) for i in range(members)},
                       "consumer", "range", lag or [], len(completed), completed=completed,
                       clients={f"m{i}": (f"c{i}", "lib 1.0") for i in range(members)})


def test_rows_put_storms_first_bound_the_list_and_count_the_rest() -> None:
    now = 10_000.0
    quiet = [merged(f"quiet-{i}", [(1, now - 3000, 1.0, "new member")], lag=[("t", 0, i)])
             for i in range(MAX_LISTED + 5)]
    storm = merged("storm", [(g, now - 10 * g, 2.0, "member left") for g in range(1, 5)])
    out = rows([*quiet, storm], now, wall=1_700_000_000.0)
    assert out["tracked"] == MAX_LISTED + 6 and out["more"] == 6
    first = out["listed"][0]
    assert first["group_id"] == "storm" and first["storm"] and first["rebalances_recent"] == 4
    assert first["last_rebalance"] == {"generation": 4, "at": 1_700_000_000.0 - 40,
                                       "seconds": 2.0, "reason": "member left"}
    # Then by lag: the quiet group with the most lag.
    assert out["listed"][1]["group_id"] == f"quiet-{MAX_LISTED + 4}"
    big = rows([merged("big", [], members=MAX_MEMBERS + 3)], now, 0.0)["listed"][0]
    assert len(big["members"]) == MAX_MEMBERS and big["members_more"] == 3
    assert big["state"] == "stable" and big["last_rebalance"] is None


def test_merged_facts_carry_protocol_clients_and_a_round_in_progress() -> None:
    t = GroupTracker()
    t.consumer_heartbeat("s", "", 0, None, 0, "m1", 1, 2, 10.0, protocol="streams")
    t.identify("s", "m1", "app-1", "kafka-streams 4.2", 10.0)
    t.consumer_heartbeat("s", "", 0, None, 0, "m2", 2, 0, 11.0, protocol="streams")
    facts = group_facts(t, 12.0)
    [g] = GroupMerge().merge([facts], 12.0)
    assert g.protocol == "streams" and g.clients == {"m1": ("app-1", "kafka-streams 4.2")}
    assert g.rebalancing_since == 11.0 and g.completed[-1][3] == "new member"
    row = rows([g], 13.0, 100.0)["listed"][0]
    assert row["state"] == "rebalancing" and row["rebalancing_for_s"] == 2.0


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)


def test_page_escapes_client_chosen_group_and_member_names() -> None:
    evil = '<img src=x onerror="alert(1)">&'
    group = {"group_id": evil, "protocol": "classic", "protocol_type": evil,
             "assignor": evil, "state": "stable", "storm": True, "rebalances_recent": 3,
             "rebalances": 3, "generation": 2, "rebalancing_for_s": None,
             "members_count": 1, "members_more": 0,
             "members": [{"member_id": evil, "client_id": evil, "software": evil,
                          "generation": 2, "assigned_partitions": 1}],
             "last_rebalance": {"generation": 2, "at": 0.0, "seconds": 1.0, "reason": evil},
             "lag": 5, "worst_partitions": [{"topic": evil, "partition": 0, "lag": 5}]}
    h = History()
    for i in range(4):
        h.record(float(i * 5), [sample(i * 10)], [(evil, i, i)])
    snap = {"generated_at": 20.0, "proxy": {
        "host": "h", "version": "v", "ready": True, "ready_reason": "", "bootstrap": "b",
        "advertised_host": "a"}, "backend": {
        "cluster_id": "c", "topology_epoch": 0, "brokers": [], "last_change": None},
        "clients": {"connections": 0, "groups": [], "groups_more": 0},
        "telemetry": {"enabled": False}, "limits": [],
        "groups": {"tracked": 1, "listed": [group], "more": 0},
        "history": h.as_json([evil])}
    page = render(snap)
    assert evil not in page and "&lt;img src=x" in page
    parser = Tags()
    parser.feed(page)
    assert "img" not in parser.tags and "script" not in parser.tags
    assert parser.tags.count("svg") == 8  # six for the proxy, two for the group
    assert "rebalance storm" in page
