"""The supervisor's status snapshot: every worker's merged, no sockets."""

from __future__ import annotations

import copy
from typing import Any

from kproxy.http.status import MAX_CLIENTS, MAX_GROUPS
from kproxy.http.status_merge import WorkerInfo, merge
from kproxy.http.status_page import render


def client(cid: str, src: str, conns: int, v13: int, below: int, out: int,
           p99: float | None) -> dict[str, Any]:
    known = v13 + below
    return {"client_id": cid, "source_address": src, "connections": conns,
            "metadata_v13": "unknown" if not known else "yes" if not below else "mixed",
            "v13_connections": v13, "below_v13_connections": below,
            "telemetry": False, "telemetry_connections": 0, "last_push": None,
            "bytes_in": 10, "bytes_out": out, "p99_ms": p99}


def group(name: str, clients: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"software_name": name, "software_version": "1.0",
                         "client_ids": sorted({c["client_id"] for c in clients}),
                         "client_ids_more": 0,
                         "source_addresses": sorted({c["source_address"] for c in clients}),
                         "source_addresses_more": 0, "clients": clients, "clients_more": 0}
    for key in ("connections", "v13_connections", "below_v13_connections",
                "telemetry_connections", "bytes_in", "bytes_out"):
        g[key] = sum(c[key] for c in clients)
    g.update(telemetry=False, last_push=None, metadata_v13="yes",
             p99_ms=max((c["p99_ms"] for c in clients if c["p99_ms"] is not None),
                        default=None))
    g.update(over)
    return g


def worker_snapshot(epoch: int, at: float, groups: list[dict[str, Any]],
                    generation: int = 0, open_: int = 0) -> dict[str, Any]:
    return {
        "generated_at": at,
        "proxy": {"host": "h", "version": "1", "ready": True, "ready_reason": "ok",
                  "bootstrap": "127.0.0.1:9092", "advertised_host": "127.0.0.1",
                  "config_generation": generation},
        "backend": {"cluster_id": "c", "topology_epoch": epoch, "brokers": [],
                    "last_change": None, "last_discovery_age_s": 1.0, "upstream": []},
        "clients": {"connections": sum(g["connections"] for g in groups), "groups": groups,
                    "groups_more": 0},
        "telemetry": {"enabled": True, "prometheus": True, "client_instances": 2,
                      "client_instances_evicted": 3, "series": 10,
                      "otlp": {"endpoint": "http://c/v1/metrics",
                               "outcomes": {"exported": 3, "failed": 1},
                               "queued_bytes": 5, "queued_pushes": 1, "retrying": False}},
        "limits": [{"limit": "max_connections", "value": 100, "in_use": open_, "hits": 1,
                    "hit_now": False},
                   {"limit": "max_connections_per_source", "value": 50, "in_use": open_,
                    "hits": 0, "hit_now": False},
                   {"limit": "idle_timeout", "value": 600.0, "in_use": None, "hits": 0,
                    "hit_now": False}],
    }


INFOS = [WorkerInfo(0, 8001, 101, True, 0), WorkerInfo(1, 8002, 102, True, 2)]


