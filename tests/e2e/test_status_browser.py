"""The status page as a person sees it: real headless Chromium (Debian's `chromium`, which
`make test-tools` installs) loads `/` of a real `kproxy run` while confluent-kafka,
kafka-python and aiokafka clients are connected through it to a real tansu broker.
`/status.json` is checked against the same clients."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, kproxy_process

pytestmark = pytest.mark.broker
SCREENSHOT_FOR_LEAD = Path("/tmp/kproxy-status.png")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


class AioProducer:
    """An aiokafka producer kept connected on its own event loop thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from aiokafka import AIOKafkaProducer

        try:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)  # default client id
            await producer.start()
            try:
                await producer.send_and_wait(self.topic, b"aio")
                self.ready.set()
                while not self.stop.is_set():
                    await asyncio.sleep(0.1)
            finally:
                await producer.stop()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.ready.set()

    def __enter__(self) -> AioProducer:
        self.thread.start()
        assert self.ready.wait(60) and self.error is None, self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def status(kp: KproxyProcess) -> dict[str, Any]:
    code, body = kp.http_get("/status.json")
    assert code == 200
    result: dict[str, Any] = json.loads(body)
    return result


def groups(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["software_name"]: g for g in snap["clients"]["groups"]}


def wait_for(predicate: Callable[[], object], timeout: float,
             step: Callable[[], object] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (step or (lambda: time.sleep(0.3)))()
        if predicate():
            return True
    return False


class Headings(HTMLParser):
    """The text of each <h3> (one per software group) and all visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.h3: list[str] = []
        self.text: list[str] = []
        self._in_h3 = False
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h3":
            self._in_h3 = True
            self.h3.append("")
        self._hidden += tag in ("style", "title", "script")

    def handle_endtag(self, tag: str) -> None:
        self._in_h3 = self._in_h3 and tag != "h3"
        self._hidden -= tag in ("style", "title", "script")

    def handle_data(self, data: str) -> None:
        if self._in_h3:
            self.h3[-1] += data
        if not self._hidden:
            self.text.append(data)


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: `make test-tools` installs it (Debian package)"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={cwd / 'chromium-profile'}", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=180, cwd=cwd, check=False)


def test_status_page_in_chromium_with_three_kinds_of_clients(backend: TansuBroker,
                                                             tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    cfg = tmp_path / "kproxy.toml"
    cfg.write_text('[[telemetry.subscriptions]]\nname = "all"\nmetrics = ["*"]\n'
                   "interval_ms = 1000\n")
    topic = f"status-{uuid.uuid4().hex[:6]}"
    # One worker: a client's Metadata version is known to the worker that relayed its
    # Metadata (often on a bootstrap connection it closed since), and this page test
    # checks that each kind of client is shown with it; across workers a client's broker
    # connection may sit on the other one and show "unknown" (README: per worker).
    with kproxy_process(backend.bootstrap, tmp_path, "--workers", "1",
                        "--config", str(cfg)) as kp:
        ck = Producer({"bootstrap.servers": kp.bootstrap, "client.id": "ck-status"})
        ck.produce(topic, b"ck")
        assert ck.flush(30) == 0
        kp_producer = KafkaProducer(bootstrap_servers=kp.bootstrap, client_id="kp-status")
        try:
            kp_producer.send(topic, b"kp").get(30)
            with AioProducer(kp.bootstrap, topic):
                def settled() -> bool:
                    g = groups(status(kp))
                    return ({"confluent-kafka-python", "kafka-python", ""} <= set(g)
                            and g["confluent-kafka-python"]["last_push"] is not None
                            and all(x["metadata_v13"] != "unknown" for x in g.values()))

                assert wait_for(settled, 60, lambda: ck.poll(0.5)), status(kp)
                url = f"http://127.0.0.1:{kp.http_port}/"
                dom = chromium("--dump-dom", url, cwd=tmp_path)
                shot = tmp_path / "kproxy-status.png"
                taken = chromium(f"--screenshot={shot}", "--window-size=1400,1500", url,
                                 cwd=tmp_path)
                snap = status(kp)
        finally:
            kp_producer.close(10)
            ck.flush(10)

    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Headings()
    page.feed(dom.stdout)
    text = " ".join(" ".join(page.text).split())
    heads = {h.split(" \u00b7 ")[0].strip(): " ".join(h.split()) for h in page.h3}
    # Each client's software and its Metadata v13 capability, as the page renders them.
    assert "Metadata v13 \u2013 can be told to rebootstrap" in heads[
        "confluent-kafka-python 2.16.1-rdkafka-2.16.0"], heads
    kafka_python = [h for k, h in heads.items() if k.startswith("kafka-python ")]
    assert kafka_python and "Metadata v13" in kafka_python[0]
    # aiokafka's ApiVersions request (v0-v2) carries no software name: the page says so,
    # and its default client id (aiokafka-producer-N) names it.
    unnamed = heads["software not named (ApiVersions request below v3)"]
    assert "Metadata below v13 \u2013 cannot be told to rebootstrap" in unnamed
    assert "aiokafka-" in text and "ck-status" in text and "kp-status" in text
    # The backend broker, as the proxy reaches it and as it advertises it.
    assert f"{backend.bootstrap}" in text and "111" in text
    assert re.search(r"telemetry: on ?, last push \d+ s ago", text), text
    # A screenshot for people, here and for the lead's note.
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-2000:]
    shutil.copyfile(shot, SCREENSHOT_FOR_LEAD)

    # /status.json agrees, client by client.
    g = groups(snap)
    ck_group, kp_group, aio_group = g["confluent-kafka-python"], g["kafka-python"], g[""]
    assert ck_group["metadata_v13"] == "yes" and ck_group["telemetry"] is True
    assert "ck-status" in ck_group["client_ids"] and ck_group["last_push"] is not None
    assert kp_group["metadata_v13"] == "yes" and kp_group["client_ids"] == ["kp-status"]
    assert kp_group["telemetry"] is False
    assert aio_group["metadata_v13"] == "no" and aio_group["telemetry"] is False
    assert [c for c in aio_group["client_ids"] if c.startswith("aiokafka-")]
    for group in (ck_group, kp_group, aio_group):
        assert group["source_addresses"] == ["127.0.0.1"]
        assert group["bytes_in"] > 0 and group["bytes_out"] > 0
        assert group["p99_ms"] is not None and group["p99_ms"] > 0
    brokers = snap["backend"]["brokers"]
    assert [(b["node_id"], f"{b['host']}:{b['port']}") for b in brokers] == [
        (111, backend.bootstrap)]
    assert brokers[0]["advertised"] == f"127.0.0.1:{kp.broker_port_base}"
    assert snap["backend"]["cluster_id"] and snap["proxy"]["ready"] is True
