"""The supervisor's global connection count, without sockets: admit, release, give back."""

from __future__ import annotations

from kproxy.supervisor.admission_hub import (
    ADMIT,
    ADMITTED,
    ANSWER,
    HELLO,
    MAX_SOURCE_BYTES,
    OP_ADMIT,
    OP_HELLO,
    OP_RELEASE,
    REFUSED_MAX,
    REFUSED_SOURCE,
    AdmissionHub,
    Ledger,
    source_key,
)

A, B = source_key("127.0.0.1"), source_key("10.0.0.2")


def test_per_source_limit_holds_across_workers() -> None:
    hub = AdmissionHub(max_connections=1000, max_per_source=40)
    w0, w1 = Ledger(0, 100), Ledger(1, 101)
    verdicts = [hub.admit(w0 if i % 2 else w1, A) for i in range(120)]
    assert verdicts.count(ADMITTED) == 40
    assert verdicts.count(REFUSED_SOURCE) == 80
    assert w0.open + w1.open == hub.open == 40
    assert hub.admit(w0, B) == ADMITTED  # another source has its own count
    assert hub.refused["max_connections_per_source"] == 80


def test_global_limit_and_release() -> None:
    hub = AdmissionHub(max_connections=3, max_per_source=1000)
    w0, w1 = Ledger(0, 100), Ledger(1, 101)
    assert [hub.admit(w0, A), hub.admit(w1, A), hub.admit(w1, B)] == [ADMITTED] * 3
    assert hub.admit(w0, B) == REFUSED_MAX
    hub.release(w1, A)
    assert hub.open == 2 and hub.by_source == {A: 1, B: 1}
    hub.release(w1, A)  # w1 holds no more from A: ignored, nothing goes negative
    assert hub.open == 2 and w1.open == 1
    assert hub.admit(w0, B) == ADMITTED
    hub.release(w0, A)
    hub.release(w0, B)
    hub.release(w1, B)
    assert hub.open == 0 and hub.by_source == {}  # the table shrinks with the connections


def test_a_dead_worker_gives_back_everything_it_held() -> None:
    hub = AdmissionHub(max_connections=10, max_per_source=5)
    w0, w1 = Ledger(0, 100), Ledger(1, 101)
    hub.ledgers = {0: w0, 1: w1}
    for _ in range(3):
        hub.admit(w0, A)
    hub.admit(w0, B)
    hub.admit(w1, A)
    assert hub.give_back(w0) == 4
    assert hub.open == 1 and hub.by_source == {A: 1}
    assert 0 not in hub.ledgers and hub.history[0].given_back == 4
    rows = hub.worker_rows([(0, 200, 1, True), (1, 101, 0, True)])
    assert rows[0]["restarts"] == 1 and rows[0]["connections"] == 0
    assert rows[0]["given_back_at_last_exit"] == 4 and rows[1]["connections"] == 1
    # The freed room is admitted again.
    w0b = hub.ledgers[0] = Ledger(0, 200)
    assert [hub.admit(w0b, A) for _ in range(4)] == [ADMITTED] * 4
    assert hub.by_source[A] == 5 and hub.admit(w0b, A) == REFUSED_SOURCE


def test_messages_carry_requests_limits_and_hello() -> None:
    hub = AdmissionHub(max_connections=10, max_per_source=10)
    w0 = hub.ledgers[0] = Ledger(0, 100)
    assert hub.handle(w0, HELLO.pack(OP_HELLO, 100, 7)) is None
    assert w0.fd_connections == 7 and hub.effective_max() == 7
    # The limits travel with each request: a reloaded worker's apply at once.
    answer = hub.handle(w0, ADMIT.pack(OP_ADMIT, 42, 5, 1) + A)
    assert answer == ANSWER.pack(42, ADMITTED)
    assert hub.max_connections == 5 and hub.effective_max() == 5
    assert hub.handle(w0, ADMIT.pack(OP_ADMIT, 43, 5, 1) + A) == ANSWER.pack(43, REFUSED_SOURCE)
    assert hub.handle(w0, bytes([OP_RELEASE]) + A) is None
    assert hub.open == 0
    assert hub.handle(w0, b"") is None and hub.handle(w0, b"\x09junk") is None
    rows = {r["limit"]: r for r in hub.limit_rows()}
    assert rows["max_connections"]["value"] == 5
    assert rows["max_connections_per_source"]["hits"] == 1
    families = {f.name: f for f in hub.families()}
    assert families["kproxy_max_connections_effective"].samples[0].value == 5


def test_source_addresses_are_bounded() -> None:
    hub = AdmissionHub(max_connections=10, max_per_source=10)
    w0 = Ledger(0, 100)
    long = "f" * 1000
    assert len(source_key(long)) == MAX_SOURCE_BYTES
    hub.handle(w0, ADMIT.pack(OP_ADMIT, 1, 10, 10) + long.encode())
    assert all(len(k) <= MAX_SOURCE_BYTES for k in hub.by_source)
