"""`kproxy run` as users run it (default worker count) puts each worker's start-up heap
on huge pages, says so in its log, and serves clients; ``--huge-pages off`` does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import kernel_collapses, kproxy_process, rss_kib, wait_until

SAID = "start-up heap on huge pages"


def broker_count(bootstrap: str) -> int:
    """Brokers in a Metadata answer through ``bootstrap`` (confluent-kafka)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.list_topics(timeout=30).brokers)


@pytest.mark.broker
def test_each_worker_collapses_its_start_up_heap(shared_tansu: TansuBroker,
                                                 tmp_path: Path) -> None:
    with kproxy_process(shared_tansu.bootstrap, tmp_path) as kp:
        workers = kp.worker_pids()
        if kernel_collapses():
            wait_until(lambda: kp.log().count(SAID) >= len(workers),
                       what="every worker's huge-page line")
            lines = [ln for ln in kp.log().splitlines() if SAID in ln]
            assert all("collapsed_mb=" in ln for ln in lines), lines
            assert all(rss_kib(pid, "AnonHugePages", "smaps_rollup") >= 2048
                       for pid in workers), workers
        else:  # an older kernel: each worker says it was refused, and runs as before
            wait_until(lambda: kp.log().count("left on ordinary pages") >= len(workers),
                       what="every worker's refusal line")
        assert broker_count(kp.bootstrap) >= 1  # and it serves


@pytest.mark.broker
def test_off_leaves_the_heap_on_ordinary_pages(shared_tansu: TansuBroker,
                                               tmp_path: Path) -> None:
    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--huge-pages", "off") as kp:
        assert broker_count(kp.bootstrap) >= 1
        log = kp.log()
        assert SAID not in log and "left on ordinary pages" not in log