def test_clients_summed_by_group_and_client_backend_from_the_newest_worker() -> None:
    a = worker_snapshot(3, 10.0, [group("rdkafka", [
        client("p", "10.0.0.1", 2, 2, 0, 100, 1.0), client("q", "10.0.0.2", 1, 0, 1, 5, None)])],
        generation=1, open_=3)
    b = worker_snapshot(4, 9.0, [group("rdkafka", [client("p", "10.0.0.1", 1, 1, 0, 900, 7.0)]),
                                 group("java", [client("j", "10.0.0.3", 1, 0, 0, 1, None)])],
                        generation=1, open_=2)
    snap = merge([a, b], INFOS, now=20.0)
    assert snap["backend"]["topology_epoch"] == 4  # the newest view of the one backend
    clients = snap["clients"]
    assert clients["connections"] == 5
    assert [g["software_name"] for g in clients["groups"]] == ["rdkafka", "java"]
    rd = clients["groups"][0]
    assert rd["connections"] == 4 and rd["bytes_out"] == 1005
    assert rd["metadata_v13"] == "mixed" and rd["p99_ms"] == 7.0
    p = rd["clients"][0]  # the same client on both workers: one row, summed
    assert (p["client_id"], p["connections"], p["bytes_out"]) == ("p", 3, 1000)
    assert p["metadata_v13"] == "yes" and len(rd["clients"]) == 2
    # Telemetry and the export's outcomes: summed.
    assert snap["telemetry"]["client_instances"] == 4
    assert snap["telemetry"]["client_instances_evicted"] == 6
    assert snap["telemetry"]["otlp"]["outcomes"] == {"exported": 6, "failed": 2}
    limits = {row["limit"]: row for row in snap["limits"]}
    # Each worker applies max_connections to its share: the proxy's is the sum.
    assert (limits["max_connections"]["value"], limits["max_connections"]["in_use"]) == (
        200, 5)
    assert limits["max_connections"]["hits"] == 2
    assert limits["max_connections_per_source"]["in_use"] == 3  # the busiest worker's
    assert limits["idle_timeout"]["value"] == 600.0
    rows = snap["workers"]
    assert [(w["pid"], w["connections"], w["restarts"], w["config_generation"])
            for w in rows] == [(101, 3, 0, 1), (102, 2, 2, 1)]
    assert snap["proxy"]["ready"] and snap["proxy"]["config_generation"] == 1
    html = render(snap)
    assert "<h2>Workers</h2>" in html and "102" in html


def test_a_silent_worker_is_listed_and_the_rest_still_shown() -> None:
    a = worker_snapshot(1, 1.0, [group("x", [client("c", "s", 1, 1, 0, 1, None)])])
    infos = [WorkerInfo(0, 8001, 101, True, 0), WorkerInfo(1, 8002, None, False, 1)]
    snap = merge([a, None], infos, now=2.0)
    assert snap["clients"]["connections"] == 1
    assert snap["workers"][1] == {"index": 1, "pid": None, "http_port": 8002,
                                  "alive": False, "restarts": 1, "answered": False,
                                  "ready": False, "connections": None,
                                  "config_generation": None}
    assert snap["proxy"]["ready_reason"] == "1/2 workers ready"
    assert "not running" in render(snap)
    nothing = merge([None, None], infos, now=2.0)
    assert not nothing["proxy"]["ready"] and nothing["clients"]["groups"] == []
    render(nothing)


def test_merged_lists_stay_bounded_and_count_what_they_leave_out() -> None:
    def many(worker: int) -> dict[str, Any]:
        groups = [group(f"sw{worker}-{i}", [client(f"c{j}", f"10.{worker}.0.{j}", 1, 1, 0, j,
                                                   None) for j in range(MAX_CLIENTS)])
                  for i in range(MAX_GROUPS)]
        snap = worker_snapshot(1, 1.0, groups)
        snap["clients"]["groups_more"] = 3
        return snap

    snap = merge([many(0), many(1)], INFOS, now=2.0)
    clients = snap["clients"]
    assert len(clients["groups"]) == MAX_GROUPS
    assert clients["groups_more"] == MAX_GROUPS + 6
    assert all(len(g["clients"]) <= MAX_CLIENTS for g in clients["groups"])


def test_limits_from_the_supervisor_replace_the_derived_ones() -> None:
    a = worker_snapshot(1, 1.0, [])
    rows = [{"limit": "max_connections", "value": 100, "in_use": 7, "hits": 0,
             "hit_now": False}]
    derived = merge([a, copy.deepcopy(a)], INFOS, now=2.0)["limits"]
    snap = merge([a, copy.deepcopy(a)], INFOS, now=2.0, limits=rows)
    # The supervisor's row stands where the derived max_connections row stood; every
    # other limit is still derived from the workers.
    assert [r["limit"] for r in snap["limits"]] == [r["limit"] for r in derived]
    by_name = {r["limit"]: r for r in snap["limits"]}
    assert by_name["max_connections"] == rows[0]
    assert [r for r in snap["limits"] if r["limit"] != "max_connections"] == [
        r for r in derived if r["limit"] != "max_connections"]
