"""The silence rules of a client connection, as pure functions of the clock."""

import math

from kproxy.policies import timeouts


def test_a_new_connection_waits_until_its_first_request_deadline() -> None:
    assert timeouts.read_deadline(5.0, 10.0, 0, 0, 0.0, 60.0) == 10.0
    assert timeouts.expired(10.0, 0, 0, 0.0, 60.0) == "first_request_timeout"
    assert timeouts.reason("first_request_timeout", 10, 60) == (
        "no complete request within 10s of connecting")


def test_an_idle_connection_expires_after_the_idle_timeout_from_its_last_frame() -> None:
    assert timeouts.read_deadline(5.0, 10.0, 3, 0, 4.0, 60.0) == 64.0
    assert timeouts.expired(63.9, 3, 0, 4.0, 60.0) is None
    assert timeouts.expired(64.0, 3, 0, 4.0, 60.0) == "idle_timeout"
    assert timeouts.reason("idle_timeout", 10, 60) == "idle for 60s"


def test_a_connection_waiting_for_an_answer_is_never_idle() -> None:
    assert timeouts.read_deadline(100.0, 10.0, 3, 1, 4.0, 60.0) == 160.0
    assert timeouts.expired(1000.0, 3, 1, 4.0, 60.0) is None


def test_no_idle_timeout_means_no_deadline_after_the_first_request() -> None:
    assert timeouts.read_deadline(5.0, 10.0, 1, 0, 4.0, 0.0) == math.inf
    assert timeouts.expired(1e9, 1, 0, 4.0, 0.0) is None


def test_busy_wait_of_a_parking_session_has_no_deadline() -> None:
    # The parking lot's sweep wakes it once idle; the next wait has the idle deadline.
    assert timeouts.read_deadline(100.0, 10.0, 3, 1, 4.0, 60.0, parks=True) == math.inf
    assert timeouts.read_deadline(100.0, 10.0, 3, 0, 4.0, 60.0, parks=True) == 64.0
    assert timeouts.read_deadline(5.0, 10.0, 0, 0, 0.0, 60.0, parks=True) == 10.0
