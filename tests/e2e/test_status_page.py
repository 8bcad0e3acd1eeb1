"""The status page renderer (pure: dict -> HTML), and the snapshot of a live in-process
proxy in front of a real broker: bounded whatever the number of clients."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker, wait_for_port
from kproxy.http.status import MAX_GROUPS, MAX_TEXT, snapshot
from kproxy.http.status_page import render
from kproxy.runtime.server import Proxy

from ..support import RawClient, broker_port_base, free_port, http_get, make_config, stop_process

EVIL = '<script>alert("x")</script>&'


def client(cid: str, v13: str = "yes", telemetry: bool = True) -> dict[str, Any]:
    return {"client_id": cid, "source_address": "127.0.0.1", "connections": 2,
            "metadata_v13": v13, "v13_connections": 2, "below_v13_connections": 0,
            "telemetry": telemetry, "telemetry_connections": 1, "last_push": 995.0,
            "bytes_in": 2048, "bytes_out": 5 * 1024 * 1024, "p99_ms": 1.25}


def sample(**over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "generated_at": 1000.0,
        "proxy": {"host": "kp-1", "version": "0.1.0", "ready": True,
                  "ready_reason": "1 broker(s) known", "bootstrap": "127.0.0.1:9092",
                  "advertised_host": "127.0.0.1"},
        "backend": {"cluster_id": "c-1", "topology_epoch": 3, "upstream": ["127.0.0.1:19092"],
                    "brokers": [{"node_id": 111, "host": "127.0.0.1", "port": 19092,
                                 "advertised": "127.0.0.1:9093"}],
                    "last_change": {"at": 940.0, "reason": "operator", "what": "operator"},
                    "last_discovery_age_s": 1.5},
        "clients": {"connections": 3, "groups_more": 4, "groups": [{
            "software_name": EVIL, "software_version": "2.16.0", **client("g"),
            "client_ids": [EVIL, "rdkafka"], "client_ids_more": 7,
            "source_addresses": ["127.0.0.1"], "source_addresses_more": 0,
            "clients": [client(EVIL), client("old", v13="no", telemetry=False)],
            "clients_more": 2}]},
        "telemetry": {"enabled": True, "prometheus": True, "client_instances": 1, "series": 9,
                      "otlp": {"endpoint": "http://c:4318/v1/metrics",
                               "outcomes": {"exported": 5, "dropped_queue_full": 1},
                               "queued_bytes": 0, "queued_pushes": 0, "retrying": False}},
        "limits": [{"limit": "max_connections", "value": 10, "in_use": 10, "hits": 4,
                    "hit_now": True},
                   {"limit": "idle_timeout", "value": 600.0, "in_use": None, "hits": 0,
                    "hit_now": False}],
    }
    snap.update(over)
    return snap


class Text(HTMLParser):
    """The visible text and the tag names of a document."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


def parse(doc: str) -> Text:
    t = Text()
    t.feed(doc)
    return t


def test_page_shows_backend_clients_limits_and_export() -> None:
    page = parse(render(sample()))
    text = " ".join(" ".join(page.text).split())
    for expected in ("kproxy on kp-1", "cluster id c-1", "topology epoch 3",
                     "last change: 60 s ago: operator", "127.0.0.1:19092", "127.0.0.1:9093",
                     "Metadata v13 \u2013 can be told to rebootstrap",
                     "Metadata below v13 \u2013 cannot be told to rebootstrap",
                     "and 7 more", "and 2 more client(s)", "and 4 more group(s)",
                     "last push 5 s ago", "5.0 MiB", "2.0 KiB", "1.25 ms", "at limit",
                     "exported 5", "dropped_queue_full 1", "http://c:4318/v1/metrics",
                     "Prometheus export on"):
        assert expected in text, expected
    assert "<script" not in " ".join(page.tags)
    assert EVIL in text  # shown as text, never as markup


def test_everything_from_clients_is_escaped_and_there_is_no_script_or_asset() -> None:
    doc = render(sample())
    assert "<script>" not in doc and "&lt;script&gt;" in doc
    page = parse(doc)
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    hrefs = [v for k, v in page.attrs if k in ("href", "src")]
    assert hrefs == ["/status.json", "/metrics"]  # same-origin links only, no asset


