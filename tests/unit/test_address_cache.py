"""Kept answers for upstream names (kproxy.runtime.upstream.AddressCache).

The resolver here is a stand-in that answers as told and counts the questions (DNS
cannot be changed or slowed here); the connections made with real answers are
tests/e2e/test_upstream_connect.py's. Time is trio's mock clock.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kproxy.runtime.upstream import Address, AddressCache

ONE: list[Address] = [(2, ("10.0.0.1", 9092))]
TWO: list[Address] = [(2, ("10.0.0.2", 9092))]


class StandInDns:
    def __init__(self, *answers: list[Address] | OSError, delay: float = 0.0) -> None:
        self.answers = list(answers)
        self.delay = delay
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[Address]:
        self.asked.append(host)
        await trio.sleep(self.delay)
        answer = self.answers[min(len(self.asked), len(self.answers)) - 1]
        if isinstance(answer, OSError):
            raise answer
        return answer


async def test_an_answer_is_kept_for_its_time_then_asked_again(
        autojump_clock: trio.testing.MockClock) -> None:
    dns = StandInDns(ONE, TWO)
    names = AddressCache(30, resolve=dns)
    assert await names.lookup("kafka", 9092) == (ONE, True)
    await trio.sleep(29)
    assert await names.lookup("kafka", 9092) == (ONE, False)
    await trio.sleep(2)
    assert await names.lookup("kafka", 9092) == (TWO, True)
    assert len(dns.asked) == 2


async def test_a_time_of_zero_keeps_nothing() -> None:
    dns = StandInDns(ONE)
    names = AddressCache(0, resolve=dns)
    for _ in range(3):
        assert await names.lookup("kafka", 9092) == (ONE, True)
    assert len(dns.asked) == 3 and len(names) == 0


async def test_connections_at_once_share_one_resolution_and_its_failure(
        autojump_clock: trio.testing.MockClock) -> None:
    dns = StandInDns(OSError("no such host"), ONE, delay=1.0)
    names = AddressCache(30, resolve=dns)
    failures: list[str] = []

    async def ask() -> None:
        try:
            await names.lookup("kafka", 9092)
        except OSError as exc:
            failures.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(ask)
    assert failures == ["no such host"] * 10 and len(dns.asked) == 1
    found = []

    async def found_one() -> None:
        found.append(await names.lookup("kafka", 9092))

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(found_one)
    assert sorted(fresh for _, fresh in found) == [True] * 10 and len(dns.asked) == 2


async def test_a_cancelled_resolution_leaves_a_waiting_asker_to_resolve(
        autojump_clock: trio.testing.MockClock) -> None:
    dns = StandInDns(ONE, delay=1.0)
    names = AddressCache(30, resolve=dns)
    first = trio.CancelScope()
    found: list[tuple[list[Address], bool]] = []

    async def gone_meanwhile() -> None:
        with first:
            await names.lookup("kafka", 9092)

    async def waiting() -> None:
        found.append(await names.lookup("kafka", 9092))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gone_meanwhile)
        await trio.sleep(0.1)
        nursery.start_soon(waiting)
        await trio.sleep(0.1)
        first.cancel()  # the first asker's client went away while its answer was due
    assert found == [(ONE, True)] and len(dns.asked) == 2


async def test_an_empty_answer_is_an_error() -> None:
    names = AddressCache(30, resolve=StandInDns([]))
    with pytest.raises(OSError, match="resolved to no address"):
        await names.lookup("kafka", 9092)
    assert len(names) == 0


async def test_names_are_bounded_least_recently_used_first() -> None:
    dns = StandInDns(ONE)
    names = AddressCache(30, resolve=dns, max_names=3)
    for host in ("a", "b", "c"):
        await names.lookup(host, 9092)
    await names.lookup("a", 9092)  # used: "b" is now the oldest
    await names.lookup("d", 9092)
    assert len(names) == 3
    assert (await names.lookup("a", 9092))[1] is False
    assert (await names.lookup("b", 9092))[1] is True


async def test_forget_and_a_changed_time_drop_what_was_kept() -> None:
    dns = StandInDns(ONE)
    names = AddressCache(30, resolve=dns)
    await names.lookup("kafka", 9092)
    names.forget("kafka", 9092)
    assert (await names.lookup("kafka", 9092))[1] is True
    names.reconfigure(30)  # unchanged: kept
    assert len(names) == 1
    names.reconfigure(5)
    assert len(names) == 0 and names.ttl == 5


async def test_a_preferred_address_comes_first_and_only_for_a_kept_answer() -> None:
    both: list[Address] = ONE + TWO
    names = AddressCache(30, resolve=StandInDns(both))
    names.prefer("kafka", 9092, TWO[0])  # nothing kept yet: nothing to reorder
    assert await names.lookup("kafka", 9092) == (both, True)
    names.prefer("kafka", 9092, TWO[0])
    assert await names.lookup("kafka", 9092) == (TWO + ONE, False)
    names.prefer("kafka", 9092, (2, ("10.9.9.9", 9092)))  # not among them: ignored
    assert await names.lookup("kafka", 9092) == (TWO + ONE, False)
