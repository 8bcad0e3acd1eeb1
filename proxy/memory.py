"""One budget for the bytes the proxy holds on behalf of connections.

Every session reserves room before it receives, and gives it back once the bytes
have been written on (or dropped). When the budget is spent, reading stops —
backpressure on the peers, never an error and never a dropped frame — until
writes free room. Waiters are served in arrival order, so a large reservation is
not starved by small ones.

No deadlock: a session waits only while holding bytes it cannot yet write (a
partial frame). If everything held belongs to sessions that are waiting, nobody
would ever give room back, so the first waiter is then let through over the
budget: one connection can always make progress, and the excess is bounded by
what that one reservation asks for.
"""

from __future__ import annotations

from collections import deque

import trio


class MemoryBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.waits = 0  # reservations that had to wait
        self.overdrafts = 0  # reservations let through over the budget (see above)
        self._waiting: deque[_Waiter] = deque()
        self._waiting_held = 0  # bytes held by sessions that are waiting

    def take(self, n: int) -> None:
        """Count ``n`` bytes as held without waiting (already received)."""
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def give_back(self, n: int) -> None:
        self.used -= n
        self._grant()

    def fits(self, n: int) -> bool:
        return not self._waiting and self.used + n <= self.limit

    async def reserve(self, n: int, holding: int = 0) -> None:
        """Wait until ``n`` more bytes fit, then count them as held.

        ``holding``: what the caller already holds and cannot give back until this
        reservation is granted (it counts toward the no-deadlock rule).
        """
        if self.fits(n):
            self.take(n)
            return
        self.waits += 1
        waiter = _Waiter(n, holding)
        self._waiting.append(waiter)
        self._waiting_held += holding
        self._grant()
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted as we were cancelled: hand it back
                self.give_back(n)
            else:
                self._waiting.remove(waiter)
                self._waiting_held -= holding
                self._grant()
            raise

    def _grant(self) -> None:
        while self._waiting:
            head = self._waiting[0]
            stuck = self.used <= self._waiting_held  # only waiters hold anything
            if self.used + head.n > self.limit and not stuck:
                return
            if self.used + head.n > self.limit:
                self.overdrafts += 1
            self._waiting.popleft()
            self._waiting_held -= head.holding
            self.take(head.n)
            head.granted.set()


class _Waiter:
    __slots__ = ("granted", "holding", "n")

    def __init__(self, n: int, holding: int) -> None:
        self.n = n
        self.holding = holding
        self.granted = trio.Event()


class Charge:
    """What one direction of one session holds of the budget."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0

    async def reserve_to(self, total: int) -> None:
        """Hold at least ``total`` bytes, waiting for room when the budget is spent."""
        more = total - self.held
        if more > 0:
            await self.budget.reserve(more, holding=self.held)
            self.held = total

    async def wait_for_room(self) -> None:
        """Wait, holding nothing more, until the budget has room; in arrival order.

        Called before a receive that may block for a long time (an idle connection):
        a reservation held across that wait would let idle connections spend the budget.
        What the receive brings is counted after it (``settle``), so the budget is passed
        by at most one receive per connection receiving at that moment.
        """
        await self.budget.reserve(1, holding=self.held)
        self.budget.give_back(1)

    def room_now(self) -> bool:
        """Whether ``wait_for_room`` would not wait: checked first on the per-request
        path, where the budget nearly always has room, to spare the coroutine."""
        return self.budget.fits(1)

    def settle(self, total: int) -> None:
        """Hold exactly ``total`` bytes; what is no longer held goes back."""
        if total < self.held:
            self.budget.give_back(self.held - total)
        elif total > self.held:
            self.budget.take(total - self.held)
        self.held = total

    def release(self) -> None:
        self.settle(0)