def test_empty_and_off_states() -> None:
    snap = sample(clients={"connections": 0, "groups": [], "groups_more": 0},
                  telemetry={"enabled": False, "prometheus": False})
    snap["backend"].update(last_change=None, last_discovery_age_s=None, cluster_id=None)
    text = " ".join(parse(render(snap)).text)
    assert "No client connected." in text and "none since start" in text
    assert "off: KIP-714 requests go to the broker" in text and "never answered" in text


async def test_live_snapshot_is_bounded_and_says_what_clients_said(
        shared_tansu: TansuBroker) -> None:
    cfg = make_config(shared_tansu.bootstrap, admin="on")
    proxy = Proxy(cfg)
    groups = MAX_GROUPS + 5
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                          task_status=task_status))
        assert proxy.bootstrap_port is not None and proxy.http_port is not None
        clients = []
        try:
            for i in range(groups):
                c = await RawClient.connect(proxy.bootstrap_port)
                clients.append(c)
                name = f"sw-{i:02d}-" + "n" * 300 if i == 0 else f"sw-{i:02d}"
                resp = await c.request(api_keys.API_VERSIONS, 3, 1, {
                    "client_software_name": name, "client_software_version": "1.0"})
                assert resp.body["error_code"] == 0
            # one more connection for the first group, to rank it first
            c = await RawClient.connect(proxy.bootstrap_port)
            clients.append(c)
            await c.request(api_keys.API_VERSIONS, 3, 1, {
                "client_software_name": "sw-01", "client_software_version": "1.0"})
            status, _, _ = await http_get(proxy.http_port, "/", raw=(
                b"POST /admin/rebootstrap HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"))
            assert status == 200
            snap = snapshot(proxy)
            status, headers, body = await http_get(proxy.http_port, "/status.json")
            assert status == 200 and headers["content-type"] == "application/json"
            served = json.loads(body)
            status, headers, page = await http_get(proxy.http_port, "/")
            assert status == 200 and headers["content-type"].startswith("text/html")
        finally:
            for c in clients:
                await c.aclose()
            proxy.shutdown()
    c = snap["clients"]
    assert c["connections"] == groups + 1
    assert len(c["groups"]) == MAX_GROUPS and c["groups_more"] == groups - MAX_GROUPS
    assert (c["groups"][0]["software_name"], c["groups"][0]["connections"]) == ("sw-01", 2)
    assert all(len(g["software_name"]) <= MAX_TEXT for g in c["groups"])
    assert c["groups"][0]["metadata_v13"] == "unknown"  # no Metadata request was sent
    assert c["groups"][0]["client_ids"] == ["kproxy-test"]
    assert snap["backend"]["brokers"][0]["node_id"] == 111
    change = snap["backend"]["last_change"]
    assert change["reason"] == "operator" and snap["backend"]["topology_epoch"] == 1
    # One process lists itself as the one worker, as the supervisor lists each.
    (me,) = snap["workers"]
    assert (me["pid"], me["connections"], me["config_generation"]) == (
        os.getpid(), groups + 1, 0)
    assert served["clients"]["connections"] == groups + 1
    assert served["backend"]["cluster_id"] == snap["backend"]["cluster_id"]
    assert re.search(rb"sw-01</h3>|sw-01 1\.0", page)


@pytest.mark.broker
def test_make_run_prints_the_status_page_url(tmp_path: Path) -> None:
    """`kproxy demo` (what `make run` starts) says where the page is, and it is there."""
    broker, listen, http = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy.cli", "demo", "--broker-port", str(broker),
         "--listen", f"127.0.0.1:{listen}", "--broker-port-base", str(broker_port_base()),
         "--node-id-range", "111-111", "--http", f"127.0.0.1:{http}",
         "--archive", str(tmp_path / "archive")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "kproxy demo exited early"
            m = re.search(r"status page\s+: (http://\S+)", line)
            url = m.group(1) if m else None
        assert url == f"http://127.0.0.1:{http}/"
        assert wait_for_port("127.0.0.1", http, 60)
        page = b""
        for _ in range(100):  # the page answers once the backend is discovered
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = resp.read()
            if b"111" in page:
                break
            time.sleep(0.3)
        assert b"kproxy on" in page and b"111" in page
    finally:
        stop_process(proc)  # type: ignore[arg-type]
