"""The status page's consumer groups and history, at the default two workers, as a real
browser lays them out: a real tansu broker, real confluent-kafka consumers in a group
(their members split over both workers), `kproxy run`; headless Chromium (Debian's,
`make test-tools`) driven over its DevTools pipe (tests/chromium_cdp.py) at 1,280 and
400 CSS pixels wide.

What the browser must see: the group with both members (their client ids), its
protocol, generation and last rebalance; charts drawn with a real size; at 400 px
nothing wider than the window (tables scroll inside their own box). Screenshots of
both widths are kept in /tmp for people.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.embedded_broker import TansuBroker

from ..chromium_cdp import Chromium
from ..support import KproxyProcess, kproxy_process

pytestmark = pytest.mark.broker
SHOTS = Path("/tmp")
LAYOUT = """JSON.stringify({
  width: innerWidth, scroll: document.documentElement.scrollWidth,
  charts: [...document.querySelectorAll('figure.chart svg')].map(s => {
    const r = s.getBoundingClientRect(); return [r.width, r.height,
      s.querySelectorAll('polyline, rect:not(.frame)').length]; }),
  groups: [...document.querySelectorAll('.group h3')].map(h => h.textContent),
  text: document.body.innerText,
  scripts: document.scripts.length,
})"""


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


def status(kp: KproxyProcess) -> dict[str, Any]:
    code, body = kp.http_get("/status.json")
    assert code == 200
    return dict(json.loads(body))


def wait_for(what: str, check: Callable[[], bool], step: Callable[[], None],
             timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        step()


def test_groups_and_history_in_chromium_at_two_workers(backend: TansuBroker,
                                                       tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"sg-{uuid.uuid4().hex[:6]}", f"status-grp-{uuid.uuid4().hex[:6]}"
    with kproxy_process(backend.bootstrap, tmp_path) as kp:  # the default: 2 workers
        admin = AdminClient({"bootstrap.servers": kp.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=4)])[topic].result(20)
        producer = Producer({"bootstrap.servers": kp.bootstrap, "client.id": "sg-producer"})
        for i in range(40):
            producer.produce(topic, f"m{i}".encode(), partition=i % 4)
        assert producer.flush(30) == 0
        consumers = [Consumer({
            "bootstrap.servers": kp.bootstrap, "group.id": group, "client.id": f"sg-c{n}",
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "auto.commit.interval.ms": 500})
            for n in range(2)]
        try:
            for c in consumers:
                c.subscribe([topic])

            def poll() -> None:
                for c in consumers:
                    c.poll(0.2)

            def listed() -> dict[str, Any] | None:
                snap = status(kp)
                found = [g for g in snap["groups"]["listed"] if g["group_id"] == group]
                return found[0] if found else None

            def settled() -> bool:
                g = listed()
                return (g is not None and g["members_count"] == 2 and g["state"] == "stable"
                        and {m["client_id"] for m in g["members"]} == {"sg-c0", "sg-c1"}
                        and g["last_rebalance"] is not None and g["lag"] is not None)

            wait_for("the group, both members, a commit and a watermark", settled, poll)
            # Two history steps with traffic in between: rates are drawn from deltas.
            wait_for("history points", lambda: len(status(kp)["history"]["series"]["t"]) >= 3
                     and any(status(kp)["history"]["series"]["requests_per_s"]), poll)
            snap = status(kp)
            url = f"http://127.0.0.1:{kp.http_port}/"
            seen = {}
            with Chromium(tmp_path / "chromium") as browser:
                for width in (1280, 400):
                    browser.open(url, width)
                    seen[width] = json.loads(browser.evaluate(LAYOUT))
                    shot = tmp_path / f"status-{width}.png"
                    browser.screenshot(shot)
                    assert shot.stat().st_size > 10_000
                    shutil.copyfile(shot, SHOTS / f"kproxy-status-{width}.png")
        finally:
            for c in consumers:
                c.close()

    # status.json: the whole proxy's group, whichever worker each member used.
    g = next(x for x in snap["groups"]["listed"] if x["group_id"] == group)
    assert g["protocol"] == "classic" and g["protocol_type"] == "consumer"
    assert g["generation"] >= 0 and g["rebalances"] >= 1, g
    assert g["last_rebalance"]["seconds"] >= 0 and g["last_rebalance"]["reason"]
    assert all(m["software"].startswith("confluent-kafka-python") for m in g["members"])
    assert snap["groups"]["more"] == 0 and len(snap["workers"]) == 2
    series = snap["history"]["series"]
    assert max(series["connections"]) >= 3 and max(series["bytes_in_per_s"]) > 0
    assert any(p is not None for p in series["p99_ms"])
    assert group in snap["history"]["groups"]

    for width, page in seen.items():
        assert page["scripts"] == 0
        # No horizontal overflow: the document is no wider than the window.
        assert page["scroll"] <= page["width"] == width, (width, page["scroll"])
        # Six proxy charts and the group's two, each drawn with a real size.
        assert len(page["charts"]) >= 8, page["charts"]
        assert all(w > 50 and h > 20 for w, h, _ in page["charts"]), page["charts"]
        assert sum(1 for *_, shapes in page["charts"] if shapes) >= 3
        assert any(group in h and "classic" in h for h in page["groups"]), page["groups"]
        assert "sg-c0" in page["text"] and "sg-c1" in page["text"]
        assert "last rebalance:" in page["text"] and "Last 15 minutes" in page["text"]
    # At 400 px the charts stack: narrower than at 1,280, still wider than half the window.
    assert all(w > 150 for w, _, _ in seen[400]["charts"])
